//! `anarchon cron EXPR --job NAME -- CMD…`: every instance computes the same
//! slot for each tick of the schedule and claims it through its sidecar; the
//! winner runs CMD as `hold` does. Losers log one line. After a pause or a
//! slow start only ticks still within `max_late` are claimed; older ones are
//! reported once as missed and never run in a burst. While a tick's run is
//! held elsewhere, every instance retries every `--retry-ms` until the run is
//! DONE or the tick is past `max_late`, so a dead runner's tick is taken over.

use std::process::ExitCode;
use std::time::Duration;

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use clap::Args;
use croner::parser::{CronParser, Seconds};
use croner::Cron;

use super::client::{connect, outcome_name};
use super::hold::{hold_run, HeldRun};
use super::ClientOpts;
use crate::proto as pb;

#[derive(Debug, Args)]
#[command(
    after_help = "Example:\n  anarchon cron '*/5 * * * *' --job nightly-report --tz Europe/Prague --max-late 30s --lease 2m --overlap skip -- ./report.sh"
)]
pub struct CronArgs {
    /// The schedule: 5 fields (minute…weekday), 6 with seconds first, 7 with
    /// a year last, or an alias such as @hourly.
    pub schedule: String,
    /// The job name (every instance must use the same one).
    #[arg(long)]
    pub job: String,
    /// Time zone of the schedule (IANA name). DST gaps and repeats are handled.
    #[arg(long, default_value = "UTC")]
    pub tz: String,
    /// How late after its tick a run may still start; older ticks are
    /// reported as MISSED. At least 1s.
    #[arg(long, visible_alias = "max-late-ms", value_name = "DURATION", default_value = "30s", value_parser = crate::duration::parse)]
    pub max_late: Duration,
    /// Lease of a run, renewed while the command runs; at least 3 x the
    /// sidecar's heartbeat.
    #[arg(long, visible_aliases = ["lease-ms", "ttl"], value_name = "DURATION", default_value = "2m", value_parser = crate::duration::parse)]
    pub lease: Duration,
    /// allow or skip: whether a tick may start while the previous run still runs.
    #[arg(long, default_value = "allow", value_parser = crate::claim::Overlap::parse)]
    pub overlap: crate::claim::Overlap,
    /// Attempts (first run + takeovers) before a tick's run is INTERRUPTED
    /// [default: the sidecar's max_attempts, 3].
    #[arg(long)]
    pub max_attempts: Option<u32>,
    /// How often a tick held elsewhere is claimed again.
    #[arg(long, visible_alias = "retry", value_name = "DURATION", default_value = "1s", value_parser = crate::duration::parse_ms)]
    pub retry_ms: u64,
    /// How long the command gets between SIGTERM and SIGKILL.
    #[arg(long, visible_alias = "grace", value_name = "DURATION", default_value = "5s", value_parser = crate::duration::parse_ms)]
    pub grace_ms: u64,
    #[command(flatten)]
    pub client: ClientOpts,
    /// The command to run once per tick across the fleet.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// A parsed schedule in a time zone.
pub struct Schedule {
    cron: Cron,
    tz: Tz,
}

impl Schedule {
    pub fn parse(expr: &str, tz: &str) -> Result<Schedule, String> {
        let cron = CronParser::builder()
            .seconds(Seconds::Optional)
            .build()
            .parse(expr)
            .map_err(|e| format!("schedule {expr:?}: {e}"))?;
        let tz: Tz = tz
            .parse()
            .map_err(|_| format!("--tz {tz:?} is not an IANA time zone"))?;
        Ok(Schedule { cron, tz })
    }

    /// The first tick strictly after `t`. Ticks are whole seconds: the
    /// fraction of `t` is dropped first, or two instances asking at different
    /// milliseconds would compute different slots.
    pub fn next_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let local = whole_second(t).with_timezone(&self.tz);
        self.cron
            .find_next_occurrence(&local, false)
            .ok()
            .map(|d| d.with_timezone(&Utc))
    }

