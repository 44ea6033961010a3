//! Never two holders at once (SPEC §5, docs/safety.md): the fault lab's
//! short runs, per lease store. Each scenario starts three sidecars on
//! 127.0.0.2–.4 (own group ids), a client per sidecar contending for one
//! lock through `Hold`, client 0 holding first through sidecar A (node 0),
//! injects one fault, heals, and asserts on what the clients were told:
//! zero overlapping holders, rising fencing, and a winner where one is due.
//! Each store adds one `faults!` line.

mod common;

use std::time::{Duration, Instant};

use common::lab::{self, ms, Clients, Ended, Lab, Nft, LEASE};
use common::liveness::{EXPIRY, HB};
use common::restart::{self, Server};

/// These tests measure time and share nftables: they take turns.
static TURN: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn job(kind: &str) -> String {
    format!("fault-{kind}-{:08x}", rand::random::<u32>())
}

/// The intervals won after `t` by a client other than 0.
fn won_by_others_after(v: &[lab::Held], t: Instant) -> Vec<&lab::Held> {
    v.iter().filter(|h| h.client != 0 && h.won >= t).collect()
}

/// A cut from the mesh only: A still reaches the store and refreshes its
/// liveness record, so nobody may confirm its death: A keeps its run, and
/// nobody else is told WON while the cut lasts.
async fn mesh_cut(backend: &str) {
    let nft = Nft::new();
    let lab = Lab::start(backend, 3).await;
    let c = Clients::start(&lab, &job("mesh")).await;
    let cut = Instant::now();
    lab.cut_from_mesh(&nft, 0);
    tokio::time::sleep(ms(3 * EXPIRY)).await;
    nft.heal();
    let healed = Instant::now();
    tokio::time::sleep(ms(EXPIRY)).await;
    assert_eq!(c.checker.holder(), Some(0), "A kept its run");
    let v = c.finish().await;
    let during: Vec<_> = won_by_others_after(&v, cut)
        .into_iter()
        .filter(|h| h.won < healed)
        .collect();
    assert!(during.is_empty(), "won during a mesh-only cut: {during:?}");
}

/// One-way cuts (A's packets to B and C dropped, theirs to A pass): the
/// same as a full mesh cut.
async fn asymmetric_cut(backend: &str) {
    let nft = Nft::new();
    let lab = Lab::start(backend, 3).await;
    let c = Clients::start(&lab, &job("oneway")).await;
    let cut = Instant::now();
    nft.cut(lab.nodes[0].ip, lab.nodes[1].ip);
    nft.cut(lab.nodes[0].ip, lab.nodes[2].ip);
    tokio::time::sleep(ms(3 * EXPIRY)).await;
    nft.heal();
    tokio::time::sleep(ms(EXPIRY)).await;
    let v = c.finish().await;
    assert!(
        won_by_others_after(&v, cut).is_empty(),
        "won during a one-way cut: {v:#?}"
    );
}

/// A cut from the store only: A cannot refresh its record, so its holder
/// is told to stop within one expiry; the run is taken over once its lease
/// has lapsed (A is alive in the mesh, so not before).
async fn store_cut(backend: &str) {
    let nft = Nft::new();
    let lab = Lab::start(backend, 3).await;
    let c = Clients::start(&lab, &job("store")).await;
    let cut = Instant::now();
    lab.cut_from_store(&nft, 0);
    tokio::time::sleep(ms(LEASE as u64 + 2 * EXPIRY + 1000)).await;
    let winner = c.checker.holder();
    nft.heal();
    tokio::time::sleep(ms(EXPIRY)).await;
    let v = c.finish().await;
    let a = v.iter().find(|h| h.client == 0).expect("A held");
    assert!(
        a.until.duration_since(cut) <= ms(EXPIRY + 200),
        "A's holder stopped {:?} after the cut",
        a.until.duration_since(cut)
    );
    assert!(
        matches!(winner, Some(1 | 2)),
        "nobody took the run over while A was cut from the store: {v:#?}"
    );
}

