//! The command of `hold` and `cron` as a whole process tree.
//!
//! Signalling only the direct child leaves its children behind: `sh -c
//! 'sleep 60 & wait'` loses `sleep` to PID 1 and it keeps working while the
//! next holder runs. So the command runs under a small supervisor, the
//! `anarchon __supervise` process, which
//!
//! * leads a new process group (`hold` spawns it with `process_group(0)`)
//!   that the command and everything it starts belong to, so `hold` stops
//!   the whole tree with one signal to the group: SIGTERM, then SIGKILL
//!   after `--grace-ms`;
//! * asks the kernel for a signal when `hold` dies (`PR_SET_PDEATHSIG`), so
//!   a SIGKILL of `hold` — which ends the run's lease at once, and lets the
//!   next claimer win within milliseconds — SIGKILLs the whole group at
//!   once;
//! * is a child subreaper, so orphaned descendants are reparented to it and
//!   reaped, and when the command itself exits it stops what the command
//!   left running (SIGTERM, SIGKILL after the grace) before it reports the
//!   command's exit status, so a run is never released while part of it
//!   still works.
//!
//! The supervisor is plain blocking code (`sigwait`), no runtime and no
//! `unsafe`: `std` spawns the command with an empty signal mask.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, SigSet, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

/// The hidden subcommand that runs the supervisor.
pub const SUPERVISE: &str = "__supervise";

/// The signal the kernel sends the supervisor when `hold` dies.
const PARENT_DIED: Signal = Signal::SIGUSR1;

/// A command running under its supervisor, in the process group the
/// supervisor leads. Dropped while it runs, it SIGKILLs the whole group (a
/// plain `kill_on_drop` would kill the supervisor alone and orphan the rest).
pub struct Group {
    child: tokio::process::Child,
}

impl Group {
    /// Waits for the supervisor, which exits with the command's status once
    /// nothing of the command is left.
    pub async fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        self.child.wait().await
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        // `id()` is None once the supervisor has been reaped.
        if let Some(pid) = self.child.id() {
            let _ = kill(Pid::from_raw(-(pid as i32)), Signal::SIGKILL);
        }
    }
}

/// Starts `cmd` (with `envs`) under a supervisor in a new process group
/// whose id is the supervisor's pid.
pub fn spawn(cmd: &[String], envs: &[(&str, String)], grace: Duration) -> std::io::Result<Group> {
    if cmd.is_empty() {
        return Err(std::io::Error::other("no command given"));
    }
    let exe = std::env::current_exe()?;
    let mut c = tokio::process::Command::new(exe);
    c.arg(SUPERVISE)
        .arg(std::process::id().to_string())
        .arg(grace.as_millis().to_string())
        .arg("--")
        .args(cmd)
        .process_group(0)
        .kill_on_drop(true);
    for (k, v) in envs {
        c.env(k, v);
    }
    Ok(Group { child: c.spawn()? })
}

/// Stops the whole group: SIGTERM to the group, then SIGKILL to the group
/// after `grace`.
pub async fn terminate(group: &mut Group, grace: Duration) {
    let child = &mut group.child;
    if let Some(pid) = child.id() {
        let group = Pid::from_raw(-(pid as i32));
        let _ = kill(group, Signal::SIGTERM);
        if tokio::time::timeout(grace, child.wait()).await.is_ok() {
            return;
        }
        let _ = kill(group, Signal::SIGKILL);
    }
    let _ = child.start_kill();
    let _ = child.wait().await;
}

/// SIGKILLs the whole group at once and reaps the supervisor.
pub async fn kill_now(group: &mut Group) {
    if let Some(pid) = group.child.id() {
        let _ = kill(Pid::from_raw(-(pid as i32)), Signal::SIGKILL);
    }
    let _ = group.child.start_kill();
    let _ = group.child.wait().await;
}

/// `anarchon __supervise PARENT_PID GRACE_MS -- CMD…`: see the module docs.
/// Exits with the command's status (128 + signal when it was killed).
pub fn supervise(args: &[String]) -> ExitCode {
    match supervise_inner(args) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("anarchon: {e}");
            ExitCode::from(127)
        }
    }
}

