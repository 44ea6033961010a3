//! The fault lab: three real `anarchon serve` processes, each on its own
//! loopback address (127.0.0.2, .3, .4) and under its own group id, so that
//! nftables can cut any link — between two sidecars (by address, in either
//! direction) or between one sidecar and its store (by group id and port).
//! Faults also come from SIGSTOP/SIGCONT, SIGKILL and store restarts.
//!
//! Clients contend for one lock (slot 0) through `Hold` streams, one per
//! sidecar, and a [`Checker`] records what each client was told, on the
//! client's clock: when it was told `WON`, and when it had to stop — told
//! `LOST_LEASE`, the stream broke, or its deadline passed (the Hold
//! request's send time plus `hold_valid_for_ms` of the newest event). It
//! asserts that no two clients' holding intervals overlap.
//!
//! Timings: heartbeat 200 ms, expiry 1,500 ms, lease 3,000 ms.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anarchon::proto as pb;
use anarchon::proto::claims_client::ClaimsClient;
use tokio::sync::watch;
use tonic::transport::Channel;

use super::process::{free_addr_on, Sidecar};

pub const LEASE: i64 = 3000;

/// Group ids of the lab's sidecars (one each).
const GID_BASE: u32 = 61_000;

// ---- nftables ---------------------------------------------------------------

/// Whether the lab can run here: `nft` and root. Outside CI a missing tool
/// skips with a line on stderr; under `CI=true` it is a failure.
pub fn available() -> bool {
    let nft = Command::new("nft")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    // The effective uid, from /proc (nix's `user` feature is off).
    let root = std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find(|l| l.starts_with("Uid:"))
            .and_then(|l| l.split_whitespace().nth(2))
            == Some("0")
    });
    if nft && root {
        return true;
    }
    let why = if nft {
        "not root"
    } else {
        "nft (Debian package nftables) is missing"
    };
    if super::services::in_ci() {
        panic!("fault lab: {why}, and CI=true forbids skipping it");
    }
    eprintln!("SKIPPED fault lab: {why} (scripts/test.sh installs nftables)");
    false
}

/// One nftables table of this test: rules in an output chain, removed
/// when dropped (even on panic).
pub struct Nft {
    table: String,
}

fn nft(args: &[&str]) {
    let out = Command::new("nft").args(args).output().expect("run nft");
    assert!(
        out.status.success(),
        "nft {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Nft {
    pub fn new() -> Nft {
        let table = format!(
            "anarchon_lab_{}_{:08x}",
            std::process::id(),
            rand::random::<u32>()
        );
        nft(&["add", "table", "inet", &table]);
        nft(&[
            "add",
            "chain",
            "inet",
            &table,
            "out",
            "{ type filter hook output priority 0; policy accept; }",
        ]);
        Nft { table }
    }

    fn rule(&self, rule: &str) {
        let mut args = vec!["add", "rule", "inet", &self.table, "out"];
        args.extend(rule.split(' '));
        nft(&args);
    }

    /// Drops every packet from `from` to `to` (one direction).
    pub fn cut(&self, from: Ipv4Addr, to: Ipv4Addr) {
        self.rule(&format!("ip saddr {from} ip daddr {to} drop"));
    }

    /// Drops every packet a process of group `gid` sends to the store port.
    pub fn cut_store(&self, gid: u32, port: u16) {
        self.rule(&format!(
            "meta skgid {gid} ip daddr 127.0.0.1 tcp dport {port} drop"
        ));
    }

    /// Removes every rule.
    pub fn heal(&self) {
        nft(&["flush", "chain", "inet", &self.table, "out"]);
    }
}

impl Drop for Nft {
    fn drop(&mut self) {
        let _ = Command::new("nft")
            .args(["delete", "table", "inet", &self.table])
            .output();
    }
}

// ---- the lab ----------------------------------------------------------------

pub struct Node {
    pub sidecar: Sidecar,
    pub ip: Ipv4Addr,
    pub gid: u32,
}

pub struct Lab {
    pub root: tempfile::TempDir,
    pub nodes: Vec<Node>,
    pub backend: String,
}

impl Lab {
    /// `n` sidecars on `backend`, each linked to every other; waits until
    /// all see each other alive.
    pub async fn start(backend: &str, n: usize) -> Lab {
        let root = tempfile::tempdir().unwrap();
        let ips: Vec<Ipv4Addr> = (0..n)
            .map(|i| Ipv4Addr::new(127, 0, 0, 2 + i as u8))
            .collect();
        let addrs: Vec<SocketAddr> = ips.iter().map(|ip| free_addr_on(IpAddr::V4(*ip))).collect();
        let nodes = (0..n)
            .map(|i| {
                let flags = super::liveness::mesh_flags(backend, &addrs, i);
                let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
                let gid = GID_BASE + i as u32;
                Node {
                    sidecar: Sidecar::start_as(
                        &root.path().join(format!("n{i}")),
                        addrs[i],
                        &flags,
                        Some(gid),
                    ),
                    ip: ips[i],
                    gid,
                }
            })
            .collect();
        let lab = Lab {
            root,
            nodes,
            backend: backend.to_owned(),
        };
        lab.linked().await;
        lab
    }

    /// Waits until every sidecar sees every other one ALIVE.
    pub async fn linked(&self) {
        let addrs: Vec<SocketAddr> = self.nodes.iter().map(|n| n.sidecar.addr).collect();
        super::mesh::linked(&addrs).await;
    }

    /// Cuts node `a` from node `b` in both directions.
    pub fn cut_pair(&self, nft: &Nft, a: usize, b: usize) {
        nft.cut(self.nodes[a].ip, self.nodes[b].ip);
        nft.cut(self.nodes[b].ip, self.nodes[a].ip);
    }

    /// Cuts node `a` from every other sidecar, both directions.
    pub fn cut_from_mesh(&self, nft: &Nft, a: usize) {
        for b in 0..self.nodes.len() {
            if b != a {
                self.cut_pair(nft, a, b);
            }
        }
    }

    /// The store's TCP port, for a networked store.
    pub fn store_port(&self) -> Option<u16> {
        if self.backend.starts_with("postgres") {
            Some(5432)
        } else if self.backend.starts_with("redis") {
            Some(6379)
        } else {
            None
        }
    }

    /// Cuts node `a` from the store (networked stores only).
    pub fn cut_from_store(&self, nft: &Nft, a: usize) {
        let port = self.store_port().expect("a networked store");
        nft.cut_store(self.nodes[a].gid, port);
    }
}

// ---- the checker ------------------------------------------------------------

/// How a client's hold ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    /// Told `LOST_LEASE` with this reason.
    Lost(String),
    /// Its deadline passed without a renewal.
    Deadline,
    /// The stream ended or broke.
    Broke,
    /// The test stopped the client (it released).
    Stopped,
}