/// A cut from the mesh and the store: A's holder is told to stop (or its
/// deadline passes) before anyone else is told WON, and the run is taken
/// over soon after one expiry.
async fn full_cut(backend: &str) {
    let nft = Nft::new();
    let lab = Lab::start(backend, 3).await;
    let c = Clients::start(&lab, &job("full")).await;
    let cut = Instant::now();
    lab.cut_from_mesh(&nft, 0);
    lab.cut_from_store(&nft, 0);
    tokio::time::sleep(ms(3 * EXPIRY)).await;
    let winner = c.checker.holder();
    nft.heal();
    tokio::time::sleep(ms(EXPIRY)).await;
    let v = c.finish().await;
    let a = v.iter().find(|h| h.client == 0).expect("A held");
    let first_other = won_by_others_after(&v, cut)
        .into_iter()
        .next()
        .expect("the run was taken over");
    assert!(
        a.until <= first_other.won,
        "A's holder stopped after the takeover: {v:#?}"
    );
    let took = first_other.won.duration_since(cut);
    assert!(
        took <= ms(EXPIRY + 3 * HB + 500),
        "taken over {took:?} after a full cut"
    );
    assert!(matches!(winner, Some(1 | 2)));
}

/// A paused sidecar (SIGSTOP for two expiries): its holder's deadline
/// passes before the peers take the run over, and on waking it neither
/// renews nor answers WON from stale belief.
async fn pause(backend: &str) {
    let lab = Lab::start(backend, 3).await;
    let c = Clients::start(&lab, &job("pause")).await;
    let paused = Instant::now();
    lab.nodes[0].sidecar.pause();
    tokio::time::sleep(ms(2 * EXPIRY + 500)).await;
    let winner = c.checker.holder();
    lab.nodes[0].sidecar.resume();
    tokio::time::sleep(ms(2 * EXPIRY)).await;
    let v = c.finish().await;
    let a = v.iter().find(|h| h.client == 0).expect("A held");
    assert!(
        a.until.duration_since(paused) <= ms(EXPIRY),
        "A's holder held {:?} into the pause",
        a.until.duration_since(paused)
    );
    assert!(
        matches!(winner, Some(1 | 2)),
        "nobody took over from the paused sidecar: {v:#?}"
    );
}

/// SIGKILL of the holder's sidecar: taken over within one expiry plus one
/// heartbeat (and not before expiry − 1 heartbeat).
async fn kill(backend: &str) {
    let mut lab = Lab::start(backend, 3).await;
    let c = Clients::start(&lab, &job("kill")).await;
    tokio::time::sleep(ms(2 * HB)).await;
    // Between two of its beats (see `mid_beat`: the lower bound is exact).
    common::mesh::mid_beat(lab.nodes[0].sidecar.addr, ms(HB)).await;
    let killed = Instant::now();
    tokio::task::block_in_place(|| lab.nodes[0].sidecar.kill());
    let end = killed + ms(EXPIRY + 10 * HB);
    while !matches!(c.checker.holder(), Some(1 | 2)) && Instant::now() < end {
        tokio::time::sleep(ms(5)).await;
    }
    let v = c.finish().await;
    let next = won_by_others_after(&v, killed)
        .into_iter()
        .next()
        .expect("taken over");
    let took = next.won.duration_since(killed);
    assert!(
        took >= ms(EXPIRY - HB) && took <= ms(EXPIRY + HB + 150),
        "taken over {took:?} after SIGKILL, want [{:?}, {:?}]",
        ms(EXPIRY - HB),
        ms(EXPIRY + HB + 150)
    );
    println!("takeover after SIGKILL: {took:?}");
}

/// Two sidecars down at once (the holder's and one more): the third takes
/// the run over.
async fn two_down(backend: &str) {
    let mut lab = Lab::start(backend, 3).await;
    let c = Clients::start(&lab, &job("two")).await;
    tokio::task::block_in_place(|| {
        lab.nodes[0].sidecar.kill();
        lab.nodes[1].sidecar.kill();
    });
    let killed = Instant::now();
    let end = killed + ms(EXPIRY + 10 * HB);
    while c.checker.holder() != Some(2) && Instant::now() < end {
        tokio::time::sleep(ms(5)).await;
    }
    let v = c.finish().await;
    assert!(
        v.iter().any(|h| h.client == 2 && h.won >= killed),
        "the third sidecar never took over: {v:#?}"
    );
}

