//! Issue 20, churn: 2,000 short-lived runtimes come and go past one real
//! sidecar A. Each is an in-process fake (`common::fake_peer`) with a fresh
//! node key, as a new pod has: its own connection and `Sync` stream to A, a
//! hello with proof of key, a signed beat every heartbeat for a few
//! heartbeats, then the stream and connection dropped without a `LEFT` mark
//! (a SIGKILL). A's view stays within `max_runtimes`, every newcomer is
//! listed `ALIVE` while it lives, a kill is `EXPIRED` within the bounds, no
//! newcomer is refused, and after the forget time the view and `peers.json`
//! are empty again. A real `anarchon serve` newcomer, SIGKILLed, closes the
//! run. Heartbeat 200 ms, expiry 1,500 ms, forget 4,500 ms.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anarchon::mesh::Identity;
use anarchon::proto as pb;
use common::fake_peer::{live, FakeError, Life};
use common::mesh::{client, list, mesh_flags, mid_beat, record, refs, until, Events};
use common::process::{free_addr, Sidecar};
use futures::StreamExt;

const HB: u64 = 200;
const EXPIRY: u64 = 1500;
const FORGET: u64 = 4500;
const RUNTIMES: usize = 2000;
/// Fake runtimes alive at once.
const CONCURRENT: usize = 50;
/// Beats each fake sends, one heartbeat apart; it dies somewhere in the
/// heartbeat after the last one: it lives 3 to 4 heartbeats after its link.
const BEATS: u64 = 4;
/// A's view bound. A dead runtime is `ALIVE` at A for up to `expiry / 2`
/// after its last beat and not dead (`ALIVE` or `UNREACHABLE`) for a whole
/// expiry, so the entries that cannot be evicted are not the 50 live ones
/// but every runtime that arrived in the last life + expiry: at most about
/// 50 / 0.6 s × (0.8 s + 1.5 s) ≈ 190 (at the shortest life), of which at
/// most ≈ 130 `ALIVE`. The bound is above both, so that the flood rule (a
/// newcomer arriving while every entry is `ALIVE` is refused for a moment)
/// never applies and no dying runtime is evicted before it is `EXPIRED`;
/// it is far below what the churn wants to keep (everyone who died within
/// the forget time: 60/s × 6 s ≈ 360), so the view is full and evicts the
/// longest-dead entry at almost every newcomer. (At 64, measured: 460 of
/// the 2,000 newcomers were never listed, their marks refused as
/// `too_many_runtimes`, and all but 64 of the others were evicted while
/// still `ALIVE`/`UNREACHABLE` by the state A last published, so A's
/// watchers never heard that they died.)
const MAX_RUNTIMES: usize = 256;
/// Inbound links A serves before it only refers newcomers on (`2 ×
/// max_links`): above the live fakes, which cannot be referred (they link
/// with nobody else).
const MAX_LINKS: usize = 64;

/// Node → its first `EXPIRED` event: when it arrived here, and how old A
/// said the runtime's last beat was when A published it.
fn expired_all(ev: &Events) -> HashMap<String, (Instant, i64)> {
    let mut out = HashMap::new();
    for s in ev.lock().unwrap().iter() {
        if s.kind == pb::PeerEventKind::Expired {
            out.entry(s.peer.node.clone())
                .or_insert((s.at, s.peer.beat_age_ms));
        }
    }
    out
}

fn expired_at(ev: &Events, node: &str) -> Option<Instant> {
    ev.lock()
        .unwrap()
        .iter()
        .find(|s| s.kind == pb::PeerEventKind::Expired && s.peer.node == node)
        .map(|s| s.at)
}

/// What the sampler saw of A's view.
#[derive(Default)]
struct Sampled {
    samples: u64,
    max_view: usize,
    max_alive: usize,
    /// Node → when a `ListPeers` answer listing it `ALIVE` first arrived.
    first_alive: HashMap<String, Instant>,
}

