//! `anarchon hold JOB [--slot S] -- CMD…`: claim through a `Hold` stream; if
//! won, run CMD while the sidecar renews the lease; stop CMD (SIGTERM, then
//! SIGKILL after `--grace-ms`) if the lease is lost; release SUCCEEDED or
//! FAILED by CMD's exit status.
//!
//! CMD sees `ANARCHON_JOB`, `ANARCHON_SLOT_MS`, `ANARCHON_ATTEMPT`,
//! `ANARCHON_FENCING` and `ANARCHON_TOKEN`.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use serde_json::json;
use tokio::process::{Child, Command};

use super::client::{claim_json, claim_text, connect, ClaimOpts, ClaimsClient};
use super::{print_status, ClientOpts, EXIT_LEASE_LOST, EXIT_NOT_WON};
use crate::proto as pb;

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

/// SIGTERM, then SIGKILL after `grace`.
pub async fn terminate(child: &mut Child, grace: Duration) {
    #[cfg(unix)]
    if let Some(pid) = child.id() {
        use nix::sys::signal::{kill, Signal};
        use nix::unistd::Pid;
        let _ = kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
        if tokio::time::timeout(grace, child.wait()).await.is_ok() {
            return;
        }
    }
    let _ = child.start_kill();
    let _ = child.wait().await;
}

/// Runs `cmd` for a won claim while watching the hold stream.
pub async fn run_held(
    cmd: &[String],
    job: &str,
    won: &pb::ClaimResponse,
    slot_ms: i64,
    stream: &mut tonic::Streaming<pb::HoldEvent>,
    grace: Duration,
) -> std::io::Result<Ended> {
    let (prog, args) = cmd
        .split_first()
        .ok_or_else(|| std::io::Error::other("no command given"))?;
    let mut child = Command::new(prog)
        .args(args)
        .env("ANARCHON_JOB", job)
        .env("ANARCHON_SLOT_MS", slot_ms.to_string())
        .env("ANARCHON_ATTEMPT", won.attempt.to_string())
        .env("ANARCHON_FENCING", won.fencing.to_string())
        .env("ANARCHON_TOKEN", &won.token)
        .kill_on_drop(true)
        .spawn()?;
    let stop = super::serve::shutdown_signal();
    tokio::pin!(stop);
    loop {
        tokio::select! {
            status = child.wait() => return Ok(Ended::Exited(exit_code(status?))),
            _ = &mut stop => {
                terminate(&mut child, grace).await;
                return Ok(Ended::Stopped);
            }
            ev = stream.message() => {
                match ev {
                    Ok(Some(ev)) if ev.kind == pb::HoldEventKind::Renewed as i32 => {}
                    Ok(Some(ev)) if ev.kind == pb::HoldEventKind::LostLease as i32 => {
                        tracing::warn!(reason = %ev.reason, "lease lost; stopping the command");
                        eprintln!("anarchon: lease lost ({}); stopping the command", ev.reason);
                        terminate(&mut child, grace).await;
                        return Ok(Ended::LeaseLost);
                    }
                    Ok(Some(_)) => {}
                    Ok(None) | Err(_) => {
                        // The sidecar went away: we cannot know whether we
                        // still hold the run, so stop working.
                        eprintln!("anarchon: the hold stream to the sidecar broke; stopping the command");
                        terminate(&mut child, grace).await;
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
    let mut stream = c.hold(req).await?.into_inner();
    let first = match stream.message().await? {
        Some(ev) => ev.claim.unwrap_or_default(),
        None => {
            return Err(tonic::Status::unavailable(
                "the sidecar closed the hold stream without an answer",
            ))
        }
    };
    if first.outcome != pb::Outcome::Won as i32 {
        return Ok(HeldRun::NotWon(first));
    }
    let ended = match run_held(cmd, &job, &first, slot, &mut stream, grace).await {
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
