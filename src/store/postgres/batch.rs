//! Group commit for PostgreSQL claims.
//!
//! Claims that arrive while earlier ones are in flight are gathered into one
//! call of `<prefix>_claim_batch_whole`
//! (`migrations/postgres/0010_claim_batch_whole.sql`): one round trip, one
//! transaction, one WAL flush for the whole batch, each claim still decided
//! on its own by `<prefix>_claim` under its job's lock. Should one claim
//! fail, that call writes nothing, and the batch runs again as one call of
//! `<prefix>_claim_batch` (`0006_claim_batch.sql`), each claim in its own
//! subtransaction, so the one that fails is answered with its own error and
//! the others go on ([`run`]).
//!
//! A claim that arrives while nothing is queued or in flight runs alone, in
//! the caller's own task, as one call of `<prefix>_claim`: a lone client pays
//! neither the hop to the gathering task nor the batch's subtransaction. A
//! batch is gathered from what is queued when a connection slot is free
//! (`batches_in_flight` at once, `max_batch` claims each: URL options); under
//! load it also waits up to a millisecond for as many claims as the batch
//! before it carried ([`gather`]), since a transaction's own cost (its WAL
//! flush above all) is most of what a small batch costs the server. A lone
//! client never waits for a batch to fill. With
//! `max_batch=1` there is no group commit: every claim waits for a slot and
//! runs alone. Claims of one batch share their dead-holder set (one
//! sidecar's view at that moment); claims whose sets differ go in separate
//! calls. A batch is sorted by job so that concurrent batches take job locks
//! in one order and cannot deadlock.
//!
//! While every claim of the last call (a batch or a claim alone) won, the
//! next call goes straight to the locked pass (`p_lock_first`,
//! `migrations/postgres/0008_claim_lock_first.sql`): in a stream of new
//! slots the read before the lock answers nothing. One claim that did not
//! win turns the read back on for the next call. Either way the decision is
//! the one taken under the job's lock. There, a claim that is not late and
//! makes no overlap check writes its run first and is decided `insert` if
//! the row was missing (`0009_claim_insert_first.sql`). A batch of five
//! claims or more that goes straight to the lock with no job twice does
//! that for all its claims at once, in two statements, and decides only the
//! rest one call per claim (`0011_claim_batch_set_insert.sql`; smaller
//! batches cost PostgreSQL less one call per claim,
//! `0012_claim_batch_set_wise_from_five.sql`).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sqlx::postgres::PgRow;
use sqlx::{PgConnection, Row};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};

use super::pool::Pool;
use super::statements::Statements;
use super::{answer_of, classify, AttemptError, AttemptResult};
use crate::claim::*;
use crate::error::Error;

/// Claims waiting for a batch, at most (senders wait beyond it).
const QUEUE: usize = 4096;
/// The longest a batch waits for the claims it expects (see [`gather`]).
const GATHER_WAIT: Duration = Duration::from_millis(1);

struct Pending {
    spec: ClaimSpec,
    dead: DeadHolders,
    reply: oneshot::Sender<AttemptResult<ClaimAnswer>>,
}

/// The handle the store holds; dropping it ends the gathering task once the
/// batches in flight are answered.
pub(super) struct Batcher {
    queue: mpsc::Sender<Pending>,
    /// Connection slots for claims: held by each batch in flight and by a
    /// claim that runs alone.
    slots: Arc<Semaphore>,
    in_flight: usize,
    /// `max_batch` 1: no group commit, every claim is its own call.
    alone_always: bool,
    /// What batches and claims alone run with.
    call: Call,
    /// How many claims the last batch carried (see [`gather`]).
    last: Arc<AtomicUsize>,
}

impl Batcher {
    /// Starts the gathering task, with the store's statements.
    pub(super) fn start(
        pool: Arc<Pool>,
        statements: &Statements,
        max_batch: usize,
        in_flight: usize,
    ) -> Batcher {
        let (tx, rx) = mpsc::channel(QUEUE);
        let slots = Arc::new(Semaphore::new(in_flight));
        let last = Arc::new(AtomicUsize::new(0));
        let call = Call {
            pool,
            whole: statements.claim_batch_whole.clone(),
            isolated: statements.claim_batch.clone(),
            one: statements.claim_one.clone(),
            lock_first: Arc::new(AtomicBool::new(false)),
        };
        tokio::spawn(gather(
            call.clone(),
            rx,
            max_batch,
            slots.clone(),
            last.clone(),
        ));
        Batcher {
            queue: tx,
            slots,
            in_flight,
            alone_always: max_batch <= 1,
            call,
            last,
        }
    }

