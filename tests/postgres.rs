//! PostgreSQL-specific tests, against the real server at 127.0.0.1:5432
//! (the conformance suite runs on it from `tests/conformance.rs`, its
//! multi-process contest from `tests/contest.rs`): the scope of the job lock, concurrent start-up
//! against a fresh prefix, retention pruning, and connections killed in the
//! middle of a run of claims.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anarchon::claim::*;
use anarchon::proto as pb;
use anarchon::proto::claims_client::ClaimsClient;
use anarchon::store::{self, DynStore, Store, StoreOptions};
use common::pg;
use common::process::Sidecar;
use common::{holder, job, seed, spec};
use sqlx::Row;

/// Polls until a backend of `application_name` waits for a lock.
async fn wait_until_blocked(admin: &sqlx::PgPool, application_name: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity
             WHERE application_name = $1 AND wait_event_type = 'Lock'",
        )
        .bind(application_name)
        .fetch_one(admin)
        .await
        .unwrap();
        if waiting > 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no claim of {application_name} ever waited for the job lock"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Opens a transaction that takes `job`'s row lock exactly as a claim's
/// first statement does.
async fn lock_job_by_hand(
    admin: &sqlx::PgPool,
    prefix: &str,
    job: &Job,
) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut tx = admin.begin().await.unwrap();
    sqlx::query(&format!(
        "INSERT INTO {prefix}_jobs AS j (job, fence) VALUES ($1, 0)
         ON CONFLICT (job) DO UPDATE SET fence = j.fence"
    ))
    .bind(job.as_str())
    .execute(&mut *tx)
    .await
    .unwrap();
    tx
}

/// A claim on `job` that must complete without waiting (job A is locked by
/// hand) and win.
async fn claim_wins_without_waiting(store: &dyn Store, job: &Job, slot: i64) {
    let a = tokio::time::timeout(
        Duration::from_secs(10),
        store.claim(&spec(job, slot, &holder("b", 1)), &DeadHolders::none()),
    )
    .await
    .expect("a claim on job B must not wait for job A's lock")
    .unwrap();
    assert_eq!(a.outcome, Outcome::Won, "{a:?}");
}

/// A claim in a task of its own.
fn spawn_claim(
    store: &DynStore,
    sp: ClaimSpec,
) -> tokio::task::JoinHandle<anarchon::Result<ClaimAnswer>> {
    let store = store.clone();
    tokio::spawn(async move { store.claim(&sp, &DeadHolders::none()).await })
}

/// While a claim transaction on job A holds A's row lock (opened here by
/// hand, exactly as the store's first statement does, and writing the run as
/// a winner would), a claim on job B completes; a claim on A waits for the
/// lock and then sees the first claim's result.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn job_lock_scope() {
    if !pg::available() {
        return;
    }
    let prefix = pg::prefix();
    let store = store::open(&pg::backend(&prefix), &StoreOptions::default())
        .await
        .unwrap();
    let admin = pg::admin().await;
    let (a, b) = (job("lock-a"), job("lock-b"));
    let slot = host_now_ms();
    let first = holder("first", 1);
    let first_token = Token::generate();

    let mut tx = lock_job_by_hand(&admin, &prefix, &a).await;
    sqlx::query(&format!(
        "INSERT INTO {prefix}_runs (job, slot_ms, state, attempt, fencing, token, holder_node,
           holder_instance, lease_until_ms, claimed_at_ms, finished_at_ms)
         VALUES ($1, $2, 'RUNNING', 1, 1, $3, $4, $5, $6, $7, 0)"
    ))
    .bind(a.as_str())
    .bind(slot)
    .bind(first_token.as_str())
    .bind(&first.node)
    .bind(first.instance as i64)
    .bind(slot + 60_000)
    .bind(slot)
    .execute(&mut *tx)
    .await
    .unwrap();

    // Another job is not behind A's lock.
    claim_wins_without_waiting(&*store, &b, slot).await;

    // The same job is.
    let waiter = spawn_claim(&store, spec(&a, slot, &holder("second", 1)));
    wait_until_blocked(&admin, &pg::application_name(&prefix)).await;
    assert!(
        !waiter.is_finished(),
        "the claim on A must wait for A's lock"
    );
    tx.commit().await.unwrap();
    let seen = tokio::time::timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the claim on A must finish once the lock is released")
        .unwrap()
        .unwrap();
    assert_eq!(seen.outcome, Outcome::Running, "{seen:?}");
    assert_eq!(seen.holder, Some(first));
    assert_eq!(seen.attempt, 1);
    assert!(seen.token.is_none());
    pg::drop_tables(&prefix).await;
}

/// A claim cancelled while it waits for a job's lock (its client's deadline
/// passed) must not hand that wait to the next request: with one
/// connection, a claim on another job still completes at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancelled_claim_leaves_no_wait_behind() {
    if !pg::available() {
        return;
    }
    let prefix = pg::prefix();
    let url = format!("{}&max_connections=1", pg::backend(&prefix));
    let store = store::open(&url, &StoreOptions::default()).await.unwrap();
    let admin = pg::admin().await;
    let (a, b) = (job("cancel-a"), job("cancel-b"));
    let slot = host_now_ms();

    let tx = lock_job_by_hand(&admin, &prefix, &a).await;
    let waiter = spawn_claim(&store, spec(&a, slot, &holder("a", 1)));
    wait_until_blocked(&admin, &pg::application_name(&prefix)).await;
    waiter.abort();
    assert!(waiter.await.unwrap_err().is_cancelled());

    claim_wins_without_waiting(&*store, &b, slot).await;
    tx.rollback().await.unwrap();
    pg::drop_tables(&prefix).await;
}

