//! A broker restart in the middle of a run of claims: every answer is
//! `UNAVAILABLE` (or `LOST` with reason `unknown`) or correct, never a wrong
//! `WON`, and what was won before the restart is still won afterwards.
//!
//! These tests stop and start the machine's RabbitMQ and NATS servers, so
//! they run one at a time (a process-wide lock) and always leave the broker
//! running: a guard restarts it when it is dropped, even on panic.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anarchon::claim::*;
use anarchon::error::Error;
use anarchon::store::{self, DynStore, StoreOptions};
use common::brokers::{self, amqp_url, nats_url, prefix};
use common::restart::{self, Guard, Server};
use common::{holder, job, spec};

// --- the run of claims ----------------------------------------------------------

/// Every answer of the run, by slot.
#[derive(Default)]
struct Tally {
    wins: HashMap<i64, usize>,
    answers: usize,
    unavailable: usize,
    unknown: usize,
    /// Answers given after the broker was back.
    answered_after: usize,
}

fn record(
    tally: &Mutex<Tally>,
    back: &AtomicBool,
    slot: i64,
    res: anarchon::error::Result<ClaimAnswer>,
) {
    let mut t = tally.lock().unwrap();
    t.answers += 1;
    if back.load(Ordering::SeqCst) {
        t.answered_after += 1;
    }
    match res {
        Ok(a) if a.outcome == Outcome::Won => {
            *t.wins.entry(slot).or_default() += 1;
        }
        Ok(a) if a.outcome == Outcome::Lost => {
            if a.reason == Some("unknown") {
                t.unknown += 1;
            }
        }
        Ok(a) => panic!("unexpected answer {a:?}"),
        Err(Error::Unavailable(_)) => t.unavailable += 1,
        Err(e) => panic!("an outage must answer UNAVAILABLE, got {e:?}"),
    }
}

/// Two claimers (own stores, own connections) claim fresh slots and
/// re-claim slots won before the outage, until `stop`.
async fn claimers(
    stores: [DynStore; 2],
    j: Job,
    first: i64,
    won_before: Vec<i64>,
    tally: Arc<Mutex<Tally>>,
    back: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
) {
    let mut tasks = Vec::new();
    for (c, s) in stores.into_iter().enumerate() {
        let (j, tally, back, stop, won_before) = (
            j.clone(),
            tally.clone(),
            back.clone(),
            stop.clone(),
            won_before.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut i = 0i64;
            while !stop.load(Ordering::SeqCst) {
                // A fresh slot both claimers contend for, then an old one.
                for slot in [first + i, won_before[i as usize % won_before.len()]] {
                    let sp = spec(&j, slot, &holder(&format!("c{c}"), 1));
                    let res = s.claim(&sp, &DeadHolders::none()).await;
                    let unavailable = matches!(res, Err(Error::Unavailable(_)));
                    record(&tally, &back, slot, res);
                    if unavailable {
                        // What a client does: back off before retrying.
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
                i += 1;
                // A paced client, not a tight loop: every fresh slot is a
                // durable queue the restart has to recover.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

/// Wins `n` slots, runs claimers through `stop_broker`/`start_broker`, then
/// checks that no slot was won twice and that every slot won before or
/// during the run is still refused to a newcomer.
async fn outage(url: &str, server: Server) {
    let opts = StoreOptions::default();
    let open = || store::open(url, &opts);
    let s = open().await.unwrap();
    let j = job("outage");
    let base = host_now_ms();
    let mut before = Vec::new();
    for i in 0..20 {
        let sp = spec(&j, base + i, &holder("early", 1));
        assert_eq!(
            s.claim(&sp, &DeadHolders::none()).await.unwrap().outcome,
            Outcome::Won
        );
        before.push((base + i, sp));
    }
    let won_before: Vec<i64> = before.iter().map(|(slot, _)| *slot).collect();
    let tally = Arc::new(Mutex::new(Tally::default()));
    for slot in &won_before {
        tally.lock().unwrap().wins.insert(*slot, 1);
    }
    let (back, stop) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicBool::new(false)),
    );
    let run = tokio::spawn(claimers(
        [open().await.unwrap(), open().await.unwrap()],
        j.clone(),
        base + 1000,
        won_before.clone(),
        tally.clone(),
        back.clone(),
        stop.clone(),
    ));
    tokio::time::sleep(Duration::from_millis(500)).await;
    tokio::task::spawn_blocking(move || server.stop()).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    tokio::task::spawn_blocking(move || server.start()).await.unwrap();
    back.store(true, Ordering::SeqCst);
    // Run until the claimers have been answered for a while after the restart.
    let end = Instant::now() + Duration::from_secs(90);
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let t = tally.lock().unwrap();
        let recovered = t.answered_after >= 200;
        assert!(
            recovered || Instant::now() < end,
            "the store did not recover: {} answers after the restart",
            t.answered_after
        );
        if recovered {
            break;
        }
    }
    stop.store(true, Ordering::SeqCst);
    run.await.unwrap();

    let t = std::mem::take(&mut *tally.lock().unwrap());
    eprintln!(
        "outage on {url}: {} answers, {} unavailable, {} lost/unknown, {} after the restart, {} slots won",
        t.answers,
        t.unavailable,
        t.unknown,
        t.answered_after,
        t.wins.len()
    );
    assert!(
        t.unavailable + t.unknown > 0,
        "the outage was never seen: the test proves nothing"
    );
    let doubles: Vec<_> = t.wins.iter().filter(|(_, &n)| n > 1).collect();
    assert!(doubles.is_empty(), "slots won twice: {doubles:?}");
    let mut won: Vec<i64> = t.wins.keys().copied().collect();
    won.sort_unstable();
    // Everything won is still remembered after the restart.
    let fresh = open().await.unwrap();
    for slot in &won {
        let a = fresh
            .claim(&spec(&j, *slot, &holder("late", 1)), &DeadHolders::none())
            .await
            .unwrap();
        assert_eq!(a.outcome, Outcome::Lost, "slot {slot} forgotten: {a:?}");
    }
    assert!(
        won.len() > won_before.len(),
        "no slot was won during the run"
    );
    // What a resend answers after the restart is the backend's own rule.
    if fresh.info().backend == "nats" {
        for (_, sp) in &before {
            let a = fresh.claim(sp, &DeadHolders::none()).await.unwrap();
            assert_eq!(a.outcome, Outcome::Won, "a resend after the restart: {a:?}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rabbitmq_restart_mid_run() {
    let _one = restart::lock().await;
    if !brokers::rabbitmq_up() {
        return;
    }
    let _guard = Guard(Server::RabbitMq);
    // Few durable queues to recover makes a fast, reliable restart.
    brokers::sweep_test_queues().await;
    let url = amqp_url(&prefix(), "&slot_ttl_ms=90000&timeout_ms=2000");
    outage(&url, Server::RabbitMq).await;
    brokers::sweep_test_queues().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nats_restart_mid_run() {
    let _one = restart::lock().await;
    if !brokers::nats_up() {
        return;
    }
    let _guard = Guard(Server::Nats);
    brokers::sweep_old_test_streams().await;
    let url = nats_url(&prefix(), "&timeout_ms=1000");
    outage(&url, Server::Nats).await;
}