/// Lists A's view every 10 ms until `stop`.
fn sample(addr: std::net::SocketAddr, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<Sampled> {
    tokio::spawn(async move {
        let mut c = client(addr).await;
        let mut s = Sampled::default();
        let mut every = tokio::time::interval(Duration::from_millis(10));
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while !stop.load(Ordering::SeqCst) {
            every.tick().await;
            let l = c
                .list_peers(pb::ListPeersRequest {})
                .await
                .unwrap()
                .into_inner();
            let got = Instant::now();
            s.samples += 1;
            s.max_view = s.max_view.max(l.peers.len());
            let mut alive = 0;
            for p in &l.peers {
                if p.state == pb::PeerState::Alive as i32 {
                    alive += 1;
                    s.first_alive.entry(p.node.clone()).or_insert(got);
                }
            }
            s.max_alive = s.max_alive.max(alive);
        }
        s
    })
}

/// `anarchon_mesh_refused_total{reason="…"}` on A's admin `/metrics`.
async fn refused_total(admin: std::net::SocketAddr, reason: &str) -> u64 {
    let metrics = common::http_get(admin, "/metrics", None).await;
    let prefix = format!("anarchon_mesh_refused_total{{reason=\"{reason}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str())?.trim().parse().ok())
        .unwrap_or(0)
}

fn ms(d: Duration) -> u64 {
    d.as_millis() as u64
}

/// The figure at quantile `q` of sorted `v`.
fn at(v: &[u64], q: f64) -> u64 {
    v[((v.len() - 1) as f64 * q).round() as usize]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_thousand_short_lived_runtimes_keep_the_view_bounded_and_are_each_listed_and_detected()
{
    let wall = Instant::now();
    let root = tempfile::tempdir().unwrap();
    let base = mesh_flags(
        root.path(),
        HB,
        EXPIRY,
        &format!("max_runtimes = {MAX_RUNTIMES}\nforget_ms = {FORGET}\nmax_links = {MAX_LINKS}\n"),
    );
    let a_dir = root.path().join("a");
    let a = Sidecar::start_at(&a_dir, free_addr(), &refs(&base));
    let a_node = list(a.addr).await.self_.unwrap().node;
    let (ev, watch_failed) = record(a.addr, true).await;
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = sample(a.addr, stop.clone());

    // The churn: RUNTIMES fakes, CONCURRENT at a time.
    let live_now = Arc::new(AtomicUsize::new(0));
    let max_live = Arc::new(AtomicUsize::new(0));
    let churn = Instant::now();
    let lives: Vec<(usize, Result<Life, FakeError>)> = futures::stream::iter(0..RUNTIMES)
        .map(|i| {
            let (a_addr, a_node) = (a.addr, a_node.clone());
            let (live_now, max_live) = (live_now.clone(), max_live.clone());
            tokio::spawn(async move {
                let id = Identity::ephemeral(1);
                // Its own address, where nothing listens (A may redial a
                // dead one: refused at once, as a dead pod's address is).
                let address = format!("127.1.{}.{}:1", i / 250, i % 250 + 1);
                // Where in the heartbeat after its last beat the kill lands.
                let tail = Duration::from_millis(rand::random::<u64>() % HB);
                let n = live_now.fetch_add(1, Ordering::SeqCst) + 1;
                max_live.fetch_max(n, Ordering::SeqCst);
                let hb = Duration::from_millis(HB);
                let life = live(a_addr, &a_node, &id, &address, hb, BEATS, tail).await;
                live_now.fetch_sub(1, Ordering::SeqCst);
                (i, life)
            })
        })
        .buffer_unordered(CONCURRENT)
        .map(|r| r.unwrap())
        .collect()
        .await;
    let churn_took = churn.elapsed();
    let failed: Vec<_> = lives
        .iter()
        .filter_map(|(i, l)| l.as_ref().err().map(|e| (*i, e)))
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {RUNTIMES} fake runtimes failed, e.g. {:?}",
        failed.len(),
        &failed[..failed.len().min(5)]
    );
    let lives: Vec<(usize, Life)> = lives.into_iter().map(|(i, l)| (i, l.unwrap())).collect();
    let max_live = max_live.load(Ordering::SeqCst);
    // peers.json holds the view, bounded too (written every 5 heartbeats).
    let file = a_dir.join("peers.json");
    let persisted = std::fs::read_to_string(&file).unwrap_or_default();
    let persisted =
        serde_json::from_str::<Vec<serde_json::Value>>(&persisted).map_or(0, |v| v.len());
    assert!(
        (1..=MAX_RUNTIMES).contains(&persisted),
        "peers.json held {persisted} runtimes after the churn"
    );

    // Every kill is told to A's watchers as EXPIRED: none vanishes from
    // the view unreported (evicted while still UNREACHABLE — which a view
    // too small for the churn does; see MAX_RUNTIMES).
    let last_drop = lives.iter().map(|(_, l)| l.dropped).max().unwrap();
    let all_told = until(Duration::from_millis(EXPIRY + 10 * HB), || async {
        let expired = expired_all(&ev);
        lives.iter().all(|(_, l)| expired.contains_key(&l.node))
    })
    .await;
    let expired = expired_all(&ev);
    let untold: Vec<usize> = lives
        .iter()
        .filter(|(_, l)| !expired.contains_key(&l.node))
        .map(|(i, _)| *i)
        .collect();
    assert!(
        all_told.is_some(),
        "{} of {RUNTIMES} kills never EXPIRED at A ({:?} after the last one): {:?}",
        untold.len(),
        last_drop.elapsed(),
        &untold[..untold.len().min(20)]
    );
    // Kill detection within the bounds, for every 50th fake and the last
    // one (every fake's figure is printed below).
    let mut sample_ms: Vec<u64> = lives
        .iter()
        .filter(|(i, _)| i % 50 == 0 || *i == RUNTIMES - 1)
        .map(|(_, l)| ms(expired[&l.node].0 - l.dropped))
        .collect();
    sample_ms.sort();
    let bounds = EXPIRY - HB..=EXPIRY + 2 * HB;
    let outside: Vec<_> = sample_ms.iter().filter(|d| !bounds.contains(d)).collect();
    assert!(
        outside.is_empty(),
        "detections outside {bounds:?} ms: {outside:?} (all: {sample_ms:?})"
    );
    // Every kill's detection, and where the time went, on A's clock: A
    // declares a runtime EXPIRED no earlier than one expiry after its last
    // beat rose there (the event's `beat_age_ms`), and publishes it that much
    // late (its quarter-heartbeat tick, and the CPU); the rest is the beat's
    // way in and the event's way out (from the fake's last send to A, from A
    // to this watcher).
    let (mut all_ms, mut late_at_a, mut transit) = (Vec::new(), Vec::new(), Vec::new());
    let mut early = Vec::new();
    for (i, l) in &lives {
        let (at, age) = expired[&l.node];
        all_ms.push(ms(at - l.dropped));
        if age < EXPIRY as i64 {
            early.push((*i, age));
            continue;
        }
        late_at_a.push(age as u64 - EXPIRY);
        transit.push(ms(at - l.last_beat).saturating_sub(age as u64));
    }
    assert!(
        early.is_empty(),
        "EXPIRED with a beat younger than the expiry: {early:?}"
    );
    all_ms.sort();
    late_at_a.sort();
    transit.sort();

    // No newcomer was refused: not because of the dead, not at all.
    assert_eq!(refused_total(a.admin, "too_many_runtimes").await, 0);
    let l = list(a.addr).await;
    assert!(l.refused.is_empty(), "{:?}", l.refused);

    // One real newcomer, SIGKILLed.
    let seed = a.addr.to_string();
    let with_seed = [refs(&base), vec!["--peer", seed.as_str()]].concat();
    let r_dir = root.path().join("real");
    let r_node = Identity::load_or_create(&r_dir).unwrap().node;
    let mut r = Sidecar::start(&r_dir, &with_seed);
    let listed = until(Duration::from_secs(10), || async {
        list(a.addr)
            .await
            .peers
            .iter()
            .any(|p| p.node == r_node && p.state == pb::PeerState::Alive as i32)
    })
    .await;
    assert!(
        listed.is_some(),
        "the real newcomer was never listed: {}",
        common::http_get(a.admin, "/api/v1/mesh/state", None).await
    );
    mid_beat(r.addr, Duration::from_millis(HB)).await;
    let killed = Instant::now();
    r.kill();
    let expired = until(Duration::from_millis(EXPIRY + 10 * HB), || async {
        expired_at(&ev, &r_node).is_some()
    })
    .await;
    assert!(
        expired.is_some(),
        "the real newcomer's kill was not detected"
    );
    let real_ms = ms(expired_at(&ev, &r_node).unwrap() - killed);
    assert!(bounds.contains(&real_ms), "real newcomer: {real_ms} ms");

    // Forgotten: the view, then peers.json (written every 5 heartbeats).
    let empty = until(Duration::from_millis(FORGET + EXPIRY + 10 * HB), || async {
        list(a.addr).await.peers.is_empty()
    })
    .await;
    let left = list(a.addr).await.peers.len();
    assert!(empty.is_some(), "{left} runtimes still in the view");
    let since = ms(empty.unwrap() - killed);
    assert!(since >= FORGET, "forgotten after only {since} ms");
    let shrunk = until(Duration::from_millis(10 * HB), || async {
        std::fs::read_to_string(&file).is_ok_and(|t| t.trim() == "[]")
    })
    .await;
    assert!(shrunk.is_some(), "{:?}", std::fs::read_to_string(&file));

    stop.store(true, Ordering::SeqCst);
    let s = sampler.await.unwrap();
    assert!(watch_failed.lock().unwrap().is_none(), "{watch_failed:?}");

    // The view stayed within its bound, and the churn filled it (so the
    // bound, not a quiet moment, is what held it).
    assert!(s.max_view <= MAX_RUNTIMES, "a view of {}", s.max_view);
    assert_eq!(
        s.max_view, MAX_RUNTIMES,
        "the churn never filled the view: the bound was not exercised"
    );
    // Every newcomer listed ALIVE while it lived (an answer that arrived
    // before it dropped its stream).
    let never: Vec<_> = lives
        .iter()
        .filter(|(_, l)| s.first_alive.get(&l.node).is_none_or(|t| *t > l.dropped))
        .map(|(i, _)| *i)
        .collect();
    assert!(
        never.is_empty(),
        "{} of {RUNTIMES} newcomers never listed ALIVE while they lived: {:?}",
        never.len(),
        &never[..never.len().min(20)]
    );
    let mut listed_ms: Vec<u64> = lives
        .iter()
        .map(|(_, l)| ms(s.first_alive[&l.node] - l.started))
        .collect();
    listed_ms.sort();

    eprintln!(
        "churn: {RUNTIMES} runtimes in {:.1} s ({CONCURRENT} at once, max {max_live}), \
         max view {} of {MAX_RUNTIMES} (max ALIVE {}), {} samples, peers.json \
         {persisted} after the churn; listed after hello \
         p50 {} / max {} ms; detection sample (n={}) min/p50/max {}/{}/{} ms, every kill \
         (n={}) min/p50/p99/max {}/{}/{}/{} ms, {} outside; every kill's lateness at A \
         p50/p99/max {}/{}/{} ms and transit p50/p99/max {}/{}/{} ms; real newcomer {real_ms} ms; \
         forgotten {since} ms after the last kill; wall {:.1} s",
        churn_took.as_secs_f64(),
        s.max_view,
        s.max_alive,
        s.samples,
        at(&listed_ms, 0.5),
        at(&listed_ms, 1.0),
        sample_ms.len(),
        at(&sample_ms, 0.0),
        at(&sample_ms, 0.5),
        at(&sample_ms, 1.0),
        all_ms.len(),
        at(&all_ms, 0.0),
        at(&all_ms, 0.5),
        at(&all_ms, 0.99),
        at(&all_ms, 1.0),
        all_ms.iter().filter(|d| !bounds.contains(d)).count(),
        at(&late_at_a, 0.5),
        at(&late_at_a, 0.99),
        at(&late_at_a, 1.0),
        at(&transit, 0.5),
        at(&transit, 0.99),
        at(&transit, 1.0),
        wall.elapsed().as_secs_f64(),
    );
}