/// Several stores opened at once against an empty prefix all succeed, the
/// migrations are applied once, and every store works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_start_on_a_fresh_prefix() {
    if !pg::available() {
        return;
    }
    let prefix = pg::prefix();
    let url = pg::backend(&prefix);
    let opts = StoreOptions::default();
    let opened = futures::future::join_all((0..8).map(|_| store::open(&url, &opts))).await;
    let stores: Vec<_> = opened
        .into_iter()
        .map(|r| r.expect("every concurrent start succeeds"))
        .collect();
    let admin = pg::admin().await;
    let versions: Vec<i32> = sqlx::query_scalar(&format!(
        "SELECT version FROM {prefix}_migrations ORDER BY version"
    ))
    .fetch_all(&admin)
    .await
    .unwrap();
    // Every migration file, once (the file names start with the version).
    let mut files: Vec<i32> = std::fs::read_dir("migrations/postgres")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.get(..4)?.parse().ok())
        .collect();
    files.sort();
    assert_eq!(versions, files);
    // One database and prefix, one store identity (made once by migration 4).
    let ids: std::collections::BTreeSet<&str> =
        stores.iter().map(|s| s.info().identity.as_str()).collect();
    assert_eq!(ids.len(), 1, "{ids:?}");
    assert!(ids.iter().all(|id| id.starts_with("postgres:")), "{ids:?}");
    let j = job("start");
    let slot = host_now_ms();
    for (i, s) in stores.iter().enumerate() {
        let a = s
            .claim(
                &spec(&j, slot + i as i64, &holder("n", 1)),
                &DeadHolders::none(),
            )
            .await
            .unwrap();
        assert_eq!(a.outcome, Outcome::Won);
        assert_eq!(a.fencing, i as u64 + 1, "fencing rises per job");
    }
    // Opening again on a migrated prefix changes nothing.
    drop(store::open(&url, &opts).await.unwrap());
    pg::drop_tables(&prefix).await;
}

/// Pruning works in batches, and keeps runs whose slot is not yet older
/// than the cutoff (claimed long before their time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prune_in_batches_keeps_future_slots() {
    if !pg::available() {
        return;
    }
    let prefix = pg::prefix();
    // Slots up to two days ahead (beyond the default max_future of one day).
    let opts = StoreOptions {
        max_future: std::time::Duration::from_secs(3 * 86_400),
        ..StoreOptions::default()
    };
    let s = store::open(&pg::backend(&prefix), &opts).await.unwrap();
    let j = job("prune");
    let now = host_now_ms();
    let day = 86_400_000;
    let slots = [now - 3, now - 2, now - 1, now + day, now + 2 * day];
    for slot in slots {
        let sp = spec(&j, slot, &holder("a", 1));
        assert_eq!(
            s.claim(&sp, &DeadHolders::none()).await.unwrap().outcome,
            Outcome::Won
        );
        let rel = ReleaseSpec {
            job: j.clone(),
            slot_ms: slot,
            token: sp.token.clone(),
            result: ReleaseResult::Succeeded,
        };
        s.release(&rel, &DeadHolders::none()).await.unwrap();
    }
    let cutoff = now + 60_000;
    assert_eq!(s.leases().unwrap().prune(cutoff, 2).await.unwrap(), 2);
    assert_eq!(s.leases().unwrap().prune(cutoff, 2).await.unwrap(), 1);
    assert_eq!(s.leases().unwrap().prune(cutoff, 2).await.unwrap(), 0);
    let left: Vec<i64> = s
        .history(&j, 10, None)
        .await
        .unwrap()
        .runs
        .iter()
        .map(|r| r.slot_ms)
        .collect();
    assert_eq!(left, vec![now + 2 * day, now + day]);
    pg::drop_tables(&prefix).await;
}

/// Writes `run` for `job` as it would be stored.
async fn put_run(admin: &sqlx::PgPool, prefix: &str, job: &Job, r: &RunRow) {
    sqlx::query(&format!(
        "INSERT INTO {prefix}_runs (job, slot_ms, state, attempt, fencing, token, holder_node,
           holder_instance, lease_until_ms, claimed_at_ms, finished_at_ms)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)"
    ))
    .bind(job.as_str())
    .bind(r.slot_ms)
    .bind(r.state.as_str())
    .bind(r.attempt as i64)
    .bind(r.fencing as i64)
    .bind(r.token.as_str())
    .bind(&r.holder.node)
    .bind(r.holder.instance as i64)
    .bind(r.lease_until_ms)
    .bind(r.claimed_at_ms)
    .bind(r.finished_at_ms)
    .execute(admin)
    .await
    .unwrap();
}

/// One random case of the decision table: a claim, the run of its slot
/// (missing, running with a current or lapsed lease, finished; the caller's
/// or another token), maybe another running run of the job, and a
/// dead-holder set (live, dead or restarted holders).
struct Case {
    spec: ClaimSpec,
    run: Option<RunRow>,
    others: Vec<RunRow>,
    dead: DeadHolders,
}

