//! What the SQL stores (SQLite, PostgreSQL) share: the run columns and their
//! mapping, the statement that writes a run, and the claim flow around the
//! pure decision table.
//!
//! Each store brings its own locking (`BEGIN IMMEDIATE`, a job row lock), its
//! own clock and its own error translation; it implements [`RunAccess`] for
//! the connection it holds, and [`claim_locked`] runs the same steps on it:
//! read the run, read the job's other running runs when the decision needs
//! them, decide, take the next fencing number when the caller wins, write,
//! answer.

use std::time::Duration;

use async_trait::async_trait;
use sqlx::database::Database;
use sqlx::query::Query;
use sqlx::{ColumnIndex, Decode, Encode, Row, Type};

use crate::claim::*;
use crate::error::{Error, Result};

/// The columns of a run, in the order [`run_from_row`] and [`bind_run`] use.
pub(super) const RUN_COLUMNS: &str = "slot_ms, state, attempt, fencing, token, holder_node, holder_instance, lease_until_ms, claimed_at_ms, finished_at_ms";

/// The statement that writes a whole run (insert or replace), for the table
/// `runs`. Parameters `$1..$11`: the job, then [`RUN_COLUMNS`]; bind them
/// with [`bind_run`].
///
/// It also records the lease the run was claimed with (`lease_ms`, see
/// [`renew_lease`]): a win writes `lease_until_ms = claimed_at_ms + lease`.
/// `extra` is one more column a store writes with every run, and the SQL
/// expression of its value (SQLite's `watch`).
pub(super) fn upsert_run_sql(runs: &str, extra: Option<(&str, &str)>) -> String {
    let (col, val, set) = match extra {
        Some((c, v)) => (
            format!(", {c}"),
            format!(", {v}"),
            format!(", {c} = excluded.{c}"),
        ),
        None => Default::default(),
    };
    format!(
        "INSERT INTO {runs} (job, {RUN_COLUMNS}, lease_ms{col})
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $9 - $10{val})
         ON CONFLICT (job, slot_ms) DO UPDATE SET
           state = excluded.state, attempt = excluded.attempt, fencing = excluded.fencing,
           token = excluded.token, holder_node = excluded.holder_node,
           holder_instance = excluded.holder_instance, lease_until_ms = excluded.lease_until_ms,
           claimed_at_ms = excluded.claimed_at_ms, finished_at_ms = excluded.finished_at_ms,
           lease_ms = excluded.lease_ms{set}"
    )
}

/// The lease a renew sets, as an SQL expression: the one asked for (the
/// parameter `asked`), or when none (0) the lease the run was claimed with;
/// a run claimed before that was recorded falls back to its first lease.
/// `greatest` is the dialect's two-argument maximum (`max`, `GREATEST`).
pub(super) fn renew_lease(asked: &str, greatest: &str) -> String {
    format!(
        "CASE WHEN {asked} > 0 THEN {asked} WHEN lease_ms > 0 THEN lease_ms \
         ELSE {greatest}(lease_until_ms - claimed_at_ms, 1) END"
    )
}

/// Binds the job and the run's columns, in [`RUN_COLUMNS`] order.
pub(super) fn bind_run<'q, DB>(
    q: Query<'q, DB, <DB as Database>::Arguments<'q>>,
    job: &'q Job,
    r: &'q RunRow,
) -> Query<'q, DB, <DB as Database>::Arguments<'q>>
where
    DB: Database,
    i64: Encode<'q, DB> + Type<DB>,
    &'q str: Encode<'q, DB> + Type<DB>,
{
    q.bind(job.as_str())
        .bind(r.slot_ms)
        .bind(r.state.as_str())
        .bind(r.attempt as i64)
        .bind(r.fencing as i64)
        .bind(r.token.as_str())
        .bind(r.holder.node.as_str())
        .bind(r.holder.instance as i64)
        .bind(r.lease_until_ms)
        .bind(r.claimed_at_ms)
        .bind(r.finished_at_ms)
}

