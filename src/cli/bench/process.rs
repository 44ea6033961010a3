//! Child processes of the bench (a real `anarchon serve`, the etcd server):
//! a kill-on-drop guard, free loopback ports, and memory read from
//! `/proc/<pid>/status`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// A child process that is killed and reaped when dropped, on every path out
/// of the bench (success, error, Ctrl-C).
pub struct Guarded {
    child: Child,
    name: &'static str,
    log: PathBuf,
}

impl Guarded {
    /// Starts `cmd` with stdout and stderr appended to `log`.
    pub fn spawn(name: &'static str, mut cmd: Command, log: &Path) -> anyhow::Result<Guarded> {
        let out = std::fs::File::create(log)
            .with_context(|| format!("cannot create {}", log.display()))?;
        let err = out.try_clone()?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            .spawn()
            .with_context(|| format!("cannot start {name} ({:?})", cmd.get_program()))?;
        Ok(Guarded {
            child,
            name,
            log: log.to_owned(),
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Fails, with the end of its log, if the process has exited.
    pub fn check_running(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!(
                "{} exited early ({status}); the end of its log {}:\n{}",
                self.name,
                self.log.display(),
                self.log_tail()
            );
        }
        Ok(())
    }

    /// The last lines of the child's log.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A loopback port that was free a moment ago.
// Only the etcd path (feature `etcd`) chooses its child's ports.
#[cfg_attr(not(feature = "etcd"), allow(dead_code))]
pub fn free_port() -> anyhow::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

/// Times [`retry_taken_ports`] starts a child at most.
// Only the etcd path (feature `etcd`) chooses its child's ports.
#[cfg_attr(not(feature = "etcd"), allow(dead_code))]
pub const PORT_TRIES: usize = 5;

/// Runs `start` (which starts a child on ports from [`free_port`]) again,
/// up to [`PORT_TRIES`] times in all, while it fails because a port was
/// taken: a port chosen here is bound by the child a moment later, and
/// another process (any outgoing connection's ephemeral port) can take it
/// in between. Any other error is returned at once.
// Only the etcd path (feature `etcd`) chooses its child's ports.
#[cfg_attr(not(feature = "etcd"), allow(dead_code))]
pub async fn retry_taken_ports<T, F, Fut>(name: &str, mut start: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<T>>,
{
    let mut tries = 1;
    loop {
        match start().await {
            Err(e) if tries < PORT_TRIES && format!("{e:#}").contains("address already in use") => {
                eprintln!(
                    "anarchon bench: {name} lost a port before binding it; starting it on others"
                );
                tries += 1;
            }
            done => return done,
        }
    }
}

/// A `kB` field (`VmRSS`, `VmHWM`) of `/proc/<pid>/status`, in KiB.
pub fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

/// The command name of a process and the fields of `/proc/<pid>/stat` after
/// it (the name is in parentheses and may hold spaces: field 3 of the whole
/// line, the state, is the first of them); `pid` may be `self`.
fn stat(pid: &str) -> Option<(String, Vec<String>)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (open, close) = (text.find('(')?, text.rfind(')')?);
    let name = text.get(open + 1..close)?.to_owned();
    let fields = text.get(close + 1..)?.split_whitespace().map(str::to_owned);
    Some((name, fields.collect()))
}

/// Clock ticks (USER_HZ = 100 a second) of `stat`'s fields `i` and `j`
/// (counted after the command name), in seconds.
fn seconds(f: &[String], i: usize, j: usize) -> Option<(f64, f64)> {
    let tick = |i: usize| f.get(i)?.parse::<u64>().ok().map(|t| t as f64 / 100.0);
    Some((tick(i)?, tick(j)?))
}

/// User and system CPU seconds a process has used (`/proc/<pid>/stat`,
/// `utime` and `stime`: fields 14 and 15 of the whole line); `pid` may be
/// `self`.
pub fn cpu_seconds(pid: &str) -> Option<(f64, f64)> {
    seconds(&stat(pid)?.1, 11, 12)
}

/// The CPU seconds (user, system) of every process named `comm` on this
/// machine (a local store's server: `postgres`, `redis-server`, …), with
/// what their children that already exited used (`cutime` and `cstime`,
/// fields 16 and 17: a PostgreSQL backend that ended is counted in the
/// postmaster's). `None` when there is none.
pub fn cpu_seconds_of(comm: &str) -> Option<(f64, f64)> {
    let mut total = None;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|p| p.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        let Some((_, f)) = stat(pid).filter(|(name, _)| name == comm) else {
            continue;
        };
        let (Some((u, s)), Some((cu, cs))) = (seconds(&f, 11, 12), seconds(&f, 13, 14)) else {
            continue;
        };
        let (tu, ts) = total.unwrap_or((0.0, 0.0));
        total = Some((tu + u + cu, ts + s + cs));
    }
    total
}

/// The server process of a local store, by the backend URL's scheme.
pub fn store_process(url: &str) -> Option<&'static str> {
    match url.split_once("://")?.0 {
        "postgres" | "postgresql" => Some("postgres"),
        "redis" | "redis+cluster" | "redis+sentinel" | "redis+unix" => Some("redis-server"),
        "nats" => Some("nats-server"),
        "amqp" | "amqps" => Some("beam.smp"),
        _ => None,
    }
}

/// CPU used between two [`cpu_seconds`] readings, in µs per claim.
pub fn cpu_us_per_claim(
    before: Option<(f64, f64)>,
    after: Option<(f64, f64)>,
    claims: u64,
) -> Option<(f64, f64)> {
    let ((u0, s0), (u1, s1)) = (before?, after?);
    let n = claims.max(1) as f64;
    Some(((u1 - u0) * 1e6 / n, (s1 - s0) * 1e6 / n))
}

pub fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// Samples a process's `VmRSS` every 100 ms until stopped; yields the peak.
pub struct RssSampler {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<u64>,
}

impl RssSampler {
    pub fn start(pid: u32) -> RssSampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let mut peak = 0;
            while !flag.load(Ordering::Relaxed) {
                peak = peak.max(status_kib(pid, "VmRSS").unwrap_or(0));
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            peak.max(status_kib(pid, "VmRSS").unwrap_or(0))
        });
        RssSampler { stop, task }
    }

    /// The peak `VmRSS` seen, in KiB.
    pub async fn finish(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap_or(0)
    }
}