impl Case {
    fn random(rng: &mut rand::rngs::StdRng, j: &Job) -> Case {
        use rand::Rng;
        let hour = 3_600_000;
        let t = host_now_ms();
        let slot = match rng.gen_range(0..4) {
            0 => 0,
            1 => t - 1000,
            2 => t - 10 * 60_000,
            _ => t + hour,
        };
        let mut sp = spec(j, slot, &holder("me", 1));
        sp.max_late_ms = 60_000;
        sp.max_attempts = rng.gen_range(1..=3);
        if rng.gen_bool(0.5) {
            sp.overlap = Overlap::Skip;
        }
        let other_token = Token::generate();
        let row = |slot_ms: i64, node: &str, rng: &mut rand::rngs::StdRng| RunRow {
            slot_ms,
            state: [
                RunState::Running,
                RunState::Running,
                RunState::Succeeded,
                RunState::Failed,
                RunState::Interrupted,
            ][rng.gen_range(0..5)],
            attempt: rng.gen_range(1..=3),
            fencing: 3,
            token: if rng.gen_bool(0.3) {
                sp.token.clone()
            } else {
                other_token.clone()
            },
            holder: holder(node, 1),
            lease_until_ms: if rng.gen_bool(0.5) {
                t + hour
            } else {
                t - hour
            },
            claimed_at_ms: t - 2 * hour,
            finished_at_ms: 0,
        };
        let run = rng.gen_bool(0.7).then(|| row(slot, "h1", rng));
        let others: Vec<RunRow> = rng
            .gen_bool(0.5)
            .then(|| row(slot + 7, "h2", rng))
            .into_iter()
            .collect();
        let mut dead = DeadHolders::none();
        if rng.gen_bool(0.3) {
            dead.mark_dead(holder("h1", 1));
        }
        if rng.gen_bool(0.3) {
            dead.set_current("h2", 2);
        }
        if rng.gen_bool(0.3) {
            dead.set_current("h1", 1);
        }
        Case {
            spec: sp,
            run,
            others,
            dead,
        }
    }

    /// Writes the case's job (fencing counter 5) and runs.
    async fn store(&self, admin: &sqlx::PgPool, prefix: &str) {
        let j = &self.spec.job;
        sqlx::query(&format!(
            "INSERT INTO {prefix}_jobs (job, fence) VALUES ($1, 5)"
        ))
        .bind(j.as_str())
        .execute(admin)
        .await
        .unwrap();
        for r in self.run.iter().chain(&self.others) {
            put_run(admin, prefix, j, r).await;
        }
    }

    /// Checks an answer and the stored run against `claim::decide` (a win
    /// takes fencing number 6); returns the decision's name.
    async fn check(&self, s: &dyn Store, got: ClaimAnswer, what: &str) -> String {
        let (sp, run) = (&self.spec, self.run.as_ref());
        let now = got.now_ms;
        let d = decide(now, sp, &self.dead, run, &self.others);
        let written = d.next_row(sp, run, now, 6);
        let want = d.answer(sp, run, written.as_ref(), now);
        let case = format!("{what}: {d:?} run {run:?} others {:?}", self.others);
        assert_eq!(got, want, "{case}");
        let stored = s.history(&sp.job, 10, None).await.unwrap().runs;
        let stored = stored.into_iter().find(|r| r.slot_ms == sp.slot_ms);
        assert_eq!(stored, written.or(self.run.clone()), "{case}");
        let name = format!("{d:?}");
        name[..name.find('(').unwrap_or(name.len())].to_owned()
    }
}

/// A PostgreSQL store itself (not behind `DynStore`), for its group commit.
async fn pg_store(url: &str) -> store::PostgresStore {
    let store::Backend::Postgres(target) = store::Backend::parse(url).unwrap() else {
        panic!("{url} is not a PostgreSQL URL");
    };
    store::PostgresStore::open(&target, &StoreOptions::default())
        .await
        .unwrap()
}