/// Reads a run from a row that holds [`RUN_COLUMNS`].
pub(super) fn run_from_row<'r, R>(row: &'r R) -> Result<RunRow>
where
    R: Row,
    &'static str: ColumnIndex<R>,
    i64: Decode<'r, R::Database> + Type<R::Database>,
    String: Decode<'r, R::Database> + Type<R::Database>,
{
    let bad = |e: sqlx::Error| Error::Store(format!("malformed run row: {e}"));
    run_from_columns(
        |c| row.try_get::<i64, _>(c).map_err(bad),
        |c| row.try_get::<String, _>(c).map_err(bad),
    )
}

/// Reads a run through two column getters (by [`RUN_COLUMNS`] name), whatever
/// the driver.
pub(super) fn run_from_columns(
    get_i64: impl Fn(&'static str) -> Result<i64>,
    get_str: impl Fn(&'static str) -> Result<String>,
) -> Result<RunRow> {
    Ok(RunRow {
        slot_ms: get_i64("slot_ms")?,
        state: RunState::parse(&get_str("state")?)?,
        attempt: get_i64("attempt")? as u32,
        fencing: get_i64("fencing")? as u64,
        token: Token::parse(&get_str("token")?)
            .map_err(|_| Error::Store("malformed token in store".into()))?,
        holder: Holder {
            node: get_str("holder_node")?,
            instance: get_i64("holder_instance")? as u64,
        },
        lease_until_ms: get_i64("lease_until_ms")?,
        claimed_at_ms: get_i64("claimed_at_ms")?,
        finished_at_ms: get_i64("finished_at_ms")?,
    })
}

/// How a lease store describes its retention in `History`.
pub(super) fn retention_note(retention: Duration) -> String {
    format!(
        "runs are kept {} after their slot and their claim, whichever is later (longer than any late claim may ask)",
        crate::duration::human(retention)
    )
}

/// Whether the decision needs the job's other running runs.
pub(super) fn needs_others(spec: &ClaimSpec, run: Option<&RunRow>) -> bool {
    spec.overlap == Overlap::Skip
        && match run {
            None => true,
            Some(r) => spec.slot_ms == 0 && r.state.is_finished(),
        }
}

/// The runs of a store, as seen through one connection (inside the store's
/// lock when a claim writes).
#[async_trait]
pub(super) trait RunAccess: Send {
    /// The store's error, which every domain error converts into.
    type Err: From<Error> + Send;

    /// The run (job, slot), if any.
    async fn run(&mut self, job: &Job, slot: SlotMs) -> Result<Option<RunRow>, Self::Err>;

    /// The running runs of `job` other than `slot` whose lease is current.
    async fn others(&mut self, job: &Job, slot: SlotMs, now: i64)
        -> Result<Vec<RunRow>, Self::Err>;

    /// The job's next fencing number (the caller wins).
    async fn next_fence(&mut self, job: &Job) -> Result<u64, Self::Err>;

    /// Writes the run.
    async fn write(&mut self, job: &Job, run: &RunRow) -> Result<(), Self::Err>;

    /// Extends the run's lease from `now` by `lease_ms` (0: the lease it was
    /// claimed with, see [`renew_lease`]); returns the new `lease_until_ms`.
    async fn extend(
        &mut self,
        job: &Job,
        slot: SlotMs,
        now: i64,
        lease_ms: i64,
    ) -> Result<i64, Self::Err>;

    /// Marks the run finished in `state` at `now`.
    async fn finish(
        &mut self,
        job: &Job,
        slot: SlotMs,
        state: RunState,
        now: i64,
    ) -> Result<(), Self::Err>;

    /// The liveness counters of `holders` (0 without a record), read so that
    /// no refresh of them can commit before this step does.
    async fn liveness(&mut self, holders: &[Holder]) -> Result<Vec<u64>, Self::Err>;
}

/// The dead-holder set with its conditional entries resolved against the
/// liveness records, read inside the step (`DeadHolders::confirmed`).
pub(super) async fn confirm_dead<'d, A: RunAccess>(
    runs: &mut A,
    dead: &'d DeadHolders,
) -> Result<std::borrow::Cow<'d, DeadHolders>, A::Err> {
    if !dead.has_conditional() {
        return Ok(std::borrow::Cow::Borrowed(dead));
    }
    let holders: Vec<Holder> = dead.conditional().map(|(h, _)| h.clone()).collect();
    let counters = runs.liveness(&holders).await?;
    let seen: std::collections::HashMap<&Holder, u64> = holders.iter().zip(counters).collect();
    Ok(std::borrow::Cow::Owned(
        dead.confirmed(|h| seen.get(h).copied().unwrap_or(0)),
    ))
}

