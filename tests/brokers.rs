//! The RabbitMQ and NATS JetStream stores against the real brokers
//! (RabbitMQ on 127.0.0.1:5672 guest/guest, NATS with JetStream on
//! 127.0.0.1:4222): one test per trap of SPEC §3.2 (their 3-process
//! contests are in tests/contest.rs). Every test uses a name prefix of its own.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use anarchon::claim::*;
use anarchon::error::{Error, FenceReason};
use anarchon::store::{self, DynStore, StoreOptions};
use common::brokers::{self, amqp_url, nats_url, prefix};
use common::{holder, job, spec};
use lapin::options::QueueDeclareOptions;
use lapin::types::{AMQPValue, FieldTable};

fn none() -> DeadHolders {
    DeadHolders::none()
}

async fn open(url: &str) -> DynStore {
    store::open(url, &StoreOptions::default()).await.unwrap()
}

/// `n` claimers, spread over `stores`, all claim one slot at once.
async fn concurrent_claims(stores: &[DynStore], j: &Job, slot: i64, n: usize) -> Vec<ClaimAnswer> {
    let start = Arc::new(tokio::sync::Barrier::new(n));
    let mut tasks = Vec::new();
    for i in 0..n {
        let s = stores[i % stores.len()].clone();
        let sp = spec(j, slot, &holder(&format!("n{i}"), 1));
        let start = start.clone();
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            s.claim(&sp, &DeadHolders::none()).await.unwrap()
        }));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

fn count(answers: &[ClaimAnswer], o: Outcome) -> usize {
    answers.iter().filter(|a| a.outcome == o).count()
}

/// 50 concurrent claimers, spread over 5 stores on `url` (so 5
/// connections), on one slot: exactly one `WON`, 49 `LOST` that name no
/// reason and see no token; repeated over several slots.
async fn fifty_claimers_over_five_connections(url: &str) {
    let mut stores = Vec::new();
    for _ in 0..5 {
        stores.push(open(url).await);
    }
    let j = job("fifty");
    let base = host_now_ms();
    for i in 0..5 {
        let answers = concurrent_claims(&stores, &j, base + i, 50).await;
        assert_eq!(count(&answers, Outcome::Won), 1, "{answers:?}");
        assert_eq!(count(&answers, Outcome::Lost), 49, "{answers:?}");
        assert!(answers
            .iter()
            .filter(|a| a.outcome == Outcome::Lost)
            .all(|a| a.reason.is_none() && a.token.is_none()));
    }
}

// --- configuration ------------------------------------------------------------

#[test]
fn config_refuses_a_memory_not_longer_than_max_late() {
    use serde_json::json;
    let load = |backend: &str, max_late: u64| {
        let flags = json!({"backend": backend, "max_late_ms": max_late});
        anarchon::Config::load(None, flags.as_object().cloned().unwrap())
    };
    for url in [
        "amqp://guest:guest@127.0.0.1:5672/%2f?slot_ttl_ms=60000",
        "nats://127.0.0.1:4222?duplicate_window_ms=60000",
        "amqp://guest:guest@127.0.0.1:5672/%2f?slot_ttl_ms=30000",
    ] {
        let e = load(url, 60_000).unwrap_err();
        assert_eq!(e.key, "backend", "{e}");
        let option = if url.starts_with("amqp") {
            "slot_ttl_ms"
        } else {
            "duplicate_window_ms"
        };
        assert!(
            e.message.contains(option) && e.message.contains("max_late_ms"),
            "{e}"
        );
    }
    load(
        "amqp://guest:guest@127.0.0.1:5672/%2f?slot_ttl_ms=60001",
        60_000,
    )
    .unwrap();
    load("nats://127.0.0.1:4222?duplicate_window_ms=60001", 60_000).unwrap();
    // The defaults are consistent with the default max_late.
    load("amqp://guest:guest@127.0.0.1:5672/%2f", 60_000).unwrap();
    load("nats://127.0.0.1:4222", 60_000).unwrap();
    let e = load("nats://127.0.0.1:4222?duplicate_windw_ms=90000", 60_000).unwrap_err();
    assert!(e.message.contains("duplicate_windw_ms"), "{e}");
}