/// SIGTERM of the holder's sidecar: its Hold streams end with LOST_LEASE
/// `sidecar_leaving` before anyone else is told WON.
async fn sigterm(backend: &str) {
    let mut lab = Lab::start(backend, 3).await;
    let c = Clients::start(&lab, &job("term")).await;
    // Waiting for the exit blocks: keep the runtime's clients going meanwhile.
    let status = tokio::task::block_in_place(|| lab.nodes[0].sidecar.terminate());
    assert!(status.success());
    tokio::time::sleep(ms(EXPIRY)).await;
    let v = c.finish().await;
    let a = v.iter().find(|h| h.client == 0).expect("A held");
    assert_eq!(a.ended, Ended::Lost("sidecar_leaving".into()), "{v:#?}");
    assert!(
        v.iter().any(|h| h.client != 0),
        "nobody took over after the leave: {v:#?}"
    );
}

/// The store server restarts while A holds.
async fn store_restart(backend: &str, server: Server) {
    let _serial = restart::lock().await;
    let lab = Lab::start(backend, 3).await;
    let c = Clients::start(&lab, &job("restart")).await;
    tokio::task::block_in_place(|| server.stop());
    tokio::time::sleep(ms(2000)).await;
    tokio::task::block_in_place(|| server.start());
    // Quarantine (Redis forgot everything) and lapsed leases.
    let end = Instant::now() + ms(LEASE as u64 + 6000);
    while c.checker.holder().is_none() && Instant::now() < end {
        tokio::time::sleep(ms(20)).await;
    }
    let holder = c.checker.holder();
    let v = c.finish().await;
    assert!(holder.is_some(), "nobody held after the restart: {v:#?}");
}

macro_rules! case {
    ($case:ident, $backend:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $case() {
            let _turn = TURN.lock().await;
            if let Some(url) = $backend {
                if lab::available() {
                    super::$case(&url).await;
                }
            }
        }
    };
}

/// The faults every lease store gets.
macro_rules! faults {
    ($name:ident, $backend:expr) => {
        mod $name {
            use super::*;
            case!(mesh_cut, $backend);
            case!(asymmetric_cut, $backend);
            case!(pause, $backend);
            case!(kill, $backend);
            case!(two_down, $backend);
            case!(sigterm, $backend);
        }
    };
}

/// The faults of a store reached over the network: cut from it, restarted.
macro_rules! store_faults {
    ($name:ident, $backend:expr, $server:expr) => {
        mod $name {
            use super::*;
            case!(store_cut, $backend);
            case!(full_cut, $backend);

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn store_restart() {
                let _turn = TURN.lock().await;
                if let Some(url) = $backend {
                    if lab::available() {
                        super::store_restart(&url, $server).await;
                    }
                }
            }
        }
    };
}

fn sqlite() -> Option<String> {
    let dir = tempfile::tempdir().unwrap().keep();
    Some(format!("sqlite://{}", dir.join("shared.db").display()))
}

fn postgres() -> Option<String> {
    common::pg::available().then(|| common::pg::backend(&common::pg::prefix()))
}

/// Redis keeps nothing on disk here: a restart forgets every claim, and the
/// amnesia guard quarantines for `quarantine_ms` (≥ the lease).
fn redis_lease() -> Option<String> {
    common::redis::have_redis().then(|| {
        format!(
            "{}&quarantine_ms={}",
            common::redis::url("lease"),
            LEASE + 500
        )
    })
}

faults!(sqlite, sqlite());
faults!(postgres, postgres());
faults!(redis_lease, redis_lease());
// SQLite is a file on the sidecars' host: it cannot be cut off or restarted.
store_faults!(postgres_store, postgres(), Server::Postgres);
store_faults!(redis_lease_store, redis_lease(), Server::Redis);