/// One holding interval of one client, on the client's clock.
#[derive(Debug, Clone)]
pub struct Held {
    pub client: usize,
    pub attempt: u32,
    pub fencing: u64,
    /// When the client was told WON.
    pub won: Instant,
    /// When it had to stop.
    pub until: Instant,
    pub ended: Ended,
}

#[derive(Clone, Default)]
pub struct Checker {
    held: Arc<Mutex<Vec<Held>>>,
    /// Clients holding right now: (client, since).
    holding: Arc<Mutex<Vec<(usize, Instant)>>>,
}

impl Checker {
    fn record(&self, h: Held) {
        self.holding.lock().unwrap().retain(|(c, _)| *c != h.client);
        self.held.lock().unwrap().push(h);
    }

    fn start(&self, client: usize, at: Instant) {
        self.holding.lock().unwrap().push((client, at));
    }

    /// Who holds right now, if anyone.
    pub fn holder(&self) -> Option<usize> {
        self.holding.lock().unwrap().first().map(|(c, _)| *c)
    }

    /// Waits until `client` holds (panics after `within`).
    pub async fn wait_holder(&self, client: usize, within: Duration) {
        let end = Instant::now() + within;
        while self.holder() != Some(client) {
            assert!(Instant::now() < end, "client {client} never held");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Every finished interval, in order of the win.
    pub fn intervals(&self) -> Vec<Held> {
        let mut v = self.held.lock().unwrap().clone();
        v.sort_by_key(|h| h.won);
        v
    }

    /// Asserts that no two clients ever held at once; returns the intervals.
    pub fn assert_no_overlap(&self) -> Vec<Held> {
        let v = self.intervals();
        for (i, a) in v.iter().enumerate() {
            for b in &v[i + 1..] {
                assert!(
                    b.won >= a.until,
                    "two holders at once: client {} held attempt {} (fencing {}) until {:?} after client {} won attempt {} (fencing {}):\n{v:#?}",
                    a.client,
                    a.attempt,
                    a.fencing,
                    a.until.saturating_duration_since(b.won),
                    b.client,
                    b.attempt,
                    b.fencing,
                );
            }
        }
        for w in v.windows(2) {
            assert!(
                w[1].fencing > w[0].fencing,
                "fencing did not rise: {:?} then {:?}",
                w[0],
                w[1]
            );
        }
        v
    }
}

async fn connect(addr: SocketAddr) -> Option<ClaimsClient<Channel>> {
    let ch = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_timeout(Duration::from_millis(300))
        .connect()
        .await
        .ok()?;
    Some(ClaimsClient::new(ch))
}

/// A client that keeps trying to hold `job` (slot 0) through the sidecar at
/// `addr` until `stop` flips, and behaves as SPEC §5 asks: it stops at
/// `LOST_LEASE`, when the stream breaks, and when its deadline passes.
pub async fn contend(
    client: usize,
    addr: SocketAddr,
    job: String,
    checker: Checker,
    mut stop: watch::Receiver<bool>,
) {
    while !*stop.borrow() {
        let Some(mut c) = connect(addr).await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let sent = Instant::now();
        let req = pb::ClaimRequest {
            job: job.clone(),
            slot_ms: 0,
            lease_ms: LEASE,
            wait_ms: 2_000,
            ..Default::default()
        };
        let opened = tokio::select! {
            r = tokio::time::timeout(Duration::from_secs(4), c.hold(req)) => r,
            _ = stop.changed() => return,
        };
        let mut stream = match opened {
            Ok(Ok(s)) => s.into_inner(),
            _ => {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let first = tokio::select! {
            m = tokio::time::timeout(Duration::from_secs(4), stream.message()) => m,
            _ = stop.changed() => return,
        };
        let Ok(Ok(Some(ev))) = first else { continue };
        let claim = ev.claim.clone().unwrap_or_default();
        if claim.outcome != pb::Outcome::Won as i32 {
            continue;
        }
        let won = Instant::now();
        assert!(
            ev.hold_valid_for_ms > 0,
            "a won Hold must carry hold_valid_for_ms: {ev:?}"
        );
        checker.start(client, won);
        let mut deadline = sent + Duration::from_millis(ev.hold_valid_for_ms as u64);
        let (until, ended) = loop {
            tokio::select! {
                biased;
                _ = tokio::time::sleep_until(deadline.into()) => break (deadline, Ended::Deadline),
                m = stream.message() => {
                    let now = Instant::now();
                    if now >= deadline {
                        break (deadline, Ended::Deadline);
                    }
                    match m {
                        Ok(Some(e)) if e.kind == pb::HoldEventKind::Renewed as i32 => {
                            deadline = sent + Duration::from_millis(e.hold_valid_for_ms as u64);
                        }
                        Ok(Some(e)) if e.kind == pb::HoldEventKind::LostLease as i32 => {
                            break (now, Ended::Lost(e.reason));
                        }
                        Ok(Some(_)) => {}
                        _ => break (now, Ended::Broke),
                    }
                }
                _ = stop.changed() => {
                    let _ = tokio::time::timeout(
                        Duration::from_secs(2),
                        c.release(pb::ReleaseRequest {
                            job: job.clone(),
                            slot_ms: 0,
                            token: claim.token.clone(),
                            result: pb::ReleaseResult::Succeeded as i32,
                        }),
                    )
                    .await;
                    break (Instant::now(), Ended::Stopped);
                }
            }
        };
        drop(stream);
        checker.record(Held {
            client,
            attempt: claim.attempt,
            fencing: claim.fencing,
            won,
            until,
            ended,
        });
    }
}

/// The clients of one scenario: one per sidecar, client `i` on sidecar `i`.
pub struct Clients {
    pub checker: Checker,
    stop: watch::Sender<bool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Clients {
    /// Starts client 0 first and waits until it holds, then the others.
    pub async fn start(lab: &Lab, job: &str) -> Clients {
        let checker = Checker::default();
        let (stop, rx) = watch::channel(false);
        let mut tasks = Vec::new();
        for (i, n) in lab.nodes.iter().enumerate() {
            tasks.push(tokio::spawn(contend(
                i,
                n.sidecar.addr,
                job.to_owned(),
                checker.clone(),
                rx.clone(),
            )));
            if i == 0 {
                checker.wait_holder(0, Duration::from_secs(10)).await;
            }
        }
        Clients {
            checker,
            stop,
            tasks,
        }
    }

    /// Stops every client and returns the checked intervals.
    pub async fn finish(self) -> Vec<Held> {
        let _ = self.stop.send(true);
        for t in self.tasks {
            let _ = tokio::time::timeout(Duration::from_secs(10), t).await;
        }
        self.checker.assert_no_overlap()
    }
}

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}