// --- RabbitMQ -----------------------------------------------------------------

/// A channel of its own, on a connection of its own (the refused declares
/// below close their channel).
struct Amqp {
    _conn: lapin::Connection,
    ch: lapin::Channel,
}

async fn amqp() -> Amqp {
    let conn = lapin::Connection::connect(
        &format!("amqp://guest:guest@{}/%2f", brokers::AMQP_ADDR),
        lapin::ConnectionProperties::default(),
    )
    .await
    .unwrap();
    let ch = conn.create_channel().await.unwrap();
    Amqp { _conn: conn, ch }
}

fn args(queue_type: &str, ttl: i64) -> FieldTable {
    let mut a = FieldTable::default();
    a.insert(
        "x-queue-type".into(),
        AMQPValue::LongString(queue_type.into()),
    );
    a.insert("x-max-length".into(), AMQPValue::LongLongInt(1));
    a.insert(
        "x-overflow".into(),
        AMQPValue::LongString("reject-publish".into()),
    );
    a.insert("x-expires".into(), AMQPValue::LongLongInt(ttl));
    a
}

fn durable() -> QueueDeclareOptions {
    QueueDeclareOptions {
        durable: true,
        ..Default::default()
    }
}

/// The gate is exactly a durable classic queue with max-length 1,
/// reject-publish and x-expires = slot_ttl_ms, holding the one claim: a
/// redeclare with the same arguments is accepted, any other is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_gate_is_a_durable_classic_queue_holding_one_claim() {
    if !brokers::rabbitmq_up() {
        return;
    }
    let p = prefix();
    let s = open(&amqp_url(&p, "&slot_ttl_ms=90000")).await;
    let j = job("gate");
    let slot = host_now_ms();
    for n in ["a", "b", "c"] {
        s.claim(&spec(&j, slot, &holder(n, 1)), &none())
            .await
            .unwrap();
    }
    let queue = format!("{p}.{j}.slot.{slot}");
    let same = amqp()
        .await
        .ch
        .queue_declare(&queue, durable(), args("classic", 90_000))
        .await
        .expect("the gate has exactly the specified arguments");
    assert_eq!(same.message_count(), 1, "one claim, the first");
    assert_eq!(same.consumer_count(), 0, "nobody consumes a gate");
    let quorum = amqp()
        .await
        .ch
        .queue_declare(&queue, durable(), args("quorum", 90_000))
        .await
        .unwrap_err();
    assert!(
        quorum.to_string().contains("x-queue-type"),
        "not a classic queue? {quorum}"
    );
    let transient = amqp()
        .await
        .ch
        .queue_declare(
            &queue,
            QueueDeclareOptions::default(),
            args("classic", 90_000),
        )
        .await
        .unwrap_err();
    assert!(
        transient.to_string().contains("durable"),
        "not durable? {transient}"
    );
    let other_ttl = amqp()
        .await
        .ch
        .queue_declare(&queue, durable(), args("classic", 90_001))
        .await
        .unwrap_err();
    assert!(other_ttl.to_string().contains("x-expires"), "{other_ttl}");
}

/// 50 concurrent claimers (5 stores, so 5 connections) on one slot: exactly
/// one ack, 49 nacks; repeated over several slots.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn amqp_fifty_concurrent_publishers_get_exactly_one_ack() {
    if !brokers::rabbitmq_up() {
        return;
    }
    fifty_claimers_over_five_connections(&amqp_url(&prefix(), "&slot_ttl_ms=90000")).await;
}