/// A frozen client (SIGSTOP of `anarchon hold`): the sidecar's HTTP/2
/// keepalive pings go unanswered, the connection closes, and the lease ends,
/// within heartbeat + expiry/2 (+ slack); another claimer then wins. After
/// SIGCONT the frozen `hold` finds its deadline passed and stops its command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_client_loses_its_lock() {
    use anarchon::proto as pb;
    let _turn = TURN.lock().await;
    let root = tempfile::tempdir().unwrap();
    let backend = sqlite().unwrap();
    let s = common::process::Sidecar::start(
        &root.path().join("a"),
        &[
            "--backend",
            &backend,
            "--heartbeat-ms",
            &HB.to_string(),
            "--expiry-ms",
            &EXPIRY.to_string(),
        ],
    );
    let job = job("frozen");
    let marker = root.path().join("ran");
    let mut hold = std::process::Command::new(common::process::BIN)
        .args([
            "hold",
            &job,
            "--server",
            &s.addr.to_string(),
            "--lease-ms",
            "30000",
            "--",
            "sh",
            "-c",
        ])
        .arg(format!("touch {}; sleep 60", marker.display()))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let end = Instant::now() + Duration::from_secs(10);
    while !marker.exists() {
        assert!(Instant::now() < end, "hold never ran its command");
        tokio::time::sleep(ms(20)).await;
    }
    let pid = nix::unistd::Pid::from_raw(hold.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let frozen = Instant::now();
    let mut c = anarchon::proto::claims_client::ClaimsClient::connect(s.url())
        .await
        .unwrap();
    let won = c
        .claim(pb::ClaimRequest {
            job: job.clone(),
            slot_ms: 0,
            lease_ms: 30_000,
            wait_ms: 20_000,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let took = frozen.elapsed();
    assert_eq!(won.outcome, pb::Outcome::Won as i32, "{won:?}");
    let bound = ms(HB + EXPIRY / 2 + 1000);
    assert!(
        took <= bound,
        "the frozen client kept its lock {took:?} (bound {bound:?})"
    );
    println!("a frozen client lost its lock after {took:?}");
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    let status = hold.wait().unwrap();
    assert_eq!(status.code(), Some(4), "hold must exit 4 (lease lost)");
}

// ---- the long run -----------------------------------------------------------

/// One fault of the long run, on the holder's sidecar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// Cut from the mesh: both ways, one way, or (networked) from the store
    /// too; healed after 1–3 expiries.
    Partition,
    /// SIGSTOP for 0.5–2.5 expiries.
    Pause,
    /// SIGKILL, then a restart with the same data dir.
    Kill,
    /// Networked stores: the store server restarts, or the holder's
    /// sidecar is cut from it for lease + 2 expiries.
    Store,
}

#[derive(Default)]
struct Tally {
    faults: std::collections::BTreeMap<&'static str, u32>,
    kill_takeovers: Vec<Duration>,
}

fn pick<T: Copy>(v: &[T]) -> T {
    v[rand::random::<u32>() as usize % v.len()]
}

fn between(lo: u64, hi: u64) -> Duration {
    ms(lo + rand::random::<u64>() % (hi - lo + 1))
}

/// One fault on the current holder's sidecar, healed before it returns.
async fn inject(lab: &mut Lab, c: &Clients, nft: &Nft, fault: Fault, t: &mut Tally) {
    let Some(h) = c.checker.holder() else {
        tokio::time::sleep(ms(HB)).await;
        return;
    };
    let networked = lab.store_port().is_some();
    match fault {
        Fault::Partition => {
            let kind = pick(if networked {
                &["mesh", "oneway", "full"][..]
            } else {
                &["mesh", "oneway"][..]
            });
            *t.faults.entry(kind).or_default() += 1;
            match kind {
                "mesh" => lab.cut_from_mesh(nft, h),
                "oneway" => {
                    for o in 0..lab.nodes.len() {
                        if o != h {
                            nft.cut(lab.nodes[h].ip, lab.nodes[o].ip);
                        }
                    }
                }
                _ => {
                    lab.cut_from_mesh(nft, h);
                    lab.cut_from_store(nft, h);
                }
            }
            tokio::time::sleep(between(EXPIRY, 3 * EXPIRY)).await;
            nft.heal();
        }
        Fault::Pause => {
            *t.faults.entry("pause").or_default() += 1;
            lab.nodes[h].sidecar.pause();
            tokio::time::sleep(between(EXPIRY / 2, 5 * EXPIRY / 2)).await;
            lab.nodes[h].sidecar.resume();
        }
        Fault::Kill => {
            *t.faults.entry("kill").or_default() += 1;
            let killed = Instant::now();
            tokio::task::block_in_place(|| lab.nodes[h].sidecar.kill());
            let end = killed + ms(3 * EXPIRY);
            while !matches!(c.checker.holder(), Some(o) if o != h) && Instant::now() < end {
                tokio::time::sleep(ms(5)).await;
            }
            if matches!(c.checker.holder(), Some(o) if o != h) {
                t.kill_takeovers.push(killed.elapsed());
            }
            tokio::task::block_in_place(|| lab.nodes[h].sidecar.restart());
            lab.linked().await;
        }
        Fault::Store => {
            if rand::random::<bool>() {
                *t.faults.entry("store_cut").or_default() += 1;
                lab.cut_from_store(nft, h);
                tokio::time::sleep(ms(LEASE as u64 + 2 * EXPIRY)).await;
                nft.heal();
            } else {
                *t.faults.entry("store_restart").or_default() += 1;
                let server = if lab.backend.starts_with("postgres") {
                    Server::Postgres
                } else {
                    Server::Redis
                };
                tokio::task::block_in_place(|| server.stop());
                tokio::time::sleep(between(500, 3000)).await;
                tokio::task::block_in_place(|| server.start());
            }
        }
    }
    // Let the run settle with someone holding before the next fault.
    let end = Instant::now() + ms(LEASE as u64 + 4 * EXPIRY);
    while c.checker.holder().is_none() && Instant::now() < end {
        tokio::time::sleep(ms(20)).await;
    }
    tokio::time::sleep(ms(2 * HB)).await;
}

/// `scripts/soak.sh --faults partition,pause,kill,store --minutes M`: the
/// fault lab's long run, M minutes per lease store. Prints one `LAB_JSON`
/// line per store; fails on any overlapping holders.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the long run: scripts/soak.sh --faults … --minutes M"]
async fn lab_soak() {
    let _turn = TURN.lock().await;
    if !lab::available() {
        return;
    }
    let minutes: f64 = std::env::var("LAB_SOAK_MINUTES")
        .ok()
        .and_then(|m| m.parse().ok())
        .unwrap_or(1.0);
    let faults: Vec<Fault> = std::env::var("LAB_SOAK_FAULTS")
        .unwrap_or_else(|_| "partition,pause,kill,store".into())
        .split(',')
        .map(|f| match f.trim() {
            "partition" => Fault::Partition,
            "pause" => Fault::Pause,
            "kill" => Fault::Kill,
            "store" => Fault::Store,
            other => panic!("unknown fault {other:?} (partition, pause, kill, store)"),
        })
        .collect();
    let stores =
        std::env::var("LAB_SOAK_STORES").unwrap_or_else(|_| "sqlite,postgres,redis".into());
    for store in stores.split(',') {
        let backend = match store.trim() {
            "sqlite" => sqlite(),
            "postgres" => postgres(),
            "redis" => redis_lease(),
            other => panic!("unknown store {other:?} (sqlite, postgres, redis)"),
        };
        let Some(backend) = backend else {
            eprintln!("SKIPPED lab soak on {store}: not reachable");
            continue;
        };
        let _serial = restart::lock().await;
        let nft = Nft::new();
        let mut lab = Lab::start(&backend, 3).await;
        let c = Clients::start(&lab, &job("soak")).await;
        let usable: Vec<Fault> = faults
            .iter()
            .copied()
            .filter(|f| *f != Fault::Store || lab.store_port().is_some())
            .collect();
        let mut t = Tally::default();
        let started = Instant::now();
        let end = started + Duration::from_secs_f64(minutes * 60.0);
        while Instant::now() < end {
            inject(&mut lab, &c, &nft, pick(&usable), &mut t).await;
        }
        let v = c.finish().await;
        let takeovers = v
            .windows(2)
            .filter(|w| w[1].attempt > 1 && w[1].client != w[0].client)
            .count();
        let mut k = t.kill_takeovers.clone();
        k.sort();
        let q = |p: f64| {
            k.get(((k.len().max(1) - 1) as f64 * p).round() as usize)
                .map_or(0, |d| d.as_millis())
        };
        let n: u32 = t.faults.values().sum();
        println!(
            "LAB_JSON {}",
            serde_json::json!({
                "store": store, "minutes": minutes, "faults": n, "by_fault": t.faults,
                "holds": v.len(), "takeovers": takeovers, "overlapping_holders": 0,
                "kill_takeover_ms": {"n": k.len(), "p50": q(0.5), "p99": q(0.99)},
                "heartbeat_ms": HB, "expiry_ms": EXPIRY, "lease_ms": LEASE,
            })
        );
    }
}