    /// Claims `specs` (one holder) as one call of `<prefix>_claim_batch`
    /// now, whatever else is in flight (see [`claim_all`]).
    pub(super) async fn claim_all(
        &self,
        specs: &[ClaimSpec],
        dead: &DeadHolders,
    ) -> Vec<AttemptResult<ClaimAnswer>> {
        claim_all(&self.call, specs, dead).await
    }

    /// One claim, answered when the batch it joined has committed, or at
    /// once when it ran alone.
    pub(super) async fn claim(
        &self,
        spec: &ClaimSpec,
        dead: &DeadHolders,
    ) -> AttemptResult<ClaimAnswer> {
        let stopped = || {
            AttemptError::Final(Error::Unavailable(
                "postgres: the claim batcher stopped".into(),
            ))
        };
        if self.alone_always {
            // No group commit: each claim waits for a connection slot and
            // runs alone, in its own task.
            let _slot = self.slots.acquire().await.map_err(|_| stopped())?;
            return claim_one(&self.call, spec, dead).await;
        }
        // Alone only when nothing is queued or in flight and the last batch
        // was not a busy one (under load, the next batch is gathered).
        let idle = self.queue.capacity() == self.queue.max_capacity()
            && self.slots.available_permits() == self.in_flight
            && self.last.load(Ordering::Relaxed) <= 1;
        if idle {
            if let Ok(_slot) = self.slots.try_acquire() {
                return claim_one(&self.call, spec, dead).await;
            }
        }
        let (reply, answer) = oneshot::channel();
        self.queue
            .send(Pending {
                spec: spec.clone(),
                dead: dead.clone(),
                reply,
            })
            .await
            .map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

/// Waits for a claim and a free slot, takes what else is queued, and hands
/// the batch to its own task.
///
/// Under load a batch waits, briefly, for as many claims as the batch before
/// it carried: the answers of one batch go out together and their callers'
/// next claims come back within a fraction of a millisecond, so the first of
/// them would otherwise go alone (one transaction, and so one WAL flush, for
/// one claim) and the rest wait behind it. It waits at most [`GATHER_WAIT`],
/// and only when the last batch had more than one claim: a lone client
/// never waits.
async fn gather(
    call: Call,
    mut queue: mpsc::Receiver<Pending>,
    max_batch: usize,
    slots: Arc<Semaphore>,
    last: Arc<AtomicUsize>,
) {
    while let Some(first) = queue.recv().await {
        // Claims that arrive while every slot is busy join this batch.
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let mut batch = vec![first];
        while batch.len() < max_batch {
            match queue.try_recv() {
                Ok(p) => batch.push(p),
                Err(_) => break,
            }
        }
        let expected = last.load(Ordering::Relaxed).min(max_batch);
        if batch.len() < expected {
            let until = tokio::time::Instant::now() + GATHER_WAIT;
            while batch.len() < expected {
                match tokio::time::timeout_at(until, queue.recv()).await {
                    Ok(Some(p)) => batch.push(p),
                    _ => break,
                }
            }
        }
        last.store(batch.len(), Ordering::Relaxed);
        tokio::spawn(flush(call.clone(), batch, slot));
    }
}

/// Runs a gathered batch: one call per holder and dead-holder set (in a
/// sidecar, one), then answers. A call whose callers have all gone (their
/// RPCs were cancelled) is dropped, as a lone claim's statement would be, so
/// that a claim stuck on a job lock keeps no connection once nobody waits.
async fn flush(call: Call, mut batch: Vec<Pending>, _slot: OwnedSemaphorePermit) {
    while !batch.is_empty() {
        let (dead, holder) = (batch[0].dead.clone(), batch[0].spec.holder.clone());
        let (same, rest): (Vec<Pending>, Vec<Pending>) = batch
            .into_iter()
            .partition(|p| p.dead == dead && p.spec.holder == holder);
        batch = rest;
        let (specs, mut replies): (Vec<ClaimSpec>, Vec<_>) =
            same.into_iter().map(|p| (p.spec, p.reply)).unzip();
        let gone = futures::future::join_all(replies.iter_mut().map(|r| r.closed()));
        let answers = tokio::select! {
            answers = claim_all(&call, &specs, &dead) => answers,
            _ = gone => continue,
        };
        for (reply, out) in replies.into_iter().zip(answers) {
            // The caller may have gone (a cancelled RPC); nothing to do then.
            let _ = reply.send(out);
        }
    }
}

fn missing() -> AttemptError {
    AttemptError::Final(Error::Store(
        "postgres: the claim batch returned no row for a claim".into(),
    ))
}

/// What batches and claims alone run with: the pool, the three statements,
/// and the flag they share (every claim of the last call won).
#[derive(Clone)]
struct Call {
    pool: Arc<Pool>,
    /// The `<prefix>_claim_batch_whole` call: a batch with no subtransaction
    /// per claim.
    whole: Arc<str>,
    /// The `<prefix>_claim_batch` call: each claim in its own subtransaction.
    isolated: Arc<str>,
    /// The `<prefix>_claim` call of a claim alone.
    one: Arc<str>,
    lock_first: Arc<AtomicBool>,
}

/// Claims `specs` (one holder) as one call of `<prefix>_claim_batch`,
/// sorted by job and slot (so that concurrent batches take job locks in one
/// order and cannot deadlock): per claim, in the order given, its answer.
async fn claim_all(
    call: &Call,
    specs: &[ClaimSpec],
    dead: &DeadHolders,
) -> Vec<AttemptResult<ClaimAnswer>> {
    let mut order: Vec<usize> = (0..specs.len()).collect();
    order.sort_by(|&a, &b| {
        (&specs[a].job, specs[a].slot_ms).cmp(&(&specs[b].job, specs[b].slot_ms))
    });
    let sorted: Vec<&ClaimSpec> = order.iter().map(|&i| &specs[i]).collect();
    let mut out: Vec<AttemptResult<ClaimAnswer>> = specs.iter().map(|_| Err(missing())).collect();
    match run(call, &sorted, dead).await {
        Ok(mut rows) => {
            for (k, &i) in order.iter().enumerate() {
                if let Some(a) = rows.get_mut(k).and_then(Option::take) {
                    out[i] = a;
                }
            }
        }
        Err(f) => {
            for o in &mut out {
                *o = Err(f.duplicate());
            }
        }
    }
    out
}

/// A claim alone: one call of `<prefix>_claim`.
async fn claim_one(
    call: &Call,
    spec: &ClaimSpec,
    dead: &DeadHolders,
) -> AttemptResult<ClaimAnswer> {
    let (dead_nodes, dead_instances) = dead_arrays(dead);
    let (current_nodes, current_instances) = current_arrays(dead);
    let mut conn = call.pool.acquire().await?;
    let row = sqlx::query(&call.one)
        .bind(spec.job.as_str())
        .bind(spec.slot_ms)
        .bind(spec.token.as_str())
        .bind(spec.holder.node.as_str())
        .bind(spec.holder.instance as i64)
        .bind(spec.lease_ms)
        .bind(spec.max_late_ms)
        .bind(spec.overlap == Overlap::Skip)
        .bind(spec.max_attempts as i64)
        .bind(dead_nodes)
        .bind(dead_instances)
        .bind(current_nodes)
        .bind(current_instances)
        .bind(call.lock_first.load(Ordering::Relaxed))
        .fetch_one(&mut *conn)
        .await?;
    conn.done();
    call.lock_first.store(took_a_run(&row), Ordering::Relaxed);
    answer_of(&row, spec)
}

/// The claim won by writing its run (a first claim, a takeover, a relock):
/// what keeps the next call going straight to the lock.
fn took_a_run(row: &PgRow) -> bool {
    matches!(
        row.try_get::<Option<&str>, _>("decision"),
        Ok(Some("insert" | "takeover" | "relock"))
    )
}

/// The unconditionally dead instances, as (nodes, instances) arrays.
fn dead_arrays(dead: &DeadHolders) -> (Vec<&str>, Vec<i64>) {
    dead.dead()
        .map(|h| (h.node.as_str(), h.instance as i64))
        .unzip()
}

/// The newest instance per node, as (nodes, instances) arrays.
fn current_arrays(dead: &DeadHolders) -> (Vec<&str>, Vec<i64>) {
    dead.current().map(|(n, &i)| (n.as_str(), i as i64)).unzip()
}

/// One batch: per claim, its answer or its error.
///
/// The batch runs first as one call of `<prefix>_claim_batch_whole`, with no
/// subtransaction per claim. A claim that fails there (the database raised
/// an error) aborts that call and its transaction: nothing of the batch was
/// written. The batch then runs again, on the same connection, as one call
/// of `<prefix>_claim_batch`, where each claim has its own subtransaction, so
/// the claim that fails is answered with its own error and the others go
/// on. A claim almost never fails, so almost every batch pays for no
/// subtransaction; one that does pays for its batch twice.
async fn run(
    call: &Call,
    specs: &[&ClaimSpec],
    dead: &DeadHolders,
) -> AttemptResult<Vec<Option<AttemptResult<ClaimAnswer>>>> {
    let lock_first = call.lock_first.load(Ordering::Relaxed);
    let mut conn = call.pool.acquire().await?;
    let rows = match query_batch(&mut conn, &call.whole, specs, dead, lock_first).await {
        Err(sqlx::Error::Database(e)) => {
            tracing::debug!(error = %e, claims = specs.len(),
                "postgres: a claim failed its batch; the batch runs again, each claim on its own");
            query_batch(&mut conn, &call.isolated, specs, dead, lock_first).await?
        }
        rows => rows?,
    };
    conn.done();
    call.lock_first.store(
        rows.len() == specs.len() && rows.iter().all(took_a_run),
        Ordering::Relaxed,
    );
    let mut out: Vec<Option<AttemptResult<ClaimAnswer>>> = (0..specs.len()).map(|_| None).collect();
    for row in &rows {
        let index: i32 = row.try_get("idx")?;
        let Some(slot) = usize::try_from(index - 1).ok().and_then(|i| out.get_mut(i)) else {
            return Err(AttemptError::Final(Error::Store(format!(
                "postgres: the claim batch answered for element {index} of {}",
                specs.len()
            ))));
        };
        *slot = Some(element(row, specs[(index - 1) as usize]));
    }
    Ok(out)
}

/// One call of a batch function (`sql`, with the arguments of
/// `<prefix>_claim_batch`) for `specs`, of one holder.
async fn query_batch(
    conn: &mut PgConnection,
    sql: &str,
    specs: &[&ClaimSpec],
    dead: &DeadHolders,
    lock_first: bool,
) -> std::result::Result<Vec<PgRow>, sqlx::Error> {
    let (dead_nodes, dead_instances) = dead_arrays(dead);
    let (current_nodes, current_instances) = current_arrays(dead);
    // [`claim_all`]'s claims are of one holder.
    let holder = &specs[0].holder;
    sqlx::query(sql)
        .bind(specs.iter().map(|s| s.job.as_str()).collect::<Vec<_>>())
        .bind(specs.iter().map(|s| s.slot_ms).collect::<Vec<_>>())
        .bind(specs.iter().map(|s| s.token.as_str()).collect::<Vec<_>>())
        .bind(holder.node.as_str())
        .bind(holder.instance as i64)
        .bind(specs.iter().map(|s| s.lease_ms).collect::<Vec<_>>())
        .bind(specs.iter().map(|s| s.max_late_ms).collect::<Vec<_>>())
        .bind(
            specs
                .iter()
                .map(|s| s.overlap == Overlap::Skip)
                .collect::<Vec<_>>(),
        )
        .bind(
            specs
                .iter()
                .map(|s| s.max_attempts as i64)
                .collect::<Vec<_>>(),
        )
        .bind(dead_nodes)
        .bind(dead_instances)
        .bind(current_nodes)
        .bind(current_instances)
        .bind(lock_first)
        .fetch_all(conn)
        .await
}

/// One element's answer: its error, or its decision.
fn element(row: &PgRow, spec: &ClaimSpec) -> AttemptResult<ClaimAnswer> {
    if let Some(e) = row.try_get::<Option<String>, _>("error")? {
        let (code, message) = e.split_once(' ').unwrap_or((e.as_str(), ""));
        return Err(classify(code, format!("postgres: {message} ({code})")));
    }
    answer_of(row, spec)
}

impl AttemptError {
    /// The same failure, for each claim of a batch that failed as a whole.
    fn duplicate(&self) -> AttemptError {
        match self {
            AttemptError::Conflict(m) => AttemptError::Conflict(m.clone()),
            AttemptError::Final(Error::Unavailable(m)) => {
                AttemptError::Final(Error::Unavailable(m.clone()))
            }
            AttemptError::Final(e) => AttemptError::Final(Error::Store(e.to_string())),
        }
    }
}