/// LATE is decided on the sidecar's clock and declares no gate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_late_declares_nothing() {
    if !brokers::rabbitmq_up() {
        return;
    }
    let p = prefix();
    let s = open(&amqp_url(&p, "&slot_ttl_ms=90000")).await;
    let j = job("late");
    let slot = host_now_ms() - 61_000;
    let a = s
        .claim(&spec(&j, slot, &holder("a", 1)), &none())
        .await
        .unwrap();
    assert_eq!((a.outcome, a.reason), (Outcome::Late, Some("too_late")));
    let passive = QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    let e = amqp()
        .await
        .ch
        .queue_declare(
            &format!("{p}.{j}.slot.{slot}"),
            passive,
            FieldTable::default(),
        )
        .await
        .unwrap_err();
    assert!(
        e.to_string().contains("NOT_FOUND") || e.to_string().contains("no queue"),
        "{e}"
    );
}

/// Sidecars that disagree on slot_ttl_ms cannot share gates: the declare is
/// refused, which is a store error, never a win.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_mismatched_slot_ttl_is_an_error_not_a_win() {
    if !brokers::rabbitmq_up() {
        return;
    }
    let p = prefix();
    let a = open(&amqp_url(&p, "&slot_ttl_ms=90000")).await;
    let b = open(&amqp_url(&p, "&slot_ttl_ms=120000")).await;
    let j = job("mismatch");
    let slot = host_now_ms();
    let first = a
        .claim(&spec(&j, slot, &holder("a", 1)), &none())
        .await
        .unwrap();
    assert_eq!(first.outcome, Outcome::Won);
    match b.claim(&spec(&j, slot, &holder("b", 1)), &none()).await {
        Err(Error::Store(m)) => assert!(m.contains("slot_ttl_ms"), "{m}"),
        other => panic!("expected a store error, got {other:?}"),
    }
    // The refused channel is gone; the store still works.
    let next = b
        .claim(&spec(&j, slot + 1, &holder("b", 1)), &none())
        .await
        .unwrap();
    assert_eq!(next.outcome, Outcome::Won);
}

/// What a gate remembers is bounded by slot_ttl_ms: once the gate expired,
/// slot 0 (a lock never late) can be claimed again. This is the documented
/// memory, and why slot_ttl_ms must exceed max_late_ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_gate_expires_after_slot_ttl() {
    if !brokers::rabbitmq_up() {
        return;
    }
    let p = prefix();
    let s = open(&amqp_url(&p, "&slot_ttl_ms=1000")).await;
    let j = job("expire");
    let mut a = spec(&j, 0, &holder("a", 1));
    a.max_late_ms = 500;
    assert_eq!(s.claim(&a, &none()).await.unwrap().outcome, Outcome::Won);
    let mut b = spec(&j, 0, &holder("b", 1));
    b.max_late_ms = 500;
    assert_eq!(s.claim(&b, &none()).await.unwrap().outcome, Outcome::Lost);
    // Wait for the broker to delete the gate: x-expires counts from the last
    // use, and a look at the queue is a use, so look less often than 1 s.
    let queue = format!("{p}.{j}.slot.0");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        let passive = QueueDeclareOptions {
            passive: true,
            ..Default::default()
        };
        if amqp()
            .await
            .ch
            .queue_declare(&queue, passive, FieldTable::default())
            .await
            .is_err()
        {
            break;
        }
        assert!(Instant::now() < deadline, "the gate never expired");
    }
    let mut c = spec(&j, 0, &holder("c", 1));
    c.max_late_ms = 500;
    assert_eq!(s.claim(&c, &none()).await.unwrap().outcome, Outcome::Won);
}