/// Every claim path against `claim::decide` itself, on random states (see
/// [`Case`]): a claim alone (the `<prefix>_claim` function), the transaction
/// driven from Rust, and group commit (`<prefix>_claim_batch`, batches of
/// ten claims of different jobs). Also slot 0, late and
/// future slots, both overlap policies, attempts left or not. The answer and
/// the stored run must be exactly what the decision table says. Every other
/// case of the function and of group commit follows a call in which every
/// claim won, so it goes straight to the locked pass (`p_lock_first`); the
/// rest read before the lock. A batch that goes straight to the lock (ten
/// claims here, five or more needed) writes its new runs set-wise and
/// decides the rest one by one (migrations 0011 and 0012).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claim_paths_agree_with_the_decision_table() {
    if !pg::available() {
        return;
    }
    let (mut rng, _seed) = seed::rng("claim_paths_agree_with_the_decision_table");
    let prefix = pg::prefix();
    let admin = pg::admin().await;
    let mut seen: HashMap<String, usize> = HashMap::new();
    for (path, params) in [("function", ""), ("transaction", "&claim=transaction")] {
        let s = store::open(
            &format!("{}{params}", pg::backend(&prefix)),
            &StoreOptions::default(),
        )
        .await
        .unwrap();
        for n in 0..150 {
            let c = Case::random(&mut rng, &job(&format!("agree-{path}-{n}")));
            c.store(&admin, &prefix).await;
            if n % 2 == 1 {
                let win = spec(&job("agree-win"), host_now_ms(), &holder("me", 1));
                let won = s.claim(&win, &DeadHolders::none()).await.unwrap();
                assert_eq!(won.outcome, Outcome::Won, "{won:?}");
            }
            let got = s.claim(&c.spec, &c.dead).await.unwrap();
            let d = c.check(&*s, got, &format!("{path} case {n}")).await;
            *seen.entry(d).or_default() += 1;
        }
    }
    let s = pg_store(&pg::backend(&prefix)).await;
    for batch in 0..15 {
        let mut cases: Vec<Case> = (0..10)
            .map(|n| Case::random(&mut rng, &job(&format!("agree-batch-{batch}-{n}"))))
            .collect();
        // One dead-holder set per batch, as a sidecar's batches have.
        let dead = cases[0].dead.clone();
        for c in &mut cases {
            c.dead = dead.clone();
            c.store(&admin, &prefix).await;
        }
        if batch % 2 == 1 {
            let wins: Vec<ClaimSpec> = (0..3)
                .map(|_| spec(&job("agree-win"), host_now_ms(), &holder("me", 1)))
                .collect();
            for won in s.claim_batch(&wins, &DeadHolders::none()).await {
                assert_eq!(won.unwrap().outcome, Outcome::Won);
            }
        }
        let specs: Vec<ClaimSpec> = cases.iter().map(|c| c.spec.clone()).collect();
        let answers = s.claim_batch(&specs, &dead).await;
        for (n, (c, got)) in cases.iter().zip(answers).enumerate() {
            let d = c
                .check(&s, got.unwrap(), &format!("batch {batch} case {n}"))
                .await;
            *seen.entry(format!("batch {d}")).or_default() += 1;
        }
    }
    eprintln!("decisions checked: {seen:?}");
    pg::drop_tables(&prefix).await;
}

/// The job's fencing counter, as stored.
async fn fence_of(admin: &sqlx::PgPool, prefix: &str, j: &Job) -> i64 {
    sqlx::query_scalar(&format!("SELECT fence FROM {prefix}_jobs WHERE job = $1"))
        .bind(j.as_str())
        .fetch_one(admin)
        .await
        .unwrap()
}

/// While every claim of the last call won, the next call goes straight to
/// the locked pass (`p_lock_first`, migration 0008); one claim that did not
/// win turns the read before the lock back on. Seen from outside by the
/// job's fencing counter: a claim that loses under the lock has drawn (and
/// left unused) the job's next number, a claim answered by the read before
/// the lock has not touched the job. The same for a claim alone and for a
/// batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_of_wins_sends_the_next_claim_straight_to_the_lock() {
    if !pg::available() {
        return;
    }
    let prefix = pg::prefix();
    let s = pg_store(&pg::backend(&prefix)).await;
    let admin = pg::admin().await;
    let none = DeadHolders::none();
    let t = host_now_ms();
    let (me, other) = (holder("me", 1), holder("other", 1));

    // Alone (the store's first claim, nothing in flight).
    let a = job("lf-alone");
    let won = s.claim(&spec(&a, t, &me), &none).await.unwrap();
    assert_eq!((won.outcome, won.fencing), (Outcome::Won, 1), "{won:?}");
    let lost = s.claim(&spec(&a, t, &other), &none).await.unwrap();
    assert_eq!(lost.outcome, Outcome::Running, "{lost:?}");
    assert_eq!(
        fence_of(&admin, &prefix, &a).await,
        2,
        "decided under the lock"
    );
    let lost = s.claim(&spec(&a, t, &other), &none).await.unwrap();
    assert_eq!(lost.outcome, Outcome::Running, "{lost:?}");
    assert_eq!(
        fence_of(&admin, &prefix, &a).await,
        2,
        "answered before the lock"
    );
    let won = s.claim(&spec(&a, t + 1, &me), &none).await.unwrap();
    assert_eq!((won.outcome, won.fencing), (Outcome::Won, 3), "{won:?}");

    // In batches.
    let b = job("lf-batch");
    let wins = vec![spec(&b, t, &me), spec(&b, t + 1, &me)];
    let got: Vec<ClaimAnswer> = s
        .claim_batch(&wins, &none)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert_eq!(
        got.iter()
            .map(|a| (a.outcome, a.fencing))
            .collect::<Vec<_>>(),
        [(Outcome::Won, 1), (Outcome::Won, 2)]
    );
    let lose = vec![spec(&b, t, &other)];
    let got = s.claim_batch(&lose, &none).await;
    assert_eq!(
        got[0].as_ref().unwrap().outcome,
        Outcome::Running,
        "{got:?}"
    );
    assert_eq!(
        fence_of(&admin, &prefix, &b).await,
        3,
        "decided under the lock"
    );
    let got = s.claim_batch(&lose, &none).await;
    assert_eq!(
        got[0].as_ref().unwrap().outcome,
        Outcome::Running,
        "{got:?}"
    );
    assert_eq!(
        fence_of(&admin, &prefix, &b).await,
        3,
        "answered before the lock"
    );
    pg::drop_tables(&prefix).await;
}

