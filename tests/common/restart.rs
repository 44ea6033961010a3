//! Stopping and starting the machine's own store servers, with the exact
//! start commands of this machine's setup (the same ones
//! `scripts/services/common.sh` uses).
//!
//! Tests that restart a shared server hold [`lock`] for the whole outage, so
//! two of them never overlap in one test binary (cargo runs test binaries one
//! after the other), and keep a [`Guard`] that starts the server again when it
//! is dropped, even on panic.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// One restart of a shared server at a time within a test binary.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

pub async fn lock() -> tokio::sync::MutexGuard<'static, ()> {
    SERIAL.lock().await
}

/// A store server of this machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Server {
    Postgres,
    Redis,
    RabbitMq,
    Nats,
}

impl Server {
    pub fn addr(self) -> &'static str {
        match self {
            Server::Postgres => "127.0.0.1:5432",
            Server::Redis => "127.0.0.1:6379",
            Server::RabbitMq => "127.0.0.1:5672",
            Server::Nats => "127.0.0.1:4222",
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Server::Postgres => "PostgreSQL",
            Server::Redis => "Redis",
            Server::RabbitMq => "RabbitMQ",
            Server::Nats => "NATS",
        }
    }

    pub fn is_up(self) -> bool {
        super::services::reachable(self.addr())
    }

    /// Stops the server and waits until its port is closed.
    pub fn stop(self) {
        match self {
            Server::Postgres => {
                let v = pg_version();
                assert!(
                    run(
                        "pg_ctlcluster",
                        &[
                            "--skip-systemctl-redirect",
                            &v,
                            "main",
                            "stop",
                            "-m",
                            "fast"
                        ],
                        Duration::from_secs(60),
                    ),
                    "pg_ctlcluster stop"
                );
            }
            Server::Redis => {
                let pid =
                    pid_of("redis-server", "6379").expect("no redis-server on port 6379 to stop");
                terminate(pid);
            }
            Server::RabbitMq => {
                assert!(
                    run("rabbitmqctl", &["stop_app"], Duration::from_secs(60)),
                    "rabbitmqctl stop_app"
                );
            }
            Server::Nats => {
                let pid =
                    pid_of("nats-server", "4222").expect("no nats-server on port 4222 to stop");
                terminate(pid);
            }
        }
        assert!(
            wait_port(self.addr(), false, Duration::from_secs(30)),
            "{} still listens after it was stopped",
            self.name()
        );
    }

    /// Starts the server with this machine's command (if it is down) and
    /// waits until it listens.
    pub fn start(self) {
        if self.is_up() {
            return;
        }
        let within = Duration::from_secs(60);
        match self {
            Server::Postgres => {
                let v = pg_version();
                run(
                    "pg_ctlcluster",
                    &["--skip-systemctl-redirect", &v, "main", "start"],
                    within,
                );
            }
            Server::Redis => {
                run(
                    "redis-server",
                    &[
                        "--daemonize",
                        "yes",
                        "--bind",
                        "127.0.0.1",
                        "-::1",
                        "--port",
                        "6379",
                        "--save",
                        "",
                        "--appendonly",
                        "no",
                        "--dir",
                        "/var/lib/redis",
                        "--logfile",
                        "/var/log/redis/ci.log",
                    ],
                    within,
                );
            }
            Server::RabbitMq => {
                // The node is still running after `stop_app`; start the app,
                // or the whole node when it is gone.
                run("rabbitmqctl", &["start_app"], Duration::from_secs(90));
                if !wait_port(self.addr(), true, within) {
                    run("rabbitmq-server", &["-detached"], Duration::from_secs(30));
                }
            }
            Server::Nats => {
                run(
                    "start-stop-daemon",
                    &[
                        "--start",
                        "--oknodo",
                        "--background",
                        "--exec",
                        "/usr/sbin/nats-server",
                        "--",
                        "-a",
                        "127.0.0.1",
                        "-p",
                        "4222",
                        "-js",
                        "-sd",
                        "/var/lib/nats-server",
                        "-l",
                        "/var/log/nats-server.log",
                    ],
                    Duration::from_secs(30),
                );
            }
        }
        assert!(
            wait_port(self.addr(), true, Duration::from_secs(120)),
            "{} did not come back",
            self.name()
        );
    }
}

/// Starts the server again when dropped, whatever happened.
pub struct Guard(pub Server);

impl Drop for Guard {
    fn drop(&mut self) {
        if !self.0.is_up() {
            self.0.start();
        }
    }
}

pub fn wait_port(addr: &str, up: bool, within: Duration) -> bool {
    let end = Instant::now() + within;
    while Instant::now() < end {
        if super::services::reachable(addr) == up {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

/// The PostgreSQL version directory under /etc/postgresql (`15`, …).
fn pg_version() -> String {
    std::fs::read_dir("/etc/postgresql")
        .expect("/etc/postgresql")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .next()
        .expect("a PostgreSQL cluster under /etc/postgresql")
}

/// Runs a command, killing it if it takes longer than `within`.
pub fn run(cmd: &str, args: &[&str], within: Duration) -> bool {
    let mut child = match Command::new(cmd)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{cmd} {args:?}: {e}");
            return false;
        }
    };
    let end = Instant::now() + within;
    loop {
        match child.try_wait() {
            Ok(Some(st)) => {
                if !st.success() {
                    eprintln!("{cmd} {args:?}: {st}");
                }
                return st.success();
            }
            Ok(None) if Instant::now() < end => std::thread::sleep(Duration::from_millis(100)),
            _ => {
                eprintln!("{cmd} {args:?}: no answer within {within:?}; killed");
                let _ = child.kill();
                let _ = child.wait();
                return false;
            }
        }
    }
}

/// The pid of the process whose first word of its command line ends with
/// `name` (`redis-server` rewrites its title to `redis-server 127.0.0.1:6379`)
/// and whose command line names `port`.
fn pid_of(name: &str, port: &str) -> Option<i32> {
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        let mut words = text.split_whitespace();
        if !words.next().is_some_and(|w| w.ends_with(name)) {
            continue;
        }
        if text.split([' ', ':']).any(|w| w == port) {
            return Some(pid);
        }
    }
    None
}

/// SIGTERM, then wait until the process is gone.
fn terminate(pid: i32) {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    kill(Pid::from_raw(pid), Signal::SIGTERM).expect("signal the server");
    let end = Instant::now() + Duration::from_secs(30);
    while std::path::Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(50));
    }
}
