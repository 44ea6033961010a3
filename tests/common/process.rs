//! Real `anarchon serve` processes, killed when dropped.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_anarchon");

/// A free loopback port (bound then released).
pub fn free_addr() -> SocketAddr {
    free_addr_on(std::net::Ipv4Addr::LOCALHOST.into())
}

/// A free port on `ip` (bound then released), for a process started next.
///
/// Not the kernel's pick (`:0`): that comes from the ephemeral range, which
/// every outgoing connection on the machine also draws its source port
/// from, so a mesh dial could take the port before the sidecar binds it
/// ("Address already in use"). These ports are counted up, from a start
/// that differs per test process, through the 12,000 ports just below the
/// ephemeral range, and each is checked by binding it.
pub fn free_addr_on(ip: std::net::IpAddr) -> SocketAddr {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::OnceLock;
    const SPAN: u32 = 12_000;
    static NEXT: OnceLock<AtomicU32> = OnceLock::new();
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32_768);
    if low <= SPAN + 1024 {
        let l = TcpListener::bind((ip, 0)).unwrap();
        return l.local_addr().unwrap();
    }
    let next = NEXT.get_or_init(|| AtomicU32::new(std::process::id().wrapping_mul(7919)));
    for _ in 0..SPAN {
        let port = (low - SPAN + next.fetch_add(1, Ordering::Relaxed) % SPAN) as u16;
        if let Ok(l) = TcpListener::bind((ip, port)) {
            return l.local_addr().unwrap();
        }
    }
    panic!("no free port below the ephemeral range on {ip}");
}

/// `anarchon serve` on ports the kernel picks (`--listen 127.0.0.1:0
/// --admin-listen 127.0.0.1:0`), for a process nobody dials by a known
/// address; add `--ready-file` to learn them.
pub fn serve_on_any_port() -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
    ]);
    cmd
}

/// A plain blocking HTTP/1.1 GET; returns the body.
pub fn http_get_blocking(addr: SocketAddr, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out.split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default()
}

pub struct Sidecar {
    pub child: Option<Child>,
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    pub data_dir: PathBuf,
    pub args: Vec<String>,
    pub log: PathBuf,
    /// Where `serve --ready-file` reports the bound addresses.
    pub ready_file: PathBuf,
    /// Run under this group id (the fault lab tells processes apart by it).
    pub gid: Option<u32>,
    /// Started with `start` (ports from the kernel's ephemeral range): not
    /// to be restarted, see [`Sidecar::restart`].
    kernel_picked: bool,
}

/// Port 0 on `ip`: the sidecar binds a port the kernel picks and reports it
/// in its ready file, so no other process can take it first.
fn any_port(ip: std::net::IpAddr) -> SocketAddr {
    SocketAddr::new(ip, 0)
}

/// The addresses a ready file (`serve --ready-file`) reports: one
/// `name=ADDR` line each; `None` until the file is there.
pub fn read_ready_file(path: &Path) -> Option<HashMap<String, SocketAddr>> {
    let text = std::fs::read_to_string(path).ok()?;
    Some(
        text.lines()
            .filter_map(|l| l.split_once('='))
            // `unix=PATH` (listen_unix) is a path, not an address.
            .filter(|(k, _)| *k != "unix")
            .map(|(k, v)| (k.to_owned(), v.parse().unwrap()))
            .collect(),
    )
}

impl Sidecar {
    /// Starts `anarchon serve` with `extra` flags and waits until it answers.
    /// Both ports are the kernel's pick (`--listen 127.0.0.1:0`), read back
    /// from the ready file: for a sidecar nobody needs to know in advance.
    pub fn start(data_dir: &Path, extra: &[&str]) -> Sidecar {
        Sidecar::start_at(data_dir, any_port(Ipv4Addr::LOCALHOST.into()), extra)
    }

    /// Like `start`, on a chosen gRPC address: for a peer others must know
    /// before it starts (mesh seeds, `--peer` lists), from [`free_addr`].
    pub fn start_at(data_dir: &Path, addr: SocketAddr, extra: &[&str]) -> Sidecar {
        Sidecar::start_as(data_dir, addr, extra, None)
    }