/// Memory and start-up of one server process.
#[derive(Debug, Clone, Default)]
pub struct ProcFigures {
    /// From spawn to the first successful answer.
    pub ready: Duration,
    pub rss_idle_kib: Option<u64>,
    pub rss_load_kib: Option<u64>,
    /// `VmHWM`: the peak resident set over the process's life.
    pub hwm_kib: Option<u64>,
    /// CPU (user, system) µs per claim of the last measured load: the
    /// server process's, and the load clients' (the bench process's).
    pub server_cpu_us: Option<(f64, f64)>,
    pub clients_cpu_us: Option<(f64, f64)>,
    /// The local store's server processes' ([`store_process`]), over the
    /// same load: what the store itself spent per claim.
    pub store_cpu_us: Option<(f64, f64)>,
}

impl ProcFigures {
    pub fn ready_ms(&self) -> f64 {
        self.ready.as_secs_f64() * 1000.0
    }
}

/// Waits up to a minute for `probe` to succeed ([`wait_ready`]), lets the
/// first connection's buffers settle, and takes the idle figures: the time
/// from `started` to ready and the idle resident set.
pub async fn ready_figures<F, Fut>(
    child: &mut Guarded,
    started: Instant,
    probe: F,
) -> anyhow::Result<ProcFigures>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let ready = wait_ready(child, started, Duration::from_secs(60), probe).await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    Ok(ProcFigures {
        ready,
        rss_idle_kib: status_kib(child.pid(), "VmRSS"),
        ..ProcFigures::default()
    })
}

/// Calls `probe` every 5 ms until it succeeds, the child exits or `limit`
/// passes; returns the time since `started`.
pub async fn wait_ready<F, Fut>(
    child: &mut Guarded,
    started: Instant,
    limit: Duration,
    mut probe: F,
) -> anyhow::Result<Duration>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    loop {
        child.check_running()?;
        if probe().await {
            return Ok(started.elapsed());
        }
        if started.elapsed() > limit {
            bail!(
                "{} not ready after {limit:?}; the end of its log:\n{}",
                child.name,
                child.log_tail()
            );
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A start that fails `taken` times with etcd's own words for a port
    /// taken before it was bound, then succeeds; returns its result and how
    /// many times it was called.
    async fn start_after(taken: usize, other: bool) -> (anyhow::Result<u32>, usize) {
        let mut calls = 0;
        let got = retry_taken_ports("test", || {
            calls += 1;
            let n = calls;
            async move {
                if other {
                    bail!("etcd exited early: the data dir is not writable");
                }
                if n <= taken {
                    bail!("etcd exited early (exit status: 1); the end of its log:\nlisten tcp 127.0.0.1:41921: bind: address already in use");
                }
                Ok(7)
            }
        })
        .await;
        (got, calls)
    }

    #[tokio::test]
    async fn a_taken_port_starts_the_child_again_on_others() {
        let (got, calls) = start_after(2, false).await;
        assert_eq!(got.ok(), Some(7));
        assert_eq!(calls, 3);
    }

    #[tokio::test]
    async fn ports_taken_every_time_give_up_after_the_last_try() {
        let (got, calls) = start_after(usize::MAX, false).await;
        let e = got.err().map(|e| format!("{e:#}")).unwrap_or_default();
        assert!(e.contains("address already in use"), "{e}");
        assert_eq!(calls, PORT_TRIES);
    }

    #[tokio::test]
    async fn any_other_failure_is_not_tried_again() {
        let (got, calls) = start_after(0, true).await;
        assert!(got.is_err());
        assert_eq!(calls, 1);
    }
}