    /// The latest tick at or before `t`.
    pub fn latest_at_or_before(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let local = whole_second(t).with_timezone(&self.tz);
        self.cron
            .find_previous_occurrence(&local, true)
            .ok()
            .map(|d| d.with_timezone(&Utc))
    }
}

/// Which tick to claim at wall time `now`, given the next one we planned.
/// Returns `(tick, missed)`: the oldest due tick still within `max_late` (if
/// any) and how many ticks before it are older than `max_late` and skipped.
/// A tick within `max_late` is never skipped: after a short outage the ticks
/// it delayed still run, one after the other.
pub fn due(
    s: &Schedule,
    planned: DateTime<Utc>,
    now: DateTime<Utc>,
    max_late: Duration,
) -> (Option<DateTime<Utc>>, u64) {
    if planned > now {
        return (None, 0);
    }
    let late = chrono::Duration::from_std(max_late).unwrap_or(chrono::Duration::zero());
    let mut missed = 0u64;
    let mut t = planned;
    while t <= now {
        if now - t <= late {
            return (Some(t), missed);
        }
        missed += 1;
        match s.next_after(t) {
            Some(n) => t = n,
            None => break,
        }
    }
    (None, missed)
}

fn whole_second(t: DateTime<Utc>) -> DateTime<Utc> {
    use chrono::DurationRound;
    t.duration_trunc(chrono::Duration::seconds(1)).unwrap_or(t)
}

fn ms(t: DateTime<Utc>) -> i64 {
    t.timestamp_millis()
}

