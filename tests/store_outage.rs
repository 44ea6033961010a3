//! Each store's server is stopped and started again, with this machine's own
//! commands, in the middle of a contest between claimers on two real
//! `anarchon serve` sidecars:
//!
//! * while the server is down, every answer is `UNAVAILABLE` (for a broker,
//!   also `LOST` with reason `unknown`: a publish whose confirm was lost);
//! * after it is back, the same sidecar processes (never restarted) answer
//!   correctly again, and slots are won again;
//! * no slot is ever won twice (a `WON` for the same slot and attempt), and
//!   every slot won before or during the run is refused to a newcomer after.
//!
//! The machine's Redis keeps nothing on disk, so its restart forgets every
//! claim: the `lease` store's memory record (docs/stores/redis.md,
//! "Restarts") answers `UNAVAILABLE` for `quarantine_ms`, then refuses the
//! forgotten slots. These tests restart shared servers, so they hold
//! `restart::lock()` and a guard that starts the server again, even on panic.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anarchon::claim::*;
use anarchon::proto as pb;
use anarchon::store::{self, StoreOptions};
use common::process::Sidecar;
use common::restart::{self, Guard, Server};
use common::{brokers, holder, job, pg, redis as r, spec};

/// Short leases, one attempt: a lapsed lease is never taken over, so any
/// second `WON` for a slot is a double win.
const LEASE_MS: i64 = 2_000;

/// What the claimers were told.
#[derive(Default)]
struct Tally {
    /// WON answers by (slot, attempt).
    wins: HashMap<(i64, u32), usize>,
    answers: usize,
    unavailable: usize,
    /// LOST with reason `unknown` (brokers: the confirm was lost).
    unknown: usize,
    /// LATE with reason `store_restarted` (Redis: a forgotten slot).
    forgotten: usize,
    /// Asked and answered while the server was down, and not UNAVAILABLE.
    wrong_while_down: Vec<String>,
    /// Answers other than UNAVAILABLE after the server was back.
    answered_after: usize,
    /// Slots won after the server was back.
    won_after: usize,
}

#[derive(Default)]
struct Phase {
    /// The server is stopped (set after `stop` returned, cleared before `start`).
    down: AtomicBool,
    /// `start` has returned.
    back: AtomicBool,
    stop: AtomicBool,
}

fn request(j: &Job, slot: i64) -> pb::ClaimRequest {
    pb::ClaimRequest {
        job: j.to_string(),
        slot_ms: slot,
        lease_ms: LEASE_MS,
        max_attempts: 1,
        ..Default::default()
    }
}

/// Slots are 50 ms apart: every claimer contends for the current one, which
/// never runs ahead of the clock (a slot claimed ahead of its time is
/// outside the Redis guard).
const SLOT_MS: i64 = 50;