/// The longest job and prefix still make a legal queue name (≤ 255 bytes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_longest_names_fit() {
    if !brokers::rabbitmq_up() {
        return;
    }
    let p = format!("{}{}", prefix(), "x".repeat(29 - prefix().len()));
    assert_eq!(p.len(), 29);
    let s = open(&amqp_url(&p, "&slot_ttl_ms=90000")).await;
    let j = Job::parse(&format!("{}.{}", job("long"), "y".repeat(200))[..200]).unwrap();
    let a = s
        .claim(&spec(&j, host_now_ms(), &holder("a", 1)), &none())
        .await
        .unwrap();
    assert_eq!(a.outcome, Outcome::Won);
    assert!(
        store::open(&amqp_url(&format!("{p}x"), ""), &StoreOptions::default())
            .await
            .is_err()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_history_says_it_keeps_none() {
    let Some(s) = brokers::rabbitmq("&slot_ttl_ms=90000").await else {
        return;
    };
    let j = job("hist");
    let sp = spec(&j, host_now_ms(), &holder("a", 1));
    assert_eq!(s.claim(&sp, &none()).await.unwrap().outcome, Outcome::Won);
    let rel = ReleaseSpec {
        job: j.clone(),
        slot_ms: sp.slot_ms,
        token: sp.token.clone(),
        result: ReleaseResult::Succeeded,
    };
    s.release(&rel, &none()).await.unwrap();
    let h = s.history(&j, 10, None).await.unwrap();
    assert!(h.runs.is_empty() && !h.complete);
    assert!(h.note.unwrap().contains("no history"));
    assert!(!s.info().leases && !s.info().full_history);
    assert!(s.info().retention.contains("slot_ttl_ms"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn amqp_unreachable_broker_is_unavailable() {
    let e = store::open(
        "amqp://guest:guest@127.0.0.1:1/%2f?timeout_ms=1000",
        &StoreOptions::default(),
    )
    .await
    .err()
    .unwrap();
    assert!(matches!(e, Error::Unavailable(_)), "{e:?}");
    assert!(
        !e.to_string().contains("guest:guest"),
        "password leaked: {e}"
    );
}

// --- NATS JetStream -------------------------------------------------------------

async fn js() -> async_nats::jetstream::Context {
    async_nats::jetstream::new(async_nats::connect(brokers::NATS_ADDR).await.unwrap())
}

/// The stream is created as specified, read back from the server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_stream_is_created_with_the_window_and_a_longer_max_age() {
    if !brokers::nats_up() {
        return;
    }
    let p = prefix();
    let _s = open(&nats_url(&p, "&duplicate_window_ms=120000")).await;
    let js = js().await;
    let mut stream = js.get_stream(p.to_ascii_uppercase()).await.unwrap();
    let c = &stream.info().await.unwrap().config;
    assert_eq!(c.duplicate_window, Duration::from_millis(120_000));
    assert!(c.max_age >= c.duplicate_window, "{:?}", c.max_age);
    assert_eq!(c.storage, async_nats::jetstream::stream::StorageType::File);
    let mut subjects = c.subjects.clone();
    subjects.sort();
    assert_eq!(
        subjects,
        vec![format!("{p}.claims.>"), format!("{p}.results.>")]
    );
    // A second store on the same stream accepts it as is.
    let _again = open(&nats_url(&p, "&duplicate_window_ms=120000")).await;
}

/// An existing stream that would forget claims sooner than the window, or
/// lose them on restart, is refused at start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_refuses_a_stream_that_would_forget() {
    use async_nats::jetstream::stream::{Config, StorageType};
    if !brokers::nats_up() {
        return;
    }
    brokers::sweep_old_test_streams().await;
    let js = js().await;
    for (i, cfg) in [
        Config {
            duplicate_window: Duration::from_secs(60),
            max_age: Duration::from_secs(3600),
            storage: StorageType::File,
            ..Default::default()
        },
        Config {
            duplicate_window: Duration::from_secs(600),
            max_age: Duration::from_secs(3600),
            storage: StorageType::Memory,
            ..Default::default()
        },
    ]
    .into_iter()
    .enumerate()
    {
        let p = prefix();
        js.create_stream(Config {
            name: p.to_ascii_uppercase(),
            subjects: vec![format!("{p}.claims.>"), format!("{p}.results.>")],
            ..cfg
        })
        .await
        .unwrap();
        let e = store::open(
            &nats_url(&p, "&duplicate_window_ms=120000"),
            &StoreOptions::default(),
        )
        .await
        .err()
        .unwrap();
        assert!(matches!(e, Error::Store(_)), "case {i}: {e:?}");
        let _ = js.delete_stream(p.to_ascii_uppercase()).await;
    }
}

/// Jobs with dots are subjects under `>`: `a.b.c`, `b.c` and `c` are three
/// jobs, each with its own claim and history; dots that would make an empty
/// subject token are encoded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_jobs_with_dots() {
    if !brokers::nats_up() {
        return;
    }
    brokers::sweep_old_test_streams().await;
    let p = prefix();
    let s = open(&nats_url(&p, "")).await;
    let tag = job("dots");
    let names = [
        format!("{tag}.b.c"),
        format!("{tag}.c"),
        format!("c.{tag}"),
        format!(".{tag}"),
        format!("{tag}."),
        format!("{tag}..c"),
    ];
    let slot = host_now_ms();
    for n in &names {
        let j = Job::parse(n).unwrap();
        let a = s
            .claim(&spec(&j, slot, &holder("a", 1)), &none())
            .await
            .unwrap();
        assert_eq!(a.outcome, Outcome::Won, "{n}");
        let b = s
            .claim(&spec(&j, slot, &holder("b", 1)), &none())
            .await
            .unwrap();
        assert_eq!(b.outcome, Outcome::Lost, "{n}");
    }
    for n in &names {
        let h = s.history(&Job::parse(n).unwrap(), 10, None).await.unwrap();
        assert_eq!(h.runs.len(), 1, "{n}: {:?}", h.runs);
        assert_eq!(h.runs[0].holder, holder("a", 1));
    }
    // The plain dotted job is stored under its own subject.
    let stream = js().await.get_stream(p.to_ascii_uppercase()).await.unwrap();
    let m = stream
        .get_last_raw_message_by_subject(&format!("{p}.claims.{tag}.b.c"))
        .await
        .unwrap();
    assert_eq!(
        m.headers
            .get(async_nats::header::NATS_MESSAGE_ID)
            .map(|v| v.as_str().to_owned()),
        Some(format!("{tag}.b.c:{slot}")),
        "{:?}",
        m.headers
    );
}

/// A resend of the same token is WON again with the same fencing; another
/// token is LOST and is told who holds the slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_resend_is_won_again() {
    let Some(s) = brokers::nats("").await else {
        return;
    };
    let j = job("resend");
    let sp = spec(&j, host_now_ms(), &holder("a", 1));
    let first = s.claim(&sp, &none()).await.unwrap();
    assert_eq!(first.outcome, Outcome::Won);
    let again = s.claim(&sp, &none()).await.unwrap();
    assert_eq!(
        (again.outcome, again.fencing, again.token.as_ref()),
        (Outcome::Won, first.fencing, Some(&sp.token))
    );
    let other = s
        .claim(&spec(&j, sp.slot_ms, &holder("b", 1)), &none())
        .await
        .unwrap();
    assert_eq!(other.outcome, Outcome::Lost);
    assert_eq!(other.holder, Some(holder("a", 1)));
    assert!(other.token.is_none());
    // Fencing is the stream sequence: it rises with every stored claim.
    let later = s
        .claim(&spec(&j, sp.slot_ms + 1, &holder("b", 1)), &none())
        .await
        .unwrap();
    assert!(later.fencing > first.fencing);
}