/// Group commit (`<prefix>_claim_batch`), inside one batch: claims decided
/// earlier in the batch are seen by the later ones exactly as separate
/// transactions would see them (the same slot twice: one `WON`, then
/// `RUNNING` with its holder; two wins of one job take consecutive fencing
/// numbers; with overlap = SKIP a slot won earlier in the batch stops the
/// next slot); and a claim the database refuses (here a CHECK constraint
/// added by hand) fails alone, rolled back to its subtransaction, while the
/// rest of its batch is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn group_commit_decides_each_claim_on_what_came_before() {
    if !pg::available() {
        return;
    }
    let prefix = pg::prefix();
    let s = pg_store(&pg::backend(&prefix)).await;
    let admin = pg::admin().await;
    let none = DeadHolders::none();
    let t = host_now_ms();
    let (a, b, c) = (job("gc-a"), job("gc-b"), job("gc-c"));
    for j in [&a, &b, &c] {
        sqlx::query(&format!(
            "INSERT INTO {prefix}_jobs (job, fence) VALUES ($1, 0)"
        ))
        .bind(j.as_str())
        .execute(&admin)
        .await
        .unwrap();
    }

    let (me, other) = (holder("me", 1), holder("other", 1));
    let mut skip_later = spec(&b, t + 2, &me);
    skip_later.overlap = Overlap::Skip;
    let batch = vec![
        spec(&a, t, &me),
        spec(&a, t, &other),
        spec(&a, t + 1, &me),
        spec(&b, t + 1, &me),
        skip_later,
    ];
    let got: Vec<ClaimAnswer> = s
        .claim_batch(&batch, &none)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert_eq!(got[0].outcome, Outcome::Won, "{got:?}");
    assert_eq!(got[0].fencing, 1, "{got:?}");
    assert_eq!(got[1].outcome, Outcome::Running, "{got:?}");
    assert_eq!(got[1].holder, Some(me.clone()), "{got:?}");
    assert_eq!(got[2].outcome, Outcome::Won, "{got:?}");
    assert_eq!(got[2].fencing, got[0].fencing + 1, "{got:?}");
    assert_eq!(got[3].outcome, Outcome::Won, "{got:?}");
    assert_eq!(got[4].outcome, Outcome::Overlap, "{got:?}");
    assert_eq!(got[4].holder, Some(me.clone()), "{got:?}");
    assert_eq!(
        fence_of(&admin, &prefix, &a).await as u64,
        got[2].fencing,
        "the job's counter is the last number issued"
    );

    // A claim the database refuses fails alone.
    a_refused_claim_fails_alone(&s, &admin, &prefix, &[&a, &b, &c], t + 9, &me).await;
    pg::drop_tables(&prefix).await;
}

/// Makes the database refuse the second job's run at `slot` (a CHECK
/// constraint added by hand), claims `slot` of every job in one batch, and
/// checks that the refused claim fails alone: the others win and their runs
/// are written, the refused one's is not.
async fn a_refused_claim_fails_alone(
    s: &store::PostgresStore,
    admin: &sqlx::PgPool,
    prefix: &str,
    jobs: &[&Job],
    slot: i64,
    me: &Holder,
) {
    sqlx::query(&format!(
        "ALTER TABLE {prefix}_runs ADD CONSTRAINT refuse_b CHECK (job <> '{}' OR slot_ms <> {slot})",
        jobs[1]
    ))
    .execute(admin)
    .await
    .unwrap();
    let batch: Vec<ClaimSpec> = jobs.iter().map(|j| spec(j, slot, me)).collect();
    let got = s.claim_batch(&batch, &DeadHolders::none()).await;
    assert_eq!(got.len(), jobs.len());
    for (n, (j, g)) in jobs.iter().zip(&got).enumerate() {
        if n == 1 {
            assert!(
                matches!(g, Err(anarchon::Error::Store(m)) if m.contains("refuse_b")),
                "{got:?}"
            );
        } else {
            assert_eq!(g.as_ref().unwrap().outcome, Outcome::Won, "{got:?}");
        }
        let runs = s.history(j, 10, None).await.unwrap().runs;
        assert_eq!(runs.iter().any(|r| r.slot_ms == slot), n != 1, "{j}");
    }
}