/// Claims through `url` until `phase.stop`: the current slot, which every
/// claimer contends for, then a slot won before the outage.
async fn claimer(
    url: String,
    j: Job,
    won_before: Arc<Vec<i64>>,
    tally: Arc<Mutex<Tally>>,
    phase: Arc<Phase>,
) {
    let mut cl = pb::claims_client::ClaimsClient::connect(url).await.unwrap();
    let mut i = 0i64;
    while !phase.stop.load(Ordering::SeqCst) {
        let now = host_now_ms();
        for slot in [
            now - now % SLOT_MS,
            won_before[i as usize % won_before.len()],
        ] {
            let down_before = phase.down.load(Ordering::SeqCst);
            let res = cl.claim(request(&j, slot)).await;
            let down_after = phase.down.load(Ordering::SeqCst);
            let back = phase.back.load(Ordering::SeqCst);
            let unavailable = matches!(&res, Err(st) if st.code() == tonic::Code::Unavailable);
            {
                let mut t = tally.lock().unwrap();
                t.answers += 1;
                match &res {
                    Ok(a) => {
                        let a = a.get_ref();
                        if back {
                            t.answered_after += 1;
                        }
                        if a.outcome == pb::Outcome::Won as i32 {
                            *t.wins.entry((slot, a.attempt)).or_default() += 1;
                            if back {
                                t.won_after += 1;
                            }
                        } else if a.reason == "unknown" {
                            t.unknown += 1;
                        } else if a.reason == "store_restarted" {
                            t.forgotten += 1;
                        }
                    }
                    Err(_) if unavailable => t.unavailable += 1,
                    Err(st) => panic!("an outage must answer UNAVAILABLE, got {st:?}"),
                }
                let lost_unknown = matches!(&res, Ok(a) if a.get_ref().reason == "unknown");
                if down_before && down_after && !unavailable && !lost_unknown {
                    t.wrong_while_down.push(format!("slot {slot}: {res:?}"));
                }
            }
            if unavailable {
                // What a client does: back off before retrying.
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        i += 1;
        // A paced client, not a tight loop: every fresh slot of a broker is
        // a durable queue its restart has to recover.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Wins 20 slots, runs two claimers on each of two sidecars through a stop
/// and start of `server`, then checks the tally and asks a newcomer for
/// every slot won.
async fn outage(server: Server, url: &str) {
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let sidecars: Vec<Sidecar> = dirs
        .iter()
        // A 500 ms heartbeat allows the 2 s lease (the floor is 3 x heartbeat).
        .map(|d| Sidecar::start(d.path(), &["--backend", url, "--heartbeat-ms", "500"]))
        .collect();
    let pids: Vec<u32> = sidecars.iter().map(|s| s.pid()).collect();
    let j = job("outage");
    // Won before the claimers start: 20 slots in the past.
    let base = host_now_ms() - 10_000;
    let mut first = pb::claims_client::ClaimsClient::connect(sidecars[0].url())
        .await
        .unwrap();
    let tally = Arc::new(Mutex::new(Tally::default()));
    let mut won_before = Vec::new();
    let mut tokens = Vec::new();
    for i in 0..20 {
        let a = first
            .claim(request(&j, base + i))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(a.outcome, pb::Outcome::Won as i32, "{a:?}");
        tally.lock().unwrap().wins.insert((base + i, a.attempt), 1);
        won_before.push(base + i);
        tokens.push(a.token);
    }
    let won_before = Arc::new(won_before);
    let phase = Arc::new(Phase::default());
    let mut tasks = Vec::new();
    for sc in &sidecars {
        for _ in 0..2 {
            tasks.push(tokio::spawn(claimer(
                sc.url(),
                j.clone(),
                won_before.clone(),
                tally.clone(),
                phase.clone(),
            )));
        }
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    tokio::task::spawn_blocking(move || server.stop())
        .await
        .unwrap();
    phase.down.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(2)).await;
    phase.down.store(false, Ordering::SeqCst);
    tokio::task::spawn_blocking(move || server.start())
        .await
        .unwrap();
    phase.back.store(true, Ordering::SeqCst);
    // Run until the claimers have been answered, and have won, for a while
    // after the restart.
    let end = Instant::now() + Duration::from_secs(120);
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let t = tally.lock().unwrap();
        let recovered = t.answered_after >= 200 && t.won_after >= 20;
        assert!(
            recovered || Instant::now() < end,
            "{}: the sidecars did not recover: {} answers and {} wins after the restart",
            server.name(),
            t.answered_after,
            t.won_after
        );
        if recovered {
            break;
        }
    }
    phase.stop.store(true, Ordering::SeqCst);
    for t in tasks {
        t.await.unwrap();
    }

    let t = std::mem::take(&mut *tally.lock().unwrap());
    let doubles: Vec<_> = t.wins.iter().filter(|(_, &n)| n > 1).collect();
    eprintln!(
        "{} restart: {} answers, {} UNAVAILABLE, {} LOST unknown, {} LATE store_restarted, {} after the restart ({} won), {} slots won, {} double wins",
        server.name(),
        t.answers,
        t.unavailable,
        t.unknown,
        t.forgotten,
        t.answered_after,
        t.won_after,
        t.wins.len(),
        doubles.len()
    );
    assert!(
        t.unavailable + t.unknown > 0,
        "the outage was never seen: the test proves nothing"
    );
    assert!(
        t.wrong_while_down.is_empty(),
        "answers while {} was down: {:?}",
        server.name(),
        t.wrong_while_down
    );
    assert!(doubles.is_empty(), "slots won twice: {doubles:?}");
    // The sidecars were never restarted.
    for (sc, pid) in sidecars.iter().zip(pids) {
        assert_eq!(sc.pid(), pid);
        assert!(std::path::Path::new(&format!("/proc/{pid}")).exists());
    }
    // A newcomer is refused every slot won, before, during or after.
    let fresh = store::open(url, &StoreOptions::default()).await.unwrap();
    for (slot, _) in t.wins.keys() {
        let mut sp = spec(&j, *slot, &holder("late", 1));
        sp.max_attempts = 1;
        let a = fresh.claim(&sp, &DeadHolders::none()).await.unwrap();
        assert_ne!(
            a.outcome,
            Outcome::Won,
            "slot {slot} handed out again: {a:?}"
        );
    }
    // NATS keeps its messages on disk: a resend with the winner's token
    // still finds the claim after the restart.
    if server == Server::Nats {
        for (slot, token) in won_before.iter().zip(tokens) {
            let mut req = request(&j, *slot);
            req.token = token;
            let a = first.claim(req).await.unwrap().into_inner();
            assert_eq!(
                a.outcome,
                pb::Outcome::Won as i32,
                "a resend after the restart: {a:?}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_restart_mid_contest() {
    let _one = restart::lock().await;
    if !pg::available() {
        return;
    }
    let _guard = Guard(Server::Postgres);
    let prefix = pg::prefix();
    outage(Server::Postgres, &pg::backend(&prefix)).await;
    pg::drop_tables(&prefix).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_restart_mid_contest() {
    let _one = restart::lock().await;
    if !r::have_redis() {
        return;
    }
    let _guard = Guard(Server::Redis);
    // Longer than every lease the contest grants.
    let url = format!("{}&quarantine_ms=3000", r::url("lease"));
    outage(Server::Redis, &url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rabbitmq_restart_mid_contest() {
    let _one = restart::lock().await;
    if !brokers::rabbitmq_up() {
        return;
    }
    let _guard = Guard(Server::RabbitMq);
    // Few durable queues to recover makes a fast, reliable restart.
    brokers::sweep_test_queues().await;
    let url = brokers::amqp_url(&brokers::prefix(), "&slot_ttl_ms=90000&timeout_ms=2000");
    outage(Server::RabbitMq, &url).await;
    brokers::sweep_test_queues().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nats_restart_mid_contest() {
    let _one = restart::lock().await;
    if !brokers::nats_up() {
        return;
    }
    let _guard = Guard(Server::Nats);
    brokers::sweep_old_test_streams().await;
    let url = brokers::nats_url(&brokers::prefix(), "&timeout_ms=1000");
    outage(Server::Nats, &url).await;
}