/// 50 concurrent claimers over 5 connections on one slot: one winner.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nats_fifty_concurrent_claimers_one_winner() {
    if !brokers::nats_up() {
        return;
    }
    brokers::sweep_old_test_streams().await;
    fifty_claimers_over_five_connections(&nats_url(&prefix(), "")).await;
}

/// Release checks the token against the stored claim and records the result
/// once; History reads claims and results back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_release_records_the_result() {
    let Some(s) = brokers::nats("").await else {
        return;
    };
    let j = job("release");
    let base = host_now_ms() - 10_000;
    let mut specs = Vec::new();
    for i in 0..3 {
        let sp = spec(&j, base + i * 1000, &holder("a", 1));
        assert_eq!(s.claim(&sp, &none()).await.unwrap().outcome, Outcome::Won);
        specs.push(sp);
    }
    let rel = |sp: &ClaimSpec, token: &Token, result| ReleaseSpec {
        job: j.clone(),
        slot_ms: sp.slot_ms,
        token: token.clone(),
        result,
    };
    // The oldest slot: not the job's newest claim, so it is looked up by scan.
    let old = &specs[0];
    assert!(matches!(
        s.release(
            &rel(old, &Token::generate(), ReleaseResult::Succeeded),
            &none()
        )
        .await,
        // A once backend has no takeovers: a stranger's token never held it.
        Err(Error::Fenced(FenceReason::NotHolder))
    ));
    s.release(&rel(old, &old.token, ReleaseResult::Succeeded), &none())
        .await
        .unwrap();
    s.release(&rel(old, &old.token, ReleaseResult::Succeeded), &none())
        .await
        .unwrap();
    // The newest slot fails.
    let new = &specs[2];
    s.release(&rel(new, &new.token, ReleaseResult::Failed), &none())
        .await
        .unwrap();
    // The middle slot's holder restarted: its release is fenced.
    let mid = &specs[1];
    let mut restarted = none();
    restarted.set_current("a", 2);
    assert!(matches!(
        s.release(&rel(mid, &mid.token, ReleaseResult::Succeeded), &restarted)
            .await,
        Err(Error::Fenced(FenceReason::HolderDead))
    ));
    // But a release already recorded stays fine (idempotent).
    s.release(&rel(old, &old.token, ReleaseResult::Succeeded), &restarted)
        .await
        .unwrap();
    // No such claim.
    let missing = spec(&j, base + 5000, &holder("a", 1));
    assert!(matches!(
        s.release(
            &rel(&missing, &missing.token, ReleaseResult::Succeeded),
            &none()
        )
        .await,
        Err(Error::NotFound(_))
    ));
    let h = s.history(&j, 10, None).await.unwrap();
    let states: Vec<(i64, RunState)> = h.runs.iter().map(|r| (r.slot_ms, r.state)).collect();
    assert_eq!(
        states,
        vec![
            (base + 2000, RunState::Failed),
            (base + 1000, RunState::Claimed),
            (base, RunState::Succeeded),
        ]
    );
    assert!(h.runs.iter().all(|r| r.attempt == 1 && r.fencing > 0));
    assert!(h.runs[2].finished_at_ms >= h.runs[2].claimed_at_ms);
    assert!(h.note.is_some());
    // A claim after the release is still LOST: a slot is won once.
    let after = s
        .claim(&spec(&j, old.slot_ms, &holder("b", 1)), &none())
        .await
        .unwrap();
    assert_eq!(after.outcome, Outcome::Lost);
}

/// LATE writes nothing to the stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_late_publishes_nothing() {
    if !brokers::nats_up() {
        return;
    }
    brokers::sweep_old_test_streams().await;
    let p = prefix();
    let s = open(&nats_url(&p, "")).await;
    let j = job("late");
    let a = s
        .claim(&spec(&j, host_now_ms() - 61_000, &holder("a", 1)), &none())
        .await
        .unwrap();
    assert_eq!((a.outcome, a.reason), (Outcome::Late, Some("too_late")));
    let mut stream = js().await.get_stream(p.to_ascii_uppercase()).await.unwrap();
    assert_eq!(stream.info().await.unwrap().state.messages, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_unreachable_server_is_unavailable() {
    let e = store::open(
        "nats://127.0.0.1:1?timeout_ms=1000",
        &StoreOptions::default(),
    )
    .await
    .err()
    .unwrap();
    assert!(matches!(e, Error::Unavailable(_)), "{e:?}");
}
