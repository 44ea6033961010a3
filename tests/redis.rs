//! The Redis store beyond the conformance suite (its 3-process contests are
//! in tests/contest.rs): jobs spread over every cluster master, the `idmp`
//! refusal on Redis < 8.6, `NOSCRIPT` reloads, resends after a dropped
//! connection, an unreachable Redis, and `min_replicas` unmet on a server
//! without replicas. Real servers only: the shared one
//! at 127.0.0.1:6379, the local cluster on 7000-7002, and private
//! `redis-server` processes for the tests that kill connections or servers.

mod common;

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anarchon::claim::*;
use anarchon::error::Error;
use anarchon::proto as pb;
use anarchon::store::{self, DynStore, StoreOptions};
use common::process::{free_addr, Sidecar};
use common::redis as r;
use common::{holder, job, services, spec};
use tokio::sync::Mutex;

fn none() -> DeadHolders {
    DeadHolders::none()
}

async fn admin(addr: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(format!("redis://{addr}/0"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

async fn open(url: &str) -> anarchon::Result<DynStore> {
    store::open(url, &StoreOptions::default()).await
}

/// Retries a claim while the store answers `UNAVAILABLE` (what a client
/// does with the same token), up to `for_how_long`.
async fn claim_until_answered(
    s: &dyn store::Store,
    sp: &ClaimSpec,
    for_how_long: Duration,
) -> (ClaimAnswer, usize) {
    let deadline = Instant::now() + for_how_long;
    let mut unavailable = 0;
    loop {
        match s.claim(sp, &none()).await {
            Ok(a) => return (a, unavailable),
            Err(Error::Unavailable(e)) if Instant::now() < deadline => {
                unavailable += 1;
                eprintln!("claim unavailable (retrying with the same token): {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("claim failed: {e:?}"),
        }
    }
}

// ---------------------------------------------------------------- contests

/// The cluster's masters and the first slot of each one's ranges.
async fn cluster_masters() -> Vec<(String, Vec<(i64, i64)>)> {
    let mut c = admin(r::CLUSTER).await;
    let slots: redis::Value = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query_async(&mut c)
        .await
        .unwrap();
    let mut masters: HashMap<String, Vec<(i64, i64)>> = HashMap::new();
    let redis::Value::Array(ranges) = slots else {
        panic!("CLUSTER SLOTS: {slots:?}")
    };
    for range in ranges {
        let redis::Value::Array(f) = range else {
            continue;
        };
        let (redis::Value::Int(a), redis::Value::Int(b), redis::Value::Array(node)) =
            (&f[0], &f[1], &f[2])
        else {
            continue;
        };
        let host: String = redis::from_redis_value_ref(&node[0]).unwrap();
        let port: i64 = redis::from_redis_value_ref(&node[1]).unwrap();
        masters
            .entry(format!("{host}:{port}"))
            .or_default()
            .push((*a, *b));
    }
    let mut v: Vec<_> = masters.into_iter().collect();
    v.sort();
    v
}

/// One job name per master: the `{job}` hash tag decides the slot.
async fn jobs_on_every_master() -> Vec<(String, String)> {
    let masters = cluster_masters().await;
    assert_eq!(masters.len(), 3, "the local cluster has three masters");
    let mut c = admin(r::CLUSTER).await;
    let mut out = Vec::new();
    for (addr, ranges) in &masters {
        for i in 0.. {
            let name = format!("spread-{:06x}-{i}", rand::random::<u32>() & 0xffffff);
            let slot: i64 = redis::cmd("CLUSTER")
                .arg("KEYSLOT")
                .arg(format!("x:{{{name}}}:runs"))
                .query_async(&mut c)
                .await
                .unwrap();
            if ranges.iter().any(|&(a, b)| a <= slot && slot <= b) {
                out.push((addr.clone(), name));
                break;
            }
        }
    }
    out
}

/// Three sidecars on the cluster, 24 claimers, one job on each master:
/// exactly one WON per (job, slot), and each job's keys on its own master.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_contest_spreads_jobs_over_every_master() {
    if !r::have_cluster() {
        return;
    }
    let jobs = jobs_on_every_master().await;
    let prefix = r::prefix();
    let url = format!(
        "redis+cluster://{}?strategy=lease&prefix={prefix}",
        r::CLUSTER_NODES
    );
    let root = tempfile::tempdir().unwrap();
    let sidecars: Vec<Sidecar> = (0..3)
        .map(|i| {
            Sidecar::start(
                &root.path().join(format!("s{i}")),
                &["--backend", &url, "--max-late-ms", "3600000"],
            )
        })
        .collect();
    let base = host_now_ms();
    let slots = 300i64;
    let wins: Arc<Mutex<HashMap<(String, i64), usize>>> = Default::default();
    let mut tasks = Vec::new();
    for c in 0..24usize {
        let addr = sidecars[c % 3].addr;
        let names: Vec<String> = jobs.iter().map(|(_, j)| j.clone()).collect();
        let wins = wins.clone();
        tasks.push(tokio::spawn(async move {
            let mut cl = pb::claims_client::ClaimsClient::connect(format!("http://{addr}"))
                .await
                .unwrap();
            for i in 0..slots {
                if (i + c as i64) % 2 != 0 {
                    continue;
                }
                for j in &names {
                    let a = cl
                        .claim(pb::ClaimRequest {
                            job: j.clone(),
                            slot_ms: base + i,
                            ..Default::default()
                        })
                        .await
                        .unwrap()
                        .into_inner();
                    match pb::Outcome::try_from(a.outcome) {
                        Ok(pb::Outcome::Won) => {
                            *wins.lock().await.entry((j.clone(), base + i)).or_default() += 1
                        }
                        Ok(pb::Outcome::Running) => assert!(a.token.is_empty()),
                        other => panic!("unexpected outcome {other:?}"),
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    drop(sidecars);
    let wins = wins.lock().await;
    for (_, j) in &jobs {
        for i in 0..slots {
            assert_eq!(
                wins.get(&(j.clone(), base + i)).copied(),
                Some(1),
                "job {j} slot {i}"
            );
        }
    }
    // Each job's keys live on the master its hash tag names.
    for (addr, j) in &jobs {
        let mut c = admin(addr).await;
        let n: i64 = redis::cmd("HLEN")
            .arg(format!("{prefix}:{{{j}}}:runs"))
            .query_async(&mut c)
            .await
            .unwrap();
        // A run record and the lease it was claimed with, per slot.
        assert_eq!(n, 2 * slots, "{j} on {addr}");
    }
    let masters: HashSet<&String> = jobs.iter().map(|(a, _)| a).collect();
    assert_eq!(masters.len(), 3);
}

// ------------------------------------------------------------ idmp refusal

/// Every script compiles (`SCRIPT LOAD`), including `idmp.lua`, whose
/// happy path needs a Redis >= 8.6 to run.
#[tokio::test]
async fn every_lua_script_compiles() {
    if !r::have_redis() {
        return;
    }
    let mut c = admin(r::REDIS).await;
    for (name, src) in [
        ("lease.lua", include_str!("../src/store/redis/lease.lua")),
        ("script.lua", include_str!("../src/store/redis/script.lua")),
        ("idmp.lua", include_str!("../src/store/redis/idmp.lua")),
        ("once.lua", include_str!("../src/store/redis/once.lua")),
    ] {
        let sha: Result<String, _> = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(src)
            .query_async(&mut c)
            .await;
        assert!(sha.is_ok(), "{name}: {sha:?}");
    }
}

#[tokio::test]
async fn idmp_refuses_redis_without_idmp_and_names_script() {
    if !r::have_redis() {
        return;
    }
    let mut c = admin(r::REDIS).await;
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut c)
        .await
        .unwrap();
    if !info.contains("redis_version:7.") && !info.contains("redis_version:6.") {
        eprintln!("SKIPPED idmp refusal: the Redis at {} has IDMP", r::REDIS);
        return;
    }
    for url in [r::url("idmp")]
        .into_iter()
        .chain(r::have_cluster().then(|| r::cluster_url("idmp")))
    {
        let err = match open(&url).await {
            Ok(_) => panic!("idmp must refuse a Redis < 8.6 ({url})"),
            Err(e) => e,
        };
        let msg = err.to_string();
        assert!(
            matches!(
                err,
                Error::InvalidArgument {
                    field: "backend",
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(msg.contains("8.6"), "{msg}");
        assert!(msg.contains("strategy=script"), "{msg}");
    }
}

/// `anarchon serve` itself refuses to start, and says why.
#[test]
fn serve_refuses_idmp_on_redis_below_8_6() {
    if !r::have_redis() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = common::process::serve_on_any_port()
        .arg("--data-dir")
        .arg(dir.path())
        .arg("--backend")
        .arg(r::url("idmp"))
        .env("RUST_LOG", "error")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("strategy=script"), "{text}");
}

// --------------------------------------------------------- NOSCRIPT reload

async fn evalsha_calls(addr: &str) -> u64 {
    let mut c = admin(addr).await;
    let stats: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut c)
        .await
        .unwrap();
    stats
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|l| l.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// The scripts go out as EVALSHA; after `SCRIPT FLUSH` the first call gets
/// NOSCRIPT, the script is loaded again and the claim still answers.
#[tokio::test]
async fn noscript_reloads_the_script() {
    if !r::have_redis() {
        return;
    }
    for strategy in ["lease", "script"] {
        let s = open(&r::url(strategy)).await.unwrap();
        let j = job("noscript");
        let before = evalsha_calls(r::REDIS).await;
        let a = s
            .claim(&spec(&j, host_now_ms(), &holder("a", 1)), &none())
            .await
            .unwrap();
        assert_eq!(a.outcome, Outcome::Won);
        assert!(evalsha_calls(r::REDIS).await > before, "claims use EVALSHA");
        let mut c = admin(r::REDIS).await;
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut c)
            .await
            .unwrap();
        let b = s
            .claim(&spec(&j, host_now_ms() + 1, &holder("a", 1)), &none())
            .await
            .unwrap();
        assert_eq!(b.outcome, Outcome::Won, "{strategy}: {b:?}");
        // And the next one finds the script loaded again.
        let c2 = s
            .claim(&spec(&j, host_now_ms() + 2, &holder("a", 1)), &none())
            .await
            .unwrap();
        assert_eq!(c2.outcome, Outcome::Won);
    }
}

#[tokio::test]
async fn noscript_reloads_the_script_on_every_cluster_master() {
    if !r::have_cluster() {
        return;
    }
    let s = open(&r::cluster_url("lease")).await.unwrap();
    let jobs = jobs_on_every_master().await;
    for (addr, _) in &jobs {
        let mut c = admin(addr).await;
        let _: () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut c)
            .await
            .unwrap();
    }
    for (_, name) in &jobs {
        let j = Job::parse(name).unwrap();
        let a = s
            .claim(&spec(&j, host_now_ms(), &holder("a", 1)), &none())
            .await
            .unwrap();
        assert_eq!(a.outcome, Outcome::Won, "{name}: {a:?}");
    }
    s.ping().await.unwrap();
}

// --------------------------------------- private servers: kills and outages

/// A `redis-server` of our own on a free port, killed when dropped, so a
/// test may kill its connections or the server itself.
struct PrivateRedis {
    child: Option<Child>,
    addr: SocketAddr,
    dir: tempfile::TempDir,
}

impl PrivateRedis {
    fn start() -> Option<PrivateRedis> {
        if Command::new("redis-server")
            .arg("--version")
            .output()
            .is_err()
        {
            if services::in_ci() {
                panic!("redis-server is not installed, and CI=true forbids skipping");
            }
            eprintln!("SKIPPED: redis-server is not installed");
            return None;
        }
        let mut p = PrivateRedis {
            child: None,
            addr: free_addr(),
            dir: tempfile::tempdir().unwrap(),
        };
        // The free port may be taken by another test before our server binds
        // it (the server then exits): take another one.
        for _ in 0..5 {
            if p.try_spawn() {
                return Some(p);
            }
            p.addr = free_addr();
        }
        panic!("redis-server did not start on any of 5 free ports");
    }

    /// Starts the server again on its own port (a restart).
    fn spawn(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.try_spawn() {
            assert!(
                Instant::now() < deadline,
                "redis-server did not start again"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Spawns the server and waits until it answers, as itself: a listener
    /// on the port is not enough (another process may hold it, and our
    /// server then exits), so the answer must carry our child's pid.
    fn try_spawn(&mut self) -> bool {
        let mut child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port"])
            .arg(self.addr.port().to_string())
            .args(["--save", "", "--appendonly", "no", "--dir"])
            .arg(self.dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if !matches!(child.try_wait(), Ok(None)) {
                let _ = child.wait();
                return false;
            }
            if server_pid(&self.addr) == Some(child.id()) {
                self.child = Some(child);
                return true;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn url(&self, strategy: &str) -> String {
        format!(
            "redis://{}/0?strategy={strategy}&prefix={}",
            self.addr,
            r::prefix()
        )
    }

    /// Kills every client connection but the one that asks.
    async fn kill_clients(&self) -> i64 {
        let mut c = admin(&self.addr.to_string()).await;
        redis::cmd("CLIENT")
            .arg(&["KILL", "TYPE", "normal", "SKIPME", "yes"][..])
            .query_async(&mut c)
            .await
            .unwrap()
    }
}

/// The pid of the Redis server answering on `addr`, if one answers.
fn server_pid(addr: &SocketAddr) -> Option<u32> {
    let client = redis::Client::open(format!("redis://{addr}")).ok()?;
    let mut c = client
        .get_connection_with_timeout(Duration::from_millis(500))
        .ok()?;
    let info: String = redis::cmd("INFO").arg("server").query(&mut c).ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix("process_id:"))?
        .trim()
        .parse()
        .ok()
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The connection under a claim drops; the caller resends with the same
/// token and is told it holds the run: same attempt, same fencing.
#[tokio::test]
async fn resend_after_a_dropped_connection_finds_our_claim() {
    let Some(server) = PrivateRedis::start() else {
        return;
    };
    for strategy in ["lease", "stream-id", "script"] {
        let s = open(&server.url(strategy)).await.unwrap();
        let sp = spec(&job("drop"), host_now_ms(), &holder("a", 1));
        let first = s.claim(&sp, &none()).await.unwrap();
        assert_eq!(first.outcome, Outcome::Won);
        assert!(
            server.kill_clients().await >= 1,
            "the store's connection was killed"
        );
        let (again, unavailable) = claim_until_answered(&*s, &sp, Duration::from_secs(10)).await;
        assert_eq!(again.outcome, Outcome::Won, "{strategy}: {again:?}");
        assert_eq!(
            (again.attempt, again.fencing),
            (first.attempt, first.fencing),
            "{strategy}"
        );
        eprintln!("{strategy}: resend answered after {unavailable} UNAVAILABLE");
        // Someone else still cannot have it.
        let other = spec(&sp.job, sp.slot_ms, &holder("b", 1));
        let b = s.claim(&other, &none()).await.unwrap();
        assert_ne!(b.outcome, Outcome::Won, "{strategy}");
    }
}

/// The same through a real `anarchon serve`: its Redis connection is
/// killed, the application resends `Claim` with its token and is told it
/// holds the run (same attempt, same fencing); an error in between is
/// `UNAVAILABLE`, never a wrong outcome.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sidecar_resend_after_its_redis_connection_dropped() {
    let Some(server) = PrivateRedis::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let url = server.url("lease");
    let sc = Sidecar::start(dir.path(), &["--backend", &url]);
    let mut cl = pb::claims_client::ClaimsClient::connect(sc.url())
        .await
        .unwrap();
    let req = pb::ClaimRequest {
        job: job("sidecar-drop").to_string(),
        slot_ms: host_now_ms(),
        token: Token::generate().as_str().to_owned(),
        ..Default::default()
    };
    let first = cl.claim(req.clone()).await.unwrap().into_inner();
    assert_eq!(first.outcome, pb::Outcome::Won as i32);
    assert!(server.kill_clients().await >= 1);
    let deadline = Instant::now() + Duration::from_secs(10);
    let again = loop {
        match cl.claim(req.clone()).await {
            Ok(r) => break r.into_inner(),
            Err(st) if st.code() == tonic::Code::Unavailable && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(st) => panic!("resend failed: {st:?}"),
        }
    };
    assert_eq!(again.outcome, pb::Outcome::Won as i32, "{again:?}");
    assert_eq!(
        (again.attempt, again.fencing),
        (first.attempt, first.fencing)
    );
    assert_eq!(again.token, req.token);
}

#[tokio::test]
async fn unreachable_redis_is_unavailable() {
    let closed = free_addr();
    for url in [
        format!("redis://{closed}/0?strategy=lease"),
        format!("redis://{closed}/0?strategy=stream-id"),
        format!("redis+cluster://{closed}?strategy=lease"),
    ] {
        match open(&url).await {
            Err(Error::Unavailable(_)) => {}
            Err(e) => panic!("{url}: expected UNAVAILABLE, got {e:?}"),
            Ok(_) => panic!("{url}: opened a closed port"),
        }
    }
}

/// Redis goes away under a running store: claims are UNAVAILABLE, never
/// WON; when it is back, the same store reconnects by itself.
#[tokio::test]
async fn redis_down_is_unavailable_then_reconnects() {
    let Some(mut server) = PrivateRedis::start() else {
        return;
    };
    for strategy in ["lease", "stream-id", "script"] {
        let s = open(&server.url(strategy)).await.unwrap();
        let j = job("down");
        server.stop();
        for i in 0..3 {
            let sp = spec(&j, host_now_ms() + i, &holder("a", 1));
            match s.claim(&sp, &none()).await {
                Err(Error::Unavailable(_)) => {}
                other => panic!("{strategy}: Redis is down, got {other:?}"),
            }
        }
        assert!(matches!(s.ping().await, Err(Error::Unavailable(_))));
        server.spawn();
        let sp = spec(&j, host_now_ms(), &holder("a", 1));
        let (a, _) = claim_until_answered(&*s, &sp, Duration::from_secs(15)).await;
        assert_eq!(a.outcome, Outcome::Won, "{strategy}: {a:?}");
    }
}

/// A Redis that restarts without persistence forgets every claim. The lease
/// store notices (its memory record is gone): no claim is decided for
/// `quarantine_ms` (the old lock holder's lease runs out meanwhile), then the
/// lock is taken with a fencing number above every old one, and a slot from
/// before the loss is never handed out again.
#[tokio::test]
async fn lease_after_redis_forgot_quarantines_then_fences_higher() {
    let Some(mut server) = PrivateRedis::start() else {
        return;
    };
    let url = format!("{}&quarantine_ms=1500", server.url("lease"));
    let s = open(&url).await.unwrap();
    let j = job("forgot");
    let mut lock = spec(&j, 0, &holder("a", 1));
    lock.lease_ms = 1000;
    let old = s.claim(&lock, &none()).await.unwrap();
    assert_eq!(old.outcome, Outcome::Won);
    let slot = spec(&j, host_now_ms() - 1, &holder("a", 1));
    assert_eq!(s.claim(&slot, &none()).await.unwrap().outcome, Outcome::Won);

    server.stop();
    server.spawn();
    let restarted = Instant::now();
    let mut other = spec(&j, 0, &holder("b", 1));
    other.lease_ms = 1000;
    let (won, unavailable) = claim_until_answered(&*s, &other, Duration::from_secs(15)).await;
    let waited = restarted.elapsed();
    assert_eq!(won.outcome, Outcome::Won, "{won:?}");
    assert!(unavailable > 0, "the forgotten server was never refused");
    assert!(
        waited >= Duration::from_millis(1500),
        "the lock was handed over {waited:?} after the restart, inside the quarantine"
    );
    assert!(
        waited < Duration::from_secs(6),
        "the quarantine of 1.5 s lasted {waited:?}"
    );
    assert!(
        won.fencing > old.fencing && won.fencing > 1_000_000_000_000,
        "fencing went back: {} after {}",
        won.fencing,
        old.fencing
    );
    // The slot won before the loss is refused, to its old holder too.
    for h in ["a", "b"] {
        let again = s
            .claim(&spec(&j, slot.slot_ms, &holder(h, 1)), &none())
            .await
            .unwrap();
        assert_eq!(again.outcome, Outcome::Late, "{again:?}");
        assert_eq!(again.reason, Some("store_restarted"));
    }
    // A new slot is decided as usual.
    let next = spec(&j, host_now_ms(), &holder("b", 1));
    assert_eq!(s.claim(&next, &none()).await.unwrap().outcome, Outcome::Won);

    // A store opened now (a new deployment, nothing to remember) on a
    // server that forgets: no quarantine, since it saw no record before.
    server.stop();
    server.spawn();
    let fresh = open(&url).await.unwrap();
    let a = fresh
        .claim(&spec(&job("new"), host_now_ms(), &holder("c", 1)), &none())
        .await
        .unwrap();
    assert_eq!(a.outcome, Outcome::Won, "{a:?}");
}

// ------------------------------------------------- strategy-specific rules

#[tokio::test]
async fn stream_id_answers_late_for_a_slot_older_than_the_newest() {
    let Some(s) = r::single("stream-id").await else {
        return;
    };
    let j = job("order");
    let t = host_now_ms();
    let new = s
        .claim(&spec(&j, t, &holder("a", 1)), &none())
        .await
        .unwrap();
    assert_eq!(new.outcome, Outcome::Won);
    let old = s
        .claim(&spec(&j, t - 1000, &holder("a", 1)), &none())
        .await
        .unwrap();
    assert_eq!(old.outcome, Outcome::Late);
    assert_eq!(old.reason, Some("slot_older_than_newest"));
    assert!(old.token.is_none());
    // A later slot gets a higher fencing number.
    let next = s
        .claim(&spec(&j, t + 1000, &holder("b", 1)), &none())
        .await
        .unwrap();
    assert_eq!(next.outcome, Outcome::Won);
    assert!(next.fencing > new.fencing);
    let h = s.history(&j, 10, None).await.unwrap();
    assert!(!h.complete);
    assert!(h.note.is_some());
    assert_eq!(h.runs.len(), 2);
    assert_eq!(h.runs[0].state, RunState::Claimed);
}

#[tokio::test]
async fn script_refuses_claims_its_window_would_forget() {
    if !r::have_redis() {
        return;
    }
    let url = format!("{}&window_ms=60000", r::url("script"));
    let s = open(&url).await.unwrap();
    let mut sp = spec(&job("window"), host_now_ms(), &holder("a", 1));
    sp.max_late_ms = 120_000;
    match s.claim(&sp, &none()).await {
        Err(Error::InvalidArgument { field, .. }) => assert_eq!(field, "max_late_ms"),
        other => panic!("expected INVALID_ARGUMENT, got {other:?}"),
    }
    sp.max_late_ms = 30_000;
    assert_eq!(s.claim(&sp, &none()).await.unwrap().outcome, Outcome::Won);
    // The stream expires with the window.
    let mut c = admin(r::REDIS).await;
    let prefix = url
        .split("prefix=")
        .nth(1)
        .unwrap()
        .split('&')
        .next()
        .unwrap();
    let ttl: i64 = redis::cmd("PTTL")
        .arg(format!("{prefix}:{{{}}}:script", sp.job))
        .query_async(&mut c)
        .await
        .unwrap();
    assert!(ttl > 0 && ttl <= 60_000, "ttl {ttl}");
}

/// The lease script keeps the history stream capped and every key of a job
/// under its hash tag.
#[tokio::test]
async fn lease_keys_carry_the_job_hash_tag_and_history_is_capped() {
    if !r::have_redis() {
        return;
    }
    let prefix = r::prefix();
    let url = format!(
        "redis://{}/0?strategy=lease&prefix={prefix}&history_maxlen=10",
        r::REDIS
    );
    let s = open(&url).await.unwrap();
    let j = job("tags");
    let t = host_now_ms();
    for i in 0..300 {
        let a = s
            .claim(&spec(&j, t + i, &holder("a", 1)), &none())
            .await
            .unwrap();
        assert_eq!(a.outcome, Outcome::Won);
    }
    let mut c = admin(r::REDIS).await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}:*"))
        .query_async(&mut c)
        .await
        .unwrap();
    for k in &keys {
        assert!(
            k.contains(&format!("{{{j}}}"))
                || k.ends_with(":jobs")
                || k.ends_with(":memory")
                || k.contains(":holder:"),
            "{k}"
        );
    }
    let len: i64 = redis::cmd("XLEN")
        .arg(format!("{prefix}:{{{j}}}:history"))
        .query_async(&mut c)
        .await
        .unwrap();
    assert!(len < 300, "MAXLEN ~ caps the history stream ({len})");
    let members: i64 = redis::cmd("SCARD")
        .arg(format!("{prefix}:holder:a:1"))
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(members, 300, "the holder index lists every run it holds");
    assert_eq!(
        s.leases()
            .unwrap()
            .end_leases_of(&holder("a", 1))
            .await
            .unwrap(),
        300
    );
}

// ------------------------------------- the Lua table agrees with decide()

/// A run record in `lease.lua`'s format.
fn record(r: &RunRow) -> String {
    format!(
        "{} {} {} {} {} {} {} {} {}",
        r.state.as_str(),
        r.attempt,
        r.fencing,
        r.lease_until_ms,
        r.claimed_at_ms,
        r.finished_at_ms,
        r.token.as_str(),
        r.holder.instance,
        r.holder.node
    )
}

/// Random runs, specs and dead sets, written straight into Redis; the
/// lease script must answer what the Rust decision table answers. Times
/// are whole seconds away from `now`, so the few milliseconds between the
/// script's `TIME` and the host clock cannot change a decision.
#[tokio::test]
async fn lease_script_agrees_with_the_decision_table() {
    use rand::seq::SliceRandom;
    use rand::Rng;
    if !r::have_redis() {
        return;
    }
    let prefix = r::prefix();
    let s = open(&format!(
        "redis://{}/0?strategy=lease&prefix={prefix}",
        r::REDIS
    ))
    .await
    .unwrap();
    let mut c = admin(r::REDIS).await;
    let (mut rng, _seed) = common::seed::rng("lease_script_agrees_with_the_decision_table");
    let mine = Token::generate();
    let holders = [
        holder("x", 1),
        holder("x", 2),
        holder("y", 1),
        holder("me", 1),
    ];
    let mut seen: HashMap<String, usize> = HashMap::new();
    for case in 0..400 {
        let j = job("table");
        let now = host_now_ms();
        let slot = *[0, now - 5_000, now - 120_000, now + 30_000]
            .choose(&mut rng)
            .unwrap();
        let row = |slot: i64, rng: &mut rand::rngs::StdRng| RunRow {
            slot_ms: slot,
            state: *[
                RunState::Running,
                RunState::Running,
                RunState::Succeeded,
                RunState::Failed,
                RunState::Interrupted,
            ]
            .choose(rng)
            .unwrap(),
            attempt: rng.gen_range(1..4),
            fencing: 10,
            token: if rng.gen_bool(0.4) {
                mine.clone()
            } else {
                Token::generate()
            },
            holder: holders.choose(rng).unwrap().clone(),
            lease_until_ms: now + *[-20_000, 20_000].choose(rng).unwrap(),
            claimed_at_ms: now - 30_000,
            finished_at_ms: 0,
        };
        let run = rng.gen_bool(0.7).then(|| row(slot, &mut rng));
        let others: Vec<RunRow> = (0..rng.gen_range(0..3))
            .map(|i| row(now - 1_000_000 - i, &mut rng))
            .collect();
        let spec = ClaimSpec {
            job: j.clone(),
            slot_ms: slot,
            token: mine.clone(),
            holder: holders.choose(&mut rng).unwrap().clone(),
            lease_ms: 10_000,
            max_late_ms: 60_000,
            overlap: if rng.gen_bool(0.5) {
                Overlap::Skip
            } else {
                Overlap::Allow
            },
            max_attempts: rng.gen_range(1..4),
        };
        let mut dead = none();
        if rng.gen_bool(0.3) {
            dead.mark_dead(holder("x", 1));
        }
        if rng.gen_bool(0.3) {
            dead.set_current("y", 2);
        }
        // Store the runs as the script keeps them.
        let keys = |s: &str| format!("{prefix}:{{{j}}}:{s}");
        let _: () = redis::cmd("SET")
            .arg(keys("fence"))
            .arg(10)
            .query_async(&mut c)
            .await
            .unwrap();
        for r in run.iter().chain(others.iter()) {
            let _: () = redis::pipe()
                .hset(keys("runs"), r.slot_ms, record(r))
                .zadd(keys("slots"), r.slot_ms, r.slot_ms)
                .sadd(keys("running"), r.slot_ms)
                .query_async(&mut c)
                .await
                .unwrap();
        }
        let got = s.claim(&spec, &dead).await.unwrap();
        let now2 = host_now_ms();
        let d = decide(now2, &spec, &dead, run.as_ref(), &others);
        let written = d.next_row(&spec, run.as_ref(), now2, 11);
        let want = d.answer(&spec, run.as_ref(), written.as_ref(), now2);
        let ctx = format!("case {case}: {d:?}\nrun {run:?}\nothers {others:?}\nspec {spec:?}\ndead {dead:?}\ngot {got:?}\nwant {want:?}");
        assert_eq!(got.outcome, want.outcome, "{ctx}");
        assert_eq!(got.attempt, want.attempt, "{ctx}");
        assert_eq!(got.fencing, want.fencing, "{ctx}");
        assert_eq!(got.reason, want.reason, "{ctx}");
        assert_eq!(got.token, want.token, "{ctx}");
        if want.outcome != Outcome::Overlap {
            assert_eq!(got.holder, want.holder, "{ctx}");
        }
        if want.outcome == Outcome::Won {
            assert!(
                (got.lease_until_ms - want.lease_until_ms).abs() < 1_000,
                "{ctx}"
            );
        }
        // What was written agrees too.
        let after = s.history(&j, 10, None).await.unwrap();
        let stored = after.runs.iter().find(|r| r.slot_ms == slot);
        match (&written, stored) {
            (Some(w), Some(st)) => {
                assert_eq!(
                    (st.state, st.attempt, st.fencing),
                    (w.state, w.attempt, w.fencing),
                    "{ctx}"
                );
                assert_eq!((&st.token, &st.holder), (&w.token, &w.holder), "{ctx}");
            }
            (None, st) => assert_eq!(st, run.as_ref(), "nothing written: {ctx}"),
            (Some(_), None) => panic!("nothing stored: {ctx}"),
        }
        *seen
            .entry(format!("{d:?}").split('(').next().unwrap().to_owned())
            .or_default() += 1;
    }
    eprintln!("decisions covered: {seen:?}");
    for d in [
        "Late",
        "Overlap",
        "Insert",
        "Resend",
        "Running",
        "Takeover",
        "Exhausted",
        "Done",
        "Relock",
    ] {
        assert!(seen.contains_key(d), "no case reached {d}: {seen:?}");
    }
}

/// `min_replicas` on a server without replicas (the shared 6379): every
/// deciding step is followed by `WAIT`, which counts 0, so the answer is
/// `UNAVAILABLE` naming the replicas — never `WON` — for each strategy; the
/// claim was written all the same, and once the requirement is met (here: a
/// store with `min_replicas=0` on the same prefix) the resend with the same
/// token finds its own claim and answers `WON`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_replicas_unmet_is_unavailable_and_the_resend_wins() {
    if !r::have_redis() {
        return;
    }
    for strategy in ["lease", "stream-id", "script"] {
        let prefix = r::prefix();
        let base = format!("redis://{}/0?strategy={strategy}&prefix={prefix}", r::REDIS);
        let strict = open(&format!("{base}&min_replicas=1&replica_timeout_ms=50"))
            .await
            .unwrap();
        let plain = open(&base).await.unwrap();
        let j = job("minrep");
        let s = spec(&j, host_now_ms(), &holder("n", 1));
        match strict.claim(&s, &none()).await {
            Err(Error::Unavailable(m)) => {
                assert!(m.contains("replicas acknowledged"), "{strategy}: {m}")
            }
            other => panic!("{strategy}: expected UNAVAILABLE, got {other:?}"),
        }
        let again = plain.claim(&s, &none()).await.unwrap();
        assert_eq!(again.outcome, Outcome::Won, "{strategy}: the resend");
        let other = spec(&j, s.slot_ms, &holder("m", 1));
        let lost = plain.claim(&other, &none()).await.unwrap();
        assert_ne!(lost.outcome, Outcome::Won, "{strategy}: a second winner");
    }
}

/// A bad replica option names itself.
#[tokio::test]
async fn bad_replica_options_name_the_option() {
    for (url, option) in [
        ("redis://127.0.0.1:6379/0?min_replicas=two", "min_replicas"),
        (
            "redis://127.0.0.1:6379/0?replica_timeout_ms=1",
            "replica_timeout_ms",
        ),
        ("redis+sentinel://127.0.0.1:26390", "redis+sentinel"),
    ] {
        let e = open(url).await.err().unwrap().to_string();
        assert!(e.contains(option), "{url}: {e}");
    }
}