fn supervise_inner(args: &[String]) -> Result<u8, String> {
    let (parent, grace, cmd) = match args {
        [parent, grace, dashdash, cmd @ ..] if dashdash == "--" && !cmd.is_empty() => (
            parent
                .parse::<i32>()
                .map_err(|_| format!("{SUPERVISE}: bad parent pid {parent:?}"))?,
            Duration::from_millis(
                grace
                    .parse::<u64>()
                    .map_err(|_| format!("{SUPERVISE}: bad grace {grace:?}"))?,
            ),
            cmd,
        ),
        _ => return Err(format!("usage: {SUPERVISE} PARENT_PID GRACE_MS -- CMD…")),
    };
    // Every signal we act on is taken with `sigwait`, before any thread
    // exists (the timer thread below inherits the mask).
    let signals = SigSet::from_iter([
        Signal::SIGCHLD,
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGHUP,
        Signal::SIGALRM,
        PARENT_DIED,
    ]);
    signals.thread_block().map_err(|e| e.to_string())?;
    // Linux only; elsewhere the watchdog in `hold` is all there is.
    #[cfg(target_os = "linux")]
    {
        nix::sys::prctl::set_pdeathsig(PARENT_DIED).map_err(|e| e.to_string())?;
        nix::sys::prctl::set_child_subreaper(true).map_err(|e| e.to_string())?;
    }
    if nix::unistd::getppid().as_raw() != parent {
        // `hold` died before we could watch it: start nothing.
        return Err("the hold process is gone; not starting the command".into());
    }
    let me = nix::unistd::getpid();
    let leader = std::process::Command::new(&cmd[0])
        .args(&cmd[1..])
        .spawn()
        .map_err(|e| format!("cannot run {:?}: {e}", cmd[0]))?;
    let leader = Pid::from_raw(leader.id() as i32);

    let mut code: Option<u8> = None;
    let mut deadline: Option<Instant> = None;
    loop {
        let sig = signals.wait().map_err(|e| e.to_string())?;
        if sig == PARENT_DIED || nix::unistd::getppid().as_raw() != parent {
            // `hold` is gone and its run may already be someone else's:
            // no grace. This kills us too, which is all there is left to do.
            let _ = kill(Pid::from_raw(-me.as_raw()), Signal::SIGKILL);
            return Ok(137);
        }
        if sig == Signal::SIGCHLD {
            for (pid, status) in reap() {
                if pid == leader {
                    code = Some(status);
                }
            }
        }
        // SIGTERM/SIGINT/SIGHUP reach the whole group (`hold` signals the
        // group): the command handles them; we wait for it.
        if code.is_none() {
            continue;
        }
        let rest = group_members(me);
        if rest.is_empty() {
            return Ok(code.unwrap_or(0));
        }
        match deadline {
            None => {
                // The command exited but left processes in its group.
                for pid in &rest {
                    let _ = kill(*pid, Signal::SIGTERM);
                }
                deadline = Some(Instant::now() + grace);
                alarm_in(grace.min(Duration::from_millis(50)));
            }
            Some(d) if Instant::now() >= d => {
                for pid in &rest {
                    let _ = kill(*pid, Signal::SIGKILL);
                }
                alarm_in(Duration::from_millis(20));
            }
            Some(d) => alarm_in((d - Instant::now()).min(Duration::from_millis(50))),
        }
    }
}

/// Reaps every exited child (ours, and orphans reparented to us).
fn reap() -> Vec<(Pid, u8)> {
    let mut out = Vec::new();
    loop {
        match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(pid, c)) => out.push((pid, c.clamp(0, 255) as u8)),
            Ok(WaitStatus::Signaled(pid, s, _)) => out.push((pid, 128 + s as u8)),
            Ok(WaitStatus::StillAlive) | Err(_) => return out,
            Ok(_) => {}
        }
    }
}

/// Sends us SIGALRM after `d` (a thread: it inherits the blocked mask, so
/// the signal is taken by `sigwait`).
fn alarm_in(d: Duration) {
    std::thread::spawn(move || {
        std::thread::sleep(d);
        let _ = kill(nix::unistd::getpid(), Signal::SIGALRM);
    });
}

/// The live processes of process group `pgid`, other than us (from /proc).
pub fn group_members(pgid: Pid) -> Vec<Pid> {
    let me = nix::unistd::getpid();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| pid != me.as_raw())
        .filter(|&pid| {
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                return false;
            };
            // `pid (comm) state ppid pgrp …`; comm may hold anything.
            let Some((_, rest)) = stat.rsplit_once(')') else {
                return false;
            };
            let f: Vec<&str> = rest.split_whitespace().collect();
            f.len() > 2 && f[0] != "Z" && f[2].parse::<i32>().ok() == Some(pgid.as_raw())
        })
        .map(Pid::from_raw)
        .collect()
}