    /// Like `start_at`, under its own group id. The admin port is always
    /// the kernel's pick, on the gRPC address's IP.
    pub fn start_as(
        data_dir: &Path,
        addr: SocketAddr,
        extra: &[&str],
        gid: Option<u32>,
    ) -> Sidecar {
        use std::sync::atomic::{AtomicU32, Ordering};
        static STARTED: AtomicU32 = AtomicU32::new(0);
        let n = STARTED.fetch_add(1, Ordering::Relaxed);
        // A sidecar on a chosen address may be restarted, and comes back on
        // the same ports: those must lie outside the ephemeral range, or a
        // dial (a peer redialing it binds port 0 on its IP) can take one
        // while it is down. A kernel-picked address has its admin picked too.
        let kernel_picked = addr.port() == 0;
        let admin = if kernel_picked {
            any_port(addr.ip())
        } else {
            free_addr_on(addr.ip())
        };
        let ready_file = data_dir.join(format!("ready-{n}"));
        let mut args: Vec<String> = vec![
            "serve".into(),
            "--listen".into(),
            addr.to_string(),
            "--admin-listen".into(),
            admin.to_string(),
            "--data-dir".into(),
            data_dir.display().to_string(),
            "--ready-file".into(),
            ready_file.display().to_string(),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut s = Sidecar {
            child: None,
            addr,
            admin,
            data_dir: data_dir.to_owned(),
            args,
            log: data_dir.join(format!("serve-{n}.log")),
            ready_file,
            gid,
            kernel_picked,
        };
        s.spawn();
        s
    }

    fn spawn(&mut self) {
        std::fs::create_dir_all(&self.data_dir).unwrap();
        let _ = std::fs::remove_file(&self.ready_file);
        let log = std::fs::File::create(&self.log).unwrap();
        let mut cmd = Command::new(BIN);
        if let Some(g) = self.gid {
            use std::os::unix::process::CommandExt;
            cmd.gid(g);
        }
        let child = cmd
            .args(&self.args)
            .env(
                "RUST_LOG",
                std::env::var("ANARCHON_TEST_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn anarchon serve");
        self.child = Some(child);
        self.wait_ready();
    }

    /// Waits for the ready file, takes the bound addresses from it, and
    /// pins them in the flags, so a restart comes back on the same ports.
    pub fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Some(bound) = read_ready_file(&self.ready_file) {
                self.addr = bound["grpc"];
                self.admin = bound["admin"];
                self.pin("--listen", self.addr);
                self.pin("--admin-listen", self.admin);
                return;
            }
            if let Some(c) = self.child.as_mut() {
                if let Ok(Some(st)) = c.try_wait() {
                    panic!(
                        "anarchon serve exited early ({st}):\n{}",
                        std::fs::read_to_string(&self.log).unwrap_or_default()
                    );
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!(
            "anarchon serve did not report its addresses in {}",
            self.ready_file.display()
        );
    }

    /// Sets the value of `flag` in the flags to `addr`.
    fn pin(&mut self, flag: &str, addr: SocketAddr) {
        if let Some(i) = self.args.iter().position(|a| a == flag) {
            self.args[i + 1] = addr.to_string();
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn signal(&self, sig: nix::sys::signal::Signal) {
        if let Some(c) = self.child.as_ref() {
            nix::sys::signal::kill(nix::unistd::Pid::from_raw(c.id() as i32), sig).unwrap();
        }
    }

    /// SIGSTOP: the process freezes (a GC pause, a throttled container).
    pub fn pause(&self) {
        self.signal(nix::sys::signal::Signal::SIGSTOP);
    }

    /// SIGCONT after [`Sidecar::pause`].
    pub fn resume(&self) {
        self.signal(nix::sys::signal::Signal::SIGCONT);
    }

    /// SIGTERM and wait for the exit.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let mut c = self.child.take().expect("running");
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(c.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        c.wait().unwrap()
    }

    /// Starts again with the same flags (same data dir and ports). Only for
    /// a sidecar started on a chosen address (`start_at`, from
    /// [`free_addr`]): a kernel-picked port is in the ephemeral range, where
    /// any dial may take it while the sidecar is down.
    pub fn restart(&mut self) {
        assert!(
            !self.kernel_picked,
            "restart() needs ports outside the ephemeral range: start this sidecar with start_at(free_addr())"
        );
        self.kill();
        self.spawn();
    }
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        self.kill();
    }
}