/// A batch of five claims or more that goes straight to the lock, with no
/// job twice, writes its new runs set-wise (migrations 0011 and 0012: one
/// statement draws every job's number, one writes every run that would be
/// decided `insert`). Every batch below that should go set-wise has five
/// claims, the fewest that do; `e` and `f` only make up the number. The
/// claims it
/// cannot write that way (a run that exists, a late slot, an overlap check)
/// hand their number back and are decided one by one, so every answer and
/// every job's counter is what one call per claim gives: the numbers below
/// are those of `a_stream_of_wins_sends_the_next_claim_straight_to_the_lock`.
/// A batch with a job twice is decided one call per claim. A claim the
/// database refuses in the set-wise statement fails alone: the batch runs
/// again, one subtransaction per claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_new_slots_is_written_at_once_and_the_rest_one_by_one() {
    if !pg::available() {
        return;
    }
    let prefix = pg::prefix();
    let s = pg_store(&pg::backend(&prefix)).await;
    let admin = pg::admin().await;
    let none = DeadHolders::none();
    let t = host_now_ms();
    let (me, other) = (holder("me", 1), holder("other", 1));
    let (a, b, c, d) = (job("si-a"), job("si-b"), job("si-c"), job("si-d"));
    let (e, f) = (job("si-e"), job("si-f"));
    let outcomes = |got: &[anarchon::Result<ClaimAnswer>]| -> Vec<(Outcome, u64)> {
        got.iter()
            .map(|g| {
                let g = g.as_ref().unwrap();
                (g.outcome, g.fencing)
            })
            .collect()
    };

    // The store's first call reads before the lock; every claim wins, so
    // the second goes straight to it, set-wise.
    for (n, slot) in [t, t + 1].into_iter().enumerate() {
        let wins: Vec<ClaimSpec> = [&a, &b, &c, &e, &f].map(|j| spec(j, slot, &me)).into();
        let got = s.claim_batch(&wins, &none).await;
        assert_eq!(outcomes(&got), [(Outcome::Won, n as u64 + 1); 5]);
    }
    for j in [&a, &b, &c, &e, &f] {
        assert_eq!(fence_of(&admin, &prefix, j).await, 2, "{j}");
    }

    // Straight to the lock again: a new slot (written set-wise), a slot
    // held by another (its run exists), a late slot, and a first claim that
    // makes an overlap check.
    let mut late = spec(&c, t - 120_000, &other);
    late.max_late_ms = 1_000;
    let mut skip = spec(&d, t, &me);
    skip.overlap = Overlap::Skip;
    let batch = vec![
        spec(&a, t + 2, &me),
        spec(&b, t + 1, &other),
        late,
        skip,
        spec(&e, t + 2, &me),
    ];
    let got = s.claim_batch(&batch, &none).await;
    assert_eq!(
        outcomes(&got)
            .iter()
            .map(|&(o, f)| (o, if o == Outcome::Won { f } else { 0 }))
            .collect::<Vec<_>>(),
        [
            (Outcome::Won, 3),
            (Outcome::Running, 0),
            (Outcome::Late, 0),
            (Outcome::Won, 1),
            (Outcome::Won, 3)
        ]
    );
    assert_eq!(got[1].as_ref().unwrap().holder, Some(me.clone()));
    // Each claim decided under the lock drew exactly one number.
    for (j, want) in [(&a, 3), (&b, 3), (&c, 3), (&d, 1), (&e, 3)] {
        assert_eq!(fence_of(&admin, &prefix, j).await, want, "{j}");
    }
    let runs = s.history(&b, 10, None).await.unwrap().runs;
    let held = runs.iter().find(|r| r.slot_ms == t + 1).unwrap();
    assert_eq!((&held.holder, held.fencing), (&me, 2), "{runs:?}");

    // After a call in which every claim won: one job twice, decided one by
    // one (consecutive numbers, the second sees the first).
    let got = s.claim_batch(&[spec(&c, t + 3, &me)], &none).await;
    assert_eq!(outcomes(&got), [(Outcome::Won, 4)]);
    let twice = vec![
        spec(&a, t + 4, &me),
        spec(&a, t + 4, &other),
        spec(&a, t + 5, &me),
        spec(&b, t + 4, &me),
        spec(&e, t + 4, &me),
    ];
    let got = s.claim_batch(&twice, &none).await;
    assert_eq!(
        got.iter()
            .map(|g| g.as_ref().unwrap().outcome)
            .collect::<Vec<_>>(),
        [
            Outcome::Won,
            Outcome::Running,
            Outcome::Won,
            Outcome::Won,
            Outcome::Won
        ]
    );
    assert_eq!(got[0].as_ref().unwrap().fencing, 4);
    assert_eq!(got[2].as_ref().unwrap().fencing, 6, "{got:?}");

    // After a call in which every claim won: a claim the database refuses.
    let got = s.claim_batch(&[spec(&d, t + 8, &me)], &none).await;
    assert_eq!(outcomes(&got), [(Outcome::Won, 2)]);
    a_refused_claim_fails_alone(&s, &admin, &prefix, &[&a, &b, &c, &e, &f], t + 9, &me).await;
    pg::drop_tables(&prefix).await;
}

/// Migration 12 rewrites migration 11's batch function from the catalog,
/// changing only the size from which a batch goes set-wise. The live
/// function holds the new condition and not the old, and the migration run
/// again (the condition it replaces is gone) fails instead of changing
/// nothing in silence, leaving the function as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migration_twelve_changes_only_the_set_wise_condition_or_fails() {
    if !pg::available() {
        return;
    }
    let prefix = pg::prefix();
    let _s = pg_store(&pg::backend(&prefix)).await;
    let admin = pg::admin().await;
    let definition = || async {
        sqlx::query_scalar::<_, String>(&format!(
            "SELECT pg_get_functiondef(p.oid) FROM pg_proc p WHERE p.proname = '{prefix}_claim_batch_whole'"
        ))
        .fetch_one(&admin)
        .await
        .unwrap()
    };
    let live = definition().await;
    assert!(live.contains("IF p_lock_first AND v_n >= 5"), "{live}");
    assert!(!live.contains("v_n > 1"), "{live}");
    // The rest is migration 11's body, unchanged.
    let eleven = include_str!("../migrations/postgres/0011_claim_batch_set_insert.sql");
    let body = |def: &str| -> String {
        let start = def.find("DECLARE").unwrap();
        def[start..]
            .replace("v_n >= 5", "v_n > 1")
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
    };
    let eleven = eleven.replace("{prefix}", &prefix);
    assert!(
        body(&eleven).starts_with(body(&live).trim_end_matches(" $function$")),
        "the function differs from migration 11 beyond its condition"
    );
    let twelve = include_str!("../migrations/postgres/0012_claim_batch_set_wise_from_five.sql")
        .replace("{prefix}", &prefix);
    let again = sqlx::raw_sql(&twelve).execute(&admin).await;
    let err = again
        .expect_err("migration 12 run again must fail")
        .to_string();
    assert!(
        err.contains("does not hold the set-wise condition"),
        "{err}"
    );
    assert_eq!(definition().await, live);
    pg::drop_tables(&prefix).await;
}