pub async fn cron(a: CronArgs) -> ExitCode {
    let sched = match Schedule::parse(&a.schedule, &a.tz) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("anarchon: {e}");
            return ExitCode::from(2);
        }
    };
    if crate::claim::Job::parse(&a.job).is_err() {
        eprintln!(
            "anarchon: --job {:?} is not a valid job name ([A-Za-z0-9._:/-], 1-200 bytes)",
            a.job
        );
        return ExitCode::from(2);
    }
    if a.max_late < Duration::from_secs(1) {
        eprintln!(
            "anarchon: --max-late {} is shorter than 1s: every tick would be late (a bare number is milliseconds; did you mean {}s?)",
            crate::duration::human(a.max_late),
            a.max_late.as_millis()
        );
        return ExitCode::from(2);
    }
    if a.lease.is_zero() {
        eprintln!("anarchon: --lease must be positive (e.g. 2m)");
        return ExitCode::from(2);
    }
    let overlap = crate::server::convert::overlap_pb(a.overlap);
    let stop = super::serve::shutdown_signal();
    tokio::pin!(stop);
    // In a pod the application and its sidecar start together: wait for the
    // sidecar (saying so) instead of exiting, as for a later outage.
    let mut waiting = false;
    let mut client = loop {
        match connect(&a.client).await {
            Ok((c, _)) => break c,
            Err(e) => {
                if !waiting {
                    eprintln!(
                        "anarchon cron: waiting for the sidecar at {}: {} (retrying every second)",
                        a.client.server,
                        super::anyhow_chain(&e)
                    );
                    waiting = true;
                }
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    _ = &mut stop => return ExitCode::SUCCESS,
                }
            }
        }
    };
    if waiting {
        eprintln!("anarchon cron: the sidecar at {} answers", a.client.server);
    }
    let grace = Duration::from_millis(a.grace_ms);
    let retry = Duration::from_millis(a.retry_ms.max(10));
    // Take part in the latest tick if it is still within max_late.
    let now = Utc::now();
    let mut planned = match sched.latest_at_or_before(now) {
        Some(t) if (now - t).to_std().unwrap_or_default() <= a.max_late => t,
        _ => match sched.next_after(now) {
            Some(t) => t,
            None => {
                eprintln!("anarchon: the schedule has no future ticks");
                return ExitCode::from(2);
            }
        },
    };
    eprintln!(
        "anarchon cron: job {} schedule {:?} ({}), next tick {}",
        a.job, a.schedule, a.tz, planned
    );
    loop {
        // Sleep towards the planned tick by the wall clock, in short naps so
        // a suspend or a clock step is noticed.
        let now = Utc::now();
        if planned > now {
            let wait = (planned - now)
                .to_std()
                .unwrap_or_default()
                .min(Duration::from_secs(1));
            tokio::select! {
                _ = tokio::time::sleep(wait) => continue,
                _ = &mut stop => return ExitCode::SUCCESS,
            }
        }
        let (tick, missed) = due(&sched, planned, now, a.max_late);
        if missed > 0 {
            eprintln!(
                "anarchon cron: MISSED {missed} tick(s) of {} from {} (older than max-late {}); not running them",
                a.job,
                planned,
                crate::duration::human(a.max_late)
            );
        }
        if let Some(tick) = tick {
            let slot = ms(tick);
            let deadline = tick + chrono::Duration::from_std(a.max_late).unwrap_or_default();
            loop {
                let req = pb::ClaimRequest {
                    job: a.job.clone(),
                    slot_ms: slot,
                    token: String::new(),
                    lease_ms: a.lease.as_millis() as i64,
                    max_late_ms: a.max_late.as_millis().max(1) as i64,
                    overlap: overlap as i32,
                    max_attempts: a.max_attempts.unwrap_or(0),
                    wait_ms: 0,
                };
                let run = tokio::select! {
                    r = hold_run(&mut client, req, &a.command, grace) => r,
                    _ = &mut stop => return ExitCode::SUCCESS,
                };
                match run {
                    Ok(HeldRun::Ran { claim, code, .. }) => {
                        eprintln!(
                            "anarchon cron: RAN {} slot={slot} attempt={} exit={code}",
                            a.job, claim.attempt
                        );
                        break;
                    }
                    Ok(HeldRun::Stopped(_)) => return ExitCode::SUCCESS,
                    Ok(HeldRun::TooLate(claim, age)) => {
                        eprintln!(
                            "anarchon cron: LATE {} slot={slot} attempt={}: won {age} ms after the tick, past max-late {}; not run",
                            a.job,
                            claim.attempt,
                            crate::duration::human(a.max_late)
                        );
                        break;
                    }
                    Ok(HeldRun::LeaseLost(claim)) => {
                        eprintln!(
                            "anarchon cron: LEASE LOST {} slot={slot} attempt={}",
                            a.job, claim.attempt
                        );
                        break;
                    }
                    Ok(HeldRun::NotWon(r)) => {
                        let outcome = outcome_name(r.outcome);
                        let retry_it =
                            r.outcome == pb::Outcome::Running as i32 && Utc::now() < deadline;
                        if !retry_it {
                            eprintln!(
                                "anarchon cron: {outcome} {} slot={slot}{}",
                                a.job,
                                if r.reason.is_empty() {
                                    String::new()
                                } else {
                                    format!(" reason={}", r.reason)
                                }
                            );
                            break;
                        }
                    }
                    Err(st) => {
                        eprintln!(
                            "anarchon cron: claim failed: {:?}: {}",
                            st.code(),
                            super::client::status_text(&st)
                        );
                        if Utc::now() >= deadline {
                            break;
                        }
                    }
                }
                tokio::select! {
                    _ = tokio::time::sleep(retry) => {}
                    _ = &mut stop => return ExitCode::SUCCESS,
                }
            }
        }
        // Plan the first tick after the one handled (or after now, if all
        // due ticks were missed) — never a burst of old ticks.
        let after = tick.unwrap_or(now).max(planned);
        planned = match sched.next_after(
            after.max(Utc::now() - chrono::Duration::from_std(a.max_late).unwrap_or_default()),
        ) {
            Some(t) => t,
            None => return ExitCode::SUCCESS,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn parses_five_six_fields_and_aliases() {
        assert!(Schedule::parse("*/5 * * * *", "UTC").is_ok());
        assert!(Schedule::parse("*/2 * * * * *", "UTC").is_ok());
        assert!(Schedule::parse("@hourly", "Europe/Prague").is_ok());
        assert!(Schedule::parse("not a schedule", "UTC").is_err());
        assert!(Schedule::parse("* * * * *", "Mars/Olympus").is_err());
    }

    #[test]
    fn every_instance_computes_the_same_slot() {
        let s = Schedule::parse("*/5 * * * *", "UTC").unwrap();
        let a = s.next_after(at("2026-03-01T10:02:13Z")).unwrap();
        let b = s.next_after(at("2026-03-01T10:04:59.999Z")).unwrap();
        assert_eq!(a, b);
        assert_eq!(a, at("2026-03-01T10:05:00Z"));
    }

    #[test]
    fn dst_gap_and_repeat_in_prague() {
        // 2026-03-29: 02:00 CET jumps to 03:00 CEST. A 02:30 daily job runs
        // once that day (croner moves it into the valid hour), never twice.
        let s = Schedule::parse("30 2 * * *", "Europe/Prague").unwrap();
        let t = s.next_after(at("2026-03-28T12:00:00Z")).unwrap();
        let u = s.next_after(t).unwrap();
        assert!(u - t >= chrono::Duration::hours(22), "{t} then {u}");
        // 2026-10-25: 03:00 CEST falls back to 02:00 CET; 02:30 happens twice
        // on the wall clock but the job runs once.
        let t = s.next_after(at("2026-10-24T12:00:00Z")).unwrap();
        let u = s.next_after(t).unwrap();
        assert!(u - t >= chrono::Duration::hours(23), "{t} then {u}");
        // Hourly in a zone: instants stay one hour apart across the change.
        let h = Schedule::parse("0 * * * *", "Europe/Prague").unwrap();
        let t = h.next_after(at("2026-10-25T00:30:00Z")).unwrap();
        let u = h.next_after(t).unwrap();
        assert_eq!(u - t, chrono::Duration::hours(1));
    }

    #[test]
    fn after_a_pause_only_ticks_within_max_late_run() {
        let s = Schedule::parse("* * * * * *", "UTC").unwrap();
        let planned = at("2026-03-01T10:00:00Z");
        // Woken 5.3 s late with max_late 2 s: ticks :00..:03 are older than
        // max_late and missed; :04 (1.3 s old) is the next to run.
        let (tick, missed) = due(
            &s,
            planned,
            at("2026-03-01T10:00:05.300Z"),
            Duration::from_secs(2),
        );
        assert_eq!(tick, Some(at("2026-03-01T10:00:04Z")));
        assert_eq!(missed, 4);
        // Issue 21: after a 3 s outage with max_late 30 s nothing is missed;
        // the delayed ticks run, oldest first.
        let (tick, missed) = due(
            &s,
            planned,
            at("2026-03-01T10:00:03.100Z"),
            Duration::from_secs(30),
        );
        assert_eq!((tick, missed), (Some(planned), 0));
        // On time: that tick, nothing missed.
        let (tick, missed) = due(
            &s,
            planned,
            at("2026-03-01T10:00:00.010Z"),
            Duration::from_secs(2),
        );
        assert_eq!((tick, missed), (Some(planned), 0));
        // Not due yet.
        assert_eq!(
            due(
                &s,
                planned,
                at("2026-03-01T09:59:59Z"),
                Duration::from_secs(2)
            ),
            (None, 0)
        );
        // A slow schedule woken past max_late: nothing runs, one missed.
        let m = Schedule::parse("0 * * * *", "UTC").unwrap();
        let (tick, missed) = due(
            &m,
            at("2026-03-01T10:00:00Z"),
            at("2026-03-01T10:10:00Z"),
            Duration::from_secs(30),
        );
        assert_eq!((tick, missed), (None, 1));
    }
}
