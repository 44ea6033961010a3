//! `anarchon hold JOB [--slot S] -- CMD…`: claim through a `Hold` stream; if
//! won, run CMD while the sidecar renews the lease; stop CMD (SIGTERM, then
//! SIGKILL after `--grace-ms`, to its whole process group) if the lease is
//! lost; SIGKILL the group at once if the hold stream ends for any other
//! reason (the sidecar has ended the lease then); release SUCCEEDED or
//! FAILED by CMD's exit status. CMD dies with `hold` (see [`super::group`]).
//!
//! CMD sees `ANARCHON_JOB`, `ANARCHON_SLOT_MS`, `ANARCHON_ATTEMPT`,
//! `ANARCHON_FENCING` and `ANARCHON_TOKEN`.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use super::client::{claim_json, claim_text, connect, ClaimOpts, ClaimsClient};
use super::group::{self, terminate};
use super::{print_status, ClientOpts, EXIT_LEASE_LOST, EXIT_NOT_WON};
use crate::proto as pb;
use clap::Args;
use serde_json::json;

#[derive(Debug, Args)]
pub struct HoldArgs {
    #[command(flatten)]
    pub claim: ClaimOpts,
    #[command(flatten)]
    pub client: ClientOpts,
    /// How long CMD gets between SIGTERM and SIGKILL when the lease is lost
    /// (`5s`, `1500ms`, … or bare milliseconds).
    #[arg(long, visible_alias = "grace", value_name = "DURATION", default_value = "5000", value_parser = crate::duration::parse_ms)]
    pub grace_ms: u64,
    /// The command to run while holding the run.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// How a held command ended.
pub enum Ended {
    /// It exited by itself with this status (128+signal if killed).
    Exited(i32),
    /// The lease was lost; it was stopped.
    LeaseLost,
    /// We were asked to stop; it was stopped.
    Stopped,
}

fn exit_code(status: std::process::ExitStatus) -> i32 {
    #[cfg(unix)]
    {
        use std::os::unix::process::ExitStatusExt;
        if let Some(sig) = status.signal() {
            return 128 + sig;
        }
    }
    status.code().unwrap_or(1)
}

/// How long a command told `LOST_LEASE` has between SIGTERM and SIGKILL
/// (at most `--grace-ms`): a leaving sidecar lets its peers take over
/// 100 ms after it told its holds, a cut-off one its margin later.
const LOST_GRACE: Duration = Duration::from_millis(100);

/// The local deadline of a hold event: `sent` (when the Hold request was
/// sent) plus `hold_valid_for_ms`, or `None` when the sidecar did not say.
fn hold_deadline(sent: Instant, hold_valid_for_ms: i64) -> Option<Instant> {
    (hold_valid_for_ms > 0).then(|| sent + Duration::from_millis(hold_valid_for_ms as u64))
}

/// Runs `cmd` for a won claim while watching the hold stream. The command
/// is stopped when the lease is lost, when the stream breaks, and when the
/// hold's deadline (counted from `sent`, when the Hold request went out)
/// comes without a renewal: the stop starts a quarter of the promised
/// window (at most `grace`) before the deadline and ends with SIGKILL at it,
/// so the command is gone by then even if the sidecar froze.
pub async fn run_held(
    cmd: &[String],
    job: &str,
    won: &pb::ClaimResponse,
    slot_ms: i64,
    stream: &mut tonic::Streaming<pb::HoldEvent>,
    grace: Duration,
    (sent, first_deadline): (Instant, Option<Instant>),
) -> std::io::Result<Ended> {
    // The signal handlers first, so that a SIGTERM or Ctrl-C that comes
    // while the command starts stops it as one that comes later would.
    let stop = super::serve::shutdown_signal();
    tokio::pin!(stop);
    // The command runs as its own process group under a supervisor that
    // dies with us and takes the group along (see `super::group`).
    let mut child = group::spawn(
        cmd,
        &[
            ("ANARCHON_JOB", job.to_owned()),
            ("ANARCHON_SLOT_MS", slot_ms.to_string()),
            ("ANARCHON_ATTEMPT", won.attempt.to_string()),
            ("ANARCHON_FENCING", won.fencing.to_string()),
            ("ANARCHON_TOKEN", won.token.clone()),
        ],
        grace,
    )?;
    let mut deadline = first_deadline;
    // The stop begins a quarter of the promised window before the deadline
    // (at most `grace` before), and ends with SIGKILL at the deadline.
    let lead = |d: Instant| grace.min(d.saturating_duration_since(Instant::now()) / 4);
    let mut stop_at = deadline.map(|d| d - lead(d));
    loop {
        tokio::select! {
            status = child.wait() => return Ok(Ended::Exited(exit_code(status?))),
            _ = async {
                match stop_at {
                    Some(t) => tokio::time::sleep_until(t.into()).await,
                    None => std::future::pending().await,
                }
            } => {
                tracing::warn!("no renewal before the hold's deadline; stopping the command");
                eprintln!("anarchon: the hold's deadline is near without a renewal; stopping the command");
                let left = deadline.map_or(grace, |d| d.saturating_duration_since(Instant::now()));
                terminate(&mut child, left).await;
                return Ok(Ended::LeaseLost);
            }
            _ = &mut stop => {
                terminate(&mut child, grace).await;
                return Ok(Ended::Stopped);
            }
            ev = stream.message() => {
                match ev {
                    Ok(Some(ev)) if ev.kind == pb::HoldEventKind::Renewed as i32 => {
                        if let Some(d) = hold_deadline(sent, ev.hold_valid_for_ms) {
                            deadline = Some(d);
                            stop_at = Some(d - lead(d));
                        }
                    }
                    Ok(Some(ev)) if ev.kind == pb::HoldEventKind::LostLease as i32 => {
                        tracing::warn!(reason = %ev.reason, "lease lost; stopping the command");
                        eprintln!("anarchon: lease lost ({}); stopping the command", ev.reason);
                        // The run may be someone else's within the sidecar's
                        // margin (100 ms on a leave): no long grace here.
                        terminate(&mut child, grace.min(LOST_GRACE)).await;
                        return Ok(Ended::LeaseLost);
                    }
                    Ok(Some(_)) => {}
                    Ok(None) | Err(_) => {
                        // The watchdog. A Hold stream that ends without a
                        // release ends the lease at once on the sidecar (so
                        // does a sidecar that leaves on SIGTERM), and the
                        // next claimer may win within milliseconds: no grace.
                        eprintln!("anarchon: the hold stream to the sidecar ended; killing the command");
                        group::kill_now(&mut child).await;
                        return Ok(Ended::LeaseLost);
                    }
                }
            }
        }
    }
}

/// Releases a held run with `succeeded`.
pub async fn release(
    c: &mut ClaimsClient,
    job: &str,
    slot_ms: i64,
    token: &str,
    succeeded: bool,
) -> Result<(), tonic::Status> {
    let result = if succeeded {
        pb::ReleaseResult::Succeeded
    } else {
        pb::ReleaseResult::Failed
    };
    c.release(pb::ReleaseRequest {
        job: job.to_owned(),
        slot_ms,
        token: token.to_owned(),
        result: result as i32,
    })
    .await
    .map(|_| ())
}

/// What one held run came to.
pub enum HeldRun {
    /// Not won: the answer says why.
    NotWon(pb::ClaimResponse),
    /// Won, ran, released (or tried to). `code` is the command's status.
    Ran {
        claim: pb::ClaimResponse,
        code: i32,
        succeeded: bool,
    },
    /// Won, but the lease was lost while the command ran; it was stopped.
    LeaseLost(pb::ClaimResponse),
    /// Won, and we were asked to stop; the command was stopped and the run
    /// released as FAILED.
    Stopped(pb::ClaimResponse),
    /// Won, but by this host's clock the slot was already older than the
    /// request's `max_late_ms` when the command was about to start (this
    /// process was paused, say): not run, released as FAILED. The age, ms.
    TooLate(pb::ClaimResponse, i64),
}

/// Claims through a `Hold` stream; if won, runs `cmd` while the sidecar
/// renews, then releases by exit status. Shared by `hold` and `cron`.
pub async fn hold_run(
    c: &mut ClaimsClient,
    req: pb::ClaimRequest,
    cmd: &[String],
    grace: Duration,
) -> Result<HeldRun, tonic::Status> {
    let job = req.job.clone();
    let slot = req.slot_ms;
    let max_late_ms = req.max_late_ms;
    let sent = Instant::now();
    let mut stream = c.hold(req).await?.into_inner();
    let (first, first_deadline) = match stream.message().await? {
        Some(ev) => {
            let deadline = hold_deadline(sent, ev.hold_valid_for_ms);
            (ev.claim.unwrap_or_default(), deadline)
        }
        None => {
            return Err(crate::Error::Unavailable(
                "the sidecar closed the hold stream without an answer".into(),
            )
            .into())
        }
    };
    if first.outcome != pb::Outcome::Won as i32 {
        return Ok(HeldRun::NotWon(first));
    }
    // The store judged lateness when it decided; a process paused after
    // that (SIGSTOP, a frozen VM) must not start a stale run on waking.
    let age = crate::claim::host_now_ms() - slot;
    if max_late_ms > 0 && age > max_late_ms {
        let _ = release(c, &job, slot, &first.token, false).await;
        return Ok(HeldRun::TooLate(first, age));
    }
    let ended = match run_held(
        cmd,
        &job,
        &first,
        slot,
        &mut stream,
        grace,
        (sent, first_deadline),
    )
    .await
    {
        Ok(e) => e,
        Err(e) => {
            eprintln!("anarchon: cannot run {cmd:?}: {e}");
            let _ = release(c, &job, slot, &first.token, false).await;
            return Ok(HeldRun::Ran {
                claim: first,
                code: 127,
                succeeded: false,
            });
        }
    };
    let out = match ended {
        Ended::LeaseLost => return Ok(HeldRun::LeaseLost(first)),
        Ended::Exited(code) => {
            let succeeded = code == 0;
            if let Err(st) = release(c, &job, slot, &first.token, succeeded).await {
                eprintln!(
                    "anarchon: release failed: {:?}: {}",
                    st.code(),
                    super::client::status_text(&st)
                );
            }
            HeldRun::Ran {
                claim: first,
                code,
                succeeded,
            }
        }
        Ended::Stopped => {
            let _ = release(c, &job, slot, &first.token, false).await;
            HeldRun::Stopped(first)
        }
    };
    drop(stream);
    Ok(out)
}

pub async fn hold(a: HoldArgs) -> ExitCode {
    let json = a.client.json;
    let req = match a.claim.request() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("anarchon: {e}");
            return ExitCode::from(2);
        }
    };
    let (mut c, _) = match connect(&a.client).await {
        Ok(c) => c,
        Err(e) => {
            eprintln!("anarchon: {}", super::anyhow_chain(&e));
            return ExitCode::FAILURE;
        }
    };
    let (job, slot) = (a.claim.job.as_str(), a.claim.slot);
    let show = |r: &pb::ClaimResponse| {
        if json {
            println!("{}", claim_json(r));
        } else {
            eprintln!("{}", claim_text(job, slot, r));
        }
    };
    let grace = Duration::from_millis(a.grace_ms);
    match hold_run(&mut c, req, &a.command, grace).await {
        Err(st) => print_status(json, &st),
        Ok(HeldRun::NotWon(r)) => {
            show(&r);
            ExitCode::from(EXIT_NOT_WON)
        }
        Ok(HeldRun::LeaseLost(r)) => {
            show(&r);
            ExitCode::from(EXIT_LEASE_LOST)
        }
        Ok(HeldRun::TooLate(r, age)) => {
            show(&r);
            eprintln!(
                "anarchon: won {age} ms after the slot, past max-late by this host's clock (was this process paused?); not run, released as FAILED"
            );
            ExitCode::from(EXIT_NOT_WON)
        }
        Ok(HeldRun::Stopped(r)) => {
            show(&r);
            // 130 after SIGINT (Ctrl-C), 143 after SIGTERM.
            ExitCode::from(super::serve::stopped_exit_status())
        }
        Ok(HeldRun::Ran {
            claim,
            code,
            succeeded,
        }) => {
            show(&claim);
            if json {
                println!(
                    "{}",
                    json!({"exit_code": code, "result": if succeeded {"SUCCEEDED"} else {"FAILED"}})
                );
            }
            ExitCode::from(code.clamp(0, 255) as u8)
        }
    }
}