/// Three stores (three sidecars' worth of connections) race batches of the
/// same new slots of eight jobs, each batch straight to the lock (a call in
/// which every claim won comes first), so each goes set-wise and meets the
/// others' rows: every slot has exactly one `WON`, every other claim of it
/// is `RUNNING` with the winner as holder, the stored run is the winner's,
/// and each job's winners hold rising fencing numbers.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn set_wise_batches_racing_for_the_same_slots_have_one_winner_each() {
    if !pg::available() {
        return;
    }
    let prefix = pg::prefix();
    let url = pg::backend(&prefix);
    let stores = Arc::new([
        pg_store(&url).await,
        pg_store(&url).await,
        pg_store(&url).await,
    ]);
    let none = DeadHolders::none();
    let jobs: Vec<Job> = (0..8).map(|n| job(&format!("race-{n}"))).collect();
    let warm = job("race-warm");
    let t = host_now_ms();
    let mut last_fence: HashMap<Job, u64> = HashMap::new();
    for round in 0..40i64 {
        let mut racers = Vec::new();
        for (k, s) in stores.iter().enumerate() {
            let me = holder(&format!("s{k}"), 1);
            let got = s
                .claim(&spec(&warm, t + round * 3 + k as i64, &me), &none)
                .await;
            assert_eq!(got.unwrap().outcome, Outcome::Won);
            let specs: Vec<ClaimSpec> = jobs.iter().map(|j| spec(j, t + round, &me)).collect();
            let stores = stores.clone();
            racers.push(tokio::spawn(async move {
                let got = stores[k].claim_batch(&specs, &DeadHolders::none()).await;
                (me, got)
            }));
        }
        let mut winners: HashMap<Job, (Holder, u64)> = HashMap::new();
        let mut answers = Vec::new();
        for r in racers {
            let (me, got) = r.await.unwrap();
            for (j, a) in jobs.iter().zip(got) {
                let a = a.unwrap();
                if a.outcome == Outcome::Won {
                    let again = winners.insert(j.clone(), (me.clone(), a.fencing));
                    assert!(again.is_none(), "round {round}: two winners of {j}");
                }
                answers.push((j.clone(), me.clone(), a));
            }
        }
        assert_eq!(
            winners.len(),
            jobs.len(),
            "round {round}: a slot without a winner"
        );
        for (j, me, a) in &answers {
            let (winner, _) = &winners[j];
            if me != winner {
                assert_eq!(a.outcome, Outcome::Running, "round {round} {j}: {a:?}");
                assert_eq!(a.holder.as_ref(), Some(winner), "round {round} {j}");
            }
        }
        for j in &jobs {
            let (winner, fencing) = &winners[j];
            let runs = stores[0].history(j, 1, None).await.unwrap().runs;
            assert_eq!(
                (&runs[0].holder, runs[0].fencing),
                (winner, *fencing),
                "{j}"
            );
            let before = last_fence.insert(j.clone(), *fencing).unwrap_or(0);
            assert!(*fencing > before, "{j}: fencing {fencing} after {before}");
        }
    }
    pg::drop_tables(&prefix).await;
}

/// One claim as a client that resends with the same token after
/// `UNAVAILABLE` (what the protocol tells clients to do).
#[derive(Debug, Default)]
struct Tally {
    won: Vec<(i64, String)>,
    running: Vec<(i64, String)>,
    unavailable: usize,
    other_errors: Vec<String>,
}