/// Decides on `run`, reading the job's other running runs when the decision
/// needs them.
pub(super) async fn decide_on<A: RunAccess>(
    runs: &mut A,
    spec: &ClaimSpec,
    dead: &DeadHolders,
    now: i64,
    run: Option<&RunRow>,
) -> Result<Decision, A::Err> {
    let others = if needs_others(spec, run) {
        runs.others(&spec.job, spec.slot_ms, now).await?
    } else {
        Vec::new()
    };
    Ok(decide(now, spec, dead, run, &others))
}

/// Read before the transaction: the answer when the decision on a plain read
/// writes nothing (finished, running and live, a resend, late, overlap).
pub(super) async fn answer_without_write<A: RunAccess>(
    runs: &mut A,
    spec: &ClaimSpec,
    dead: &DeadHolders,
    now: i64,
    run: Option<&RunRow>,
) -> Result<Option<ClaimAnswer>, A::Err> {
    let d = decide_on(runs, spec, dead, now, run).await?;
    Ok((!d.writes()).then(|| d.answer(spec, run, None, now)))
}

/// The claim under the store's lock: read the run again, decide, write.
/// `now` is the store's clock, read after the lock was taken.
pub(super) async fn claim_locked<A: RunAccess>(
    runs: &mut A,
    spec: &ClaimSpec,
    dead: &DeadHolders,
    now: i64,
) -> Result<ClaimAnswer, A::Err> {
    let dead = confirm_dead(runs, dead).await?;
    let dead = dead.as_ref();
    let run = runs.run(&spec.job, spec.slot_ms).await?;
    let d = decide_on(runs, spec, dead, now, run.as_ref()).await?;
    let fencing = if d.wins() {
        runs.next_fence(&spec.job).await?
    } else {
        0
    };
    let written = d.next_row(spec, run.as_ref(), now, fencing);
    if let Some(w) = &written {
        runs.write(&spec.job, w).await?;
    }
    Ok(d.answer(spec, run.as_ref(), written.as_ref(), now))
}

/// The renew under the store's lock: read the run again, check the token and
/// the holder, extend the lease. `now` is the store's clock after the lock.
pub(super) async fn renew_locked<A: RunAccess>(
    runs: &mut A,
    spec: &RenewSpec,
    dead: &DeadHolders,
    now: i64,
) -> Result<Renewed, A::Err> {
    let run = runs.run(&spec.job, spec.slot_ms).await?;
    let r = decide_renew(run.as_ref(), &spec.token, dead)?;
    let (attempt, fencing) = (r.attempt, r.fencing);
    let lease_until_ms = runs
        .extend(&spec.job, spec.slot_ms, now, spec.lease_ms)
        .await?;
    Ok(Renewed {
        lease_until_ms,
        attempt,
        fencing,
        now_ms: now,
    })
}

/// The release under the store's lock: read the run again and mark it
/// finished, unless it already is with this token (idempotent).
pub(super) async fn release_locked<A: RunAccess>(
    runs: &mut A,
    spec: &ReleaseSpec,
    dead: &DeadHolders,
    now: i64,
) -> Result<(), A::Err> {
    let run = runs.run(&spec.job, spec.slot_ms).await?;
    if decide_release(run.as_ref(), &spec.token, dead)? == ReleaseDecision::Write {
        runs.finish(&spec.job, spec.slot_ms, spec.result.state(), now)
            .await?;
    }
    Ok(())
}