/// Kills the sidecar's PostgreSQL connections again and again while 12
/// gRPC clients claim 600 slots (4 claimers a slot). Every answer is
/// `UNAVAILABLE` or correct: a resend with the same token after
/// `UNAVAILABLE` ends with exactly one `WON` per slot, which is the token the
/// database holds, and nobody told `RUNNING` holds the run. Afterwards the
/// same sidecar, never restarted, answers again.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killed_connections_mid_run() {
    if !pg::available() {
        return;
    }
    let prefix = pg::prefix();
    let app = pg::application_name(&prefix);
    let dir = tempfile::tempdir().unwrap();
    let sidecar = Sidecar::start(dir.path(), &["--backend", &pg::backend(&prefix)]);
    let admin = pg::admin().await;
    let j = job("restart");
    let base = host_now_ms();
    let (slots, claimers, spread) = (600i64, 12usize, 3i64);
    // The gRPC port opens before the store is ready: one claim first, so
    // the kills hit claims and not the start-up (which would exit).
    let mut cl = ClaimsClient::connect(sidecar.url()).await.unwrap();
    let warm = cl
        .claim(pb::ClaimRequest {
            job: j.to_string(),
            slot_ms: base - 1,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(warm.into_inner().outcome, pb::Outcome::Won as i32);

    let done = Arc::new(AtomicBool::new(false));
    let killer = {
        let (admin, app, done) = (admin.clone(), app.clone(), done.clone());
        tokio::spawn(async move {
            let kill = |wait_ms: i64| {
                sqlx::query_scalar::<_, i64>(
                    "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, $2))
                     FROM pg_stat_activity WHERE application_name = $1",
                )
                .bind(app.clone())
                .bind(wait_ms)
                .fetch_one(&admin)
            };
            let (mut rounds, mut killed) = (0u32, 0i64);
            while !done.load(Ordering::Relaxed) && rounds < 10 {
                tokio::time::sleep(Duration::from_millis(150)).await;
                killed += kill(0).await.unwrap();
                rounds += 1;
            }
            // Last round: wait until each backend is really gone, so that
            // nothing dies behind the recovery check below.
            killed += kill(5000).await.unwrap();
            (rounds, killed)
        })
    };

    let mut tasks = Vec::new();
    for c in 0..claimers {
        let (url, job) = (sidecar.url(), j.to_string());
        tasks.push(tokio::spawn(async move {
            let mut cl = ClaimsClient::connect(url).await.unwrap();
            let mut t = Tally::default();
            for i in (0..slots).filter(|i| (i + c as i64) % spread == 0) {
                let token = Token::generate().as_str().to_owned();
                let req = pb::ClaimRequest {
                    job: job.clone(),
                    slot_ms: base + i,
                    token: token.clone(),
                    ..Default::default()
                };
                for resend in 0.. {
                    assert!(
                        resend < 200,
                        "slot {i}: still unavailable after 200 resends"
                    );
                    match cl.claim(req.clone()).await {
                        Ok(r) => {
                            let r = r.into_inner();
                            match pb::Outcome::try_from(r.outcome) {
                                Ok(pb::Outcome::Won) => {
                                    assert_eq!(r.token, token, "WON with someone else's token");
                                    t.won.push((i, token.clone()));
                                }
                                Ok(pb::Outcome::Running) => {
                                    assert!(r.token.is_empty(), "a loser saw a token");
                                    t.running.push((i, token.clone()));
                                }
                                other => panic!("unexpected outcome {other:?}: {r:?}"),
                            }
                            break;
                        }
                        Err(s) if s.code() == tonic::Code::Unavailable => t.unavailable += 1,
                        Err(s) => {
                            t.other_errors
                                .push(format!("{:?}: {}", s.code(), s.message()));
                            break;
                        }
                    }
                }
            }
            t
        }));
    }
    let mut all = Tally::default();
    for task in tasks {
        let t = task.await.unwrap();
        all.won.extend(t.won);
        all.running.extend(t.running);
        all.unavailable += t.unavailable;
        all.other_errors.extend(t.other_errors);
    }
    done.store(true, Ordering::Relaxed);
    let (rounds, killed) = killer.await.unwrap();
    eprintln!(
        "killed {killed} connections in {rounds} rounds; {} WON, {} RUNNING, {} UNAVAILABLE",
        all.won.len(),
        all.running.len(),
        all.unavailable
    );
    assert!(
        rounds > 0 && killed > 0,
        "the test never killed a connection while claims ran"
    );
    assert!(
        all.other_errors.is_empty(),
        "answers other than UNAVAILABLE: {:?}",
        all.other_errors
    );

    // What the database holds.
    let held: HashMap<i64, String> = sqlx::query(&format!(
        "SELECT slot_ms, token FROM {prefix}_runs WHERE job = $1"
    ))
    .bind(j.as_str())
    .fetch_all(&admin)
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get::<i64, _>("slot_ms") - base, r.get("token")))
    .collect();
    let mut winners: HashMap<i64, Vec<&String>> = HashMap::new();
    for (slot, token) in &all.won {
        winners.entry(*slot).or_default().push(token);
    }
    for i in 0..slots {
        let w = winners.get(&i).map(Vec::as_slice).unwrap_or_default();
        assert_eq!(w.len(), 1, "slot {i}: {} WON answers", w.len());
        assert_eq!(
            held.get(&i),
            Some(w[0]),
            "slot {i}: WON is not what is stored"
        );
    }
    for (slot, token) in &all.running {
        assert_ne!(
            held.get(slot),
            Some(token),
            "slot {slot}: told RUNNING but holds it"
        );
    }

    // The same sidecar answers again, at once: at most the first request
    // meets a connection killed in the last round.
    let mut failures = 0;
    for i in 0..50 {
        let r = cl
            .claim(pb::ClaimRequest {
                job: j.to_string(),
                slot_ms: base + slots + i,
                ..Default::default()
            })
            .await;
        match r {
            Ok(r) => assert_eq!(
                pb::Outcome::try_from(r.into_inner().outcome),
                Ok(pb::Outcome::Won)
            ),
            Err(s) => {
                assert_eq!(s.code(), tonic::Code::Unavailable, "{s:?}");
                failures += 1;
            }
        }
    }
    assert!(
        failures <= 1,
        "{failures} claims failed after the kills stopped"
    );
    drop(sidecar);
    pg::drop_tables(&prefix).await;
}
