//! The PostgreSQL store: `postgres://USER@HOST:PORT/DB?table=PREFIX`.
//!
//! Why the step is atomic: a claim that may write upserts the job's row in
//! `<prefix>_jobs` first (`INSERT … ON CONFLICT DO UPDATE`), which takes that
//! row's lock, so every write to the runs of one job queues behind it while
//! other jobs go on. The next statement reads the run `FOR UPDATE` with a
//! fresh snapshot (READ COMMITTED: each statement sees everything committed
//! before it started, and the lock was already held), the decision table
//! decides, and the write happens before the lock is released at `COMMIT`.
//! `now` is the database's `clock_timestamp()`, read after the lock.
//!
//! Most claims never write: a plain read (with the database's clock) first
//! answers finished runs, live leases, resends, late slots and overlaps;
//! only a missing run or a lapsed lease takes the lock and decides again.
//!
//! Two paths run these steps ([`PgClaim`]): by default the `<prefix>_claim`
//! PL/pgSQL function (see `migrations/postgres/0005_run_lease.sql`), called
//! for every claim of a batch gathered from concurrent requests in one round
//! trip and one transaction (group commit, [`batch`]), or the transaction
//! driven from here with the shared [`super::sql::claim_locked`]. The
//! conformance suite runs against both, and `tests/postgres.rs` checks both
//! against `claim::decide` on random states.
//!
//! Errors are translated here: serialization failures and deadlocks are
//! retried a few times with jittered backoff, a lost connection or an
//! exhausted pool is `UNAVAILABLE`, anything else a store error. No error is
//! ever a win: an answer is only returned after the commit succeeded.
//! See `docs/stores/postgres.md`.
//!
//! Layout: [`url`] the backend URL, [`errors`] failures and the retry of
//! conflicts, [`migrate`] the embedded migrations, [`statements`] every
//! statement for the table prefix, [`batch`] group commit of claims, [`pool`]
//! the connection pool; this file the store's flows.

use std::future::Future;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::postgres::{PgConnectOptions, PgRow};
use sqlx::{Connection, PgConnection, Row};

use self::errors::{classify, retry_conflicts, AttemptError, AttemptResult};
use self::migrate::migrate;
use self::pool::Pool;
use self::statements::{Statements, NOW_MS};
use super::sql::{self, run_from_row, RunAccess};
use super::{Leases, Store, StoreInfo, StoreOptions};
use crate::claim::*;
use crate::error::{Error, Result};

mod batch;
mod errors;
mod migrate;
mod pool;
mod statements;
mod url;

use self::url::check_table;
pub(super) use self::url::parse_url;
pub use self::url::{PgClaim, PgTarget};

/// How long a request waits for a free connection before it is `UNAVAILABLE`.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);
/// A statement with its parameters bound.
type PgQuery<'q> = sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>;

pub struct PostgresStore {
    pool: Arc<Pool>,
    /// Gathers concurrent claims into one call (group commit).
    batcher: batch::Batcher,
    claim: PgClaim,
    sql: Statements,
    info: StoreInfo,
}

impl PostgresStore {
    /// Connects, runs the migrations for the target's prefix and returns
    /// the store.
    pub async fn open(target: &PgTarget, opts: &StoreOptions) -> Result<PostgresStore> {
        let table = target.table.as_str();
        check_table(table)?;
        let connect = PgConnectOptions::from_str(&target.url)
            .map_err(|e| Error::invalid("backend", format!("postgres URL: {e}")))?;
        let pool = Arc::new(Pool::new(connect, target.max_connections, ACQUIRE_TIMEOUT));
        let id = {
            // Reachable at start, or the sidecar does not start.
            let mut conn = pool.acquire().await.map_err(AttemptError::into_error)?;
            migrate(&mut conn, table).await?;
            let select = format!("SELECT value FROM {table}_meta WHERE key = 'store_id'");
            let id: String = sqlx::query_scalar(&select)
                .fetch_one(&mut *conn)
                .await
                .map_err(|e| AttemptError::from(e).into_error())?;
            // A bare postgres:// URL picks the database and user from the
            // environment (often the OS user): say which at start.
            if let Ok((db, user)) = sqlx::query_as::<_, (String, String)>(
                "SELECT current_database()::text, current_user::text",
            )
            .fetch_one(&mut *conn)
            .await
            {
                tracing::info!(database = %db, user = %user, tables = %format!("{table}_*"), "postgres store");
            }
            conn.done();
            id
        };
        let sql = Statements::new(table);
        Ok(PostgresStore {
            batcher: batch::Batcher::start(
                pool.clone(),
                &sql,
                target.max_batch,
                target.batches_in_flight,
            ),
            pool,
            claim: target.claim,
            sql,
            info: StoreInfo {
                backend: "postgres",
                leases: true,
                full_history: true,
                retention: sql::retention_note(opts.retention),
                identity: format!("postgres:{id}"),
            },
        })
    }
}

/// The run in a row whose run columns may all be NULL (no run).
fn optional_run(row: &PgRow) -> AttemptResult<Option<RunRow>> {
    if row.try_get::<Option<String>, _>("state")?.is_none() {
        return Ok(None);
    }
    Ok(Some(run_from_row(row)?))
}

/// A claim's answer from a row of `<prefix>_claim` (or of one element of
/// `<prefix>_claim_batch`), under the column names of
/// [`Statements::claim_batch`].
fn answer_of(row: &PgRow, spec: &ClaimSpec) -> AttemptResult<ClaimAnswer> {
    let now: i64 = row.try_get("now_ms")?;
    let decision: String = row.try_get("decision")?;
    let d = match decision.as_str() {
        "late" => Decision::Late,
        "overlap" => Decision::Overlap(Holder {
            node: row.try_get("overlap_node")?,
            instance: row.try_get::<i64, _>("overlap_instance")? as u64,
        }),
        "insert" => Decision::Insert,
        "resend" => Decision::Resend,
        "running" => Decision::Running,
        "takeover" => Decision::Takeover,
        "exhausted" => Decision::Exhausted,
        "done" => Decision::Done,
        "relock" => Decision::Relock,
        other => {
            return Err(Error::Store(format!("unknown claim decision {other:?}")).into());
        }
    };
    // The run as written when the decision wrote, else as read: what
    // `Decision::answer` reads from either.
    let run = optional_run(row)?;
    Ok(d.answer(spec, run.as_ref(), run.as_ref(), now))
}

/// The runs, through one connection of this store (inside the job's lock
/// when the claim writes). `fence` is the job's counter read under the lock.
struct PgRuns<'a> {
    conn: &'a mut PgConnection,
    sql: &'a Statements,
    fence: u64,
    /// Whether a run was written (else the transaction is rolled back).
    wrote: bool,
}

#[async_trait]
impl RunAccess for PgRuns<'_> {
    type Err = AttemptError;

    async fn run(&mut self, job: &Job, slot: SlotMs) -> AttemptResult<Option<RunRow>> {
        let row = sqlx::query(&self.sql.run_for_update)
            .bind(job.as_str())
            .bind(slot)
            .fetch_optional(&mut *self.conn)
            .await?;
        Ok(row.as_ref().map(run_from_row).transpose()?)
    }

    async fn others(&mut self, job: &Job, slot: SlotMs, now: i64) -> AttemptResult<Vec<RunRow>> {
        let rows = sqlx::query(&self.sql.others)
            .bind(job.as_str())
            .bind(slot)
            .bind(now)
            .fetch_all(&mut *self.conn)
            .await?;
        Ok(rows.iter().map(run_from_row).collect::<Result<_>>()?)
    }

    async fn next_fence(&mut self, _job: &Job) -> AttemptResult<u64> {
        // The job row is locked: nobody else moves its counter until COMMIT,
        // and `write` stores the new value together with the run.
        self.fence += 1;
        Ok(self.fence)
    }

    async fn write(&mut self, job: &Job, run: &RunRow) -> AttemptResult<()> {
        sql::bind_run(sqlx::query(&self.sql.write_run), job, run)
            .bind(self.fence as i64)
            .execute(&mut *self.conn)
            .await?;
        self.wrote = true;
        Ok(())
    }

    async fn extend(
        &mut self,
        job: &Job,
        slot: SlotMs,
        now: i64,
        lease_ms: i64,
    ) -> AttemptResult<i64> {
        let lease_until: i64 = sqlx::query_scalar(&self.sql.renew)
            .bind(job.as_str())
            .bind(slot)
            .bind(now)
            .bind(lease_ms)
            .fetch_one(&mut *self.conn)
            .await?;
        Ok(lease_until)
    }

    async fn finish(
        &mut self,
        job: &Job,
        slot: SlotMs,
        state: RunState,
        now: i64,
    ) -> AttemptResult<()> {
        sqlx::query(&self.sql.release)
            .bind(job.as_str())
            .bind(slot)
            .bind(state.as_str())
            .bind(now)
            .execute(&mut *self.conn)
            .await?;
        Ok(())
    }

    async fn liveness(&mut self, holders: &[Holder]) -> AttemptResult<Vec<u64>> {
        let rows = fetch_liveness(&mut *self.conn, &self.sql.liveness_for_share, holders).await?;
        Ok(rows)
    }
}

/// The liveness counters of `holders` (0 without a record) with `sql`
/// ([`Statements::liveness`] or its `FOR SHARE` twin).
async fn fetch_liveness(
    conn: &mut PgConnection,
    sql: &str,
    holders: &[Holder],
) -> AttemptResult<Vec<u64>> {
    let (nodes, instances): (Vec<&str>, Vec<i64>) = holders
        .iter()
        .map(|h| (h.node.as_str(), h.instance as i64))
        .unzip();
    let rows = sqlx::query(sql)
        .bind(nodes)
        .bind(instances)
        .fetch_all(conn)
        .await?;
    let mut found = std::collections::HashMap::new();
    for r in &rows {
        let node: String = r.try_get("node")?;
        let instance: i64 = r.try_get("instance")?;
        let counter: i64 = r.try_get("counter")?;
        found.insert((node, instance), counter as u64);
    }
    Ok(holders
        .iter()
        .map(|h| {
            found
                .get(&(h.node.clone(), h.instance as i64))
                .copied()
                .unwrap_or(0)
        })
        .collect())
}

impl PostgresStore {
    /// [`retry_conflicts`], noting an outage when the answer is `UNAVAILABLE`.
    async fn retrying<T, F, Fut>(&self, op: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = AttemptResult<T>>,
    {
        let out = retry_conflicts(op).await;
        if let Err(Error::Unavailable(e)) = &out {
            tracing::warn!(error = %e, "postgres unavailable");
            self.pool.mark_outage();
        }
        out
    }

    /// One statement on a lent connection; the rows it changed.
    async fn execute(&self, q: PgQuery<'_>) -> AttemptResult<u64> {
        let mut conn = self.pool.acquire().await?;
        let n = q.execute(&mut *conn).await?.rows_affected();
        conn.done();
        Ok(n)
    }

    /// One query on a lent connection; its rows.
    async fn fetch_all(&self, q: PgQuery<'_>) -> AttemptResult<Vec<PgRow>> {
        let mut conn = self.pool.acquire().await?;
        let rows = q.fetch_all(&mut *conn).await?;
        conn.done();
        Ok(rows)
    }

    fn runs<'a>(&'a self, conn: &'a mut PgConnection, fence: u64) -> PgRuns<'a> {
        PgRuns {
            conn,
            sql: &self.sql,
            fence,
            wrote: false,
        }
    }

    /// The database's clock and the run, read without a lock.
    async fn peek(
        &self,
        conn: &mut PgConnection,
        job: &Job,
        slot: SlotMs,
    ) -> AttemptResult<(i64, Option<RunRow>)> {
        let row = sqlx::query(&self.sql.peek)
            .bind(job.as_str())
            .bind(slot)
            .fetch_one(conn)
            .await?;
        Ok((row.try_get("now_ms")?, optional_run(&row)?))
    }

    /// Locks an existing job row; `None` when the job has no row (so no runs).
    async fn lock_existing_job(
        &self,
        conn: &mut PgConnection,
        job: &Job,
    ) -> AttemptResult<Option<i64>> {
        Ok(sqlx::query_scalar(&self.sql.lock_existing_job)
            .bind(job.as_str())
            .fetch_optional(conn)
            .await?)
    }

    async fn claim_transaction(
        &self,
        spec: &ClaimSpec,
        dead: &DeadHolders,
    ) -> AttemptResult<ClaimAnswer> {
        // Read before the transaction: most answers need no lock.
        {
            let mut conn = self.pool.acquire().await?;
            let (now, run) = self.peek(&mut conn, &spec.job, spec.slot_ms).await?;
            let mut runs = self.runs(&mut conn, 0);
            let answer =
                sql::answer_without_write(&mut runs, spec, dead, now, run.as_ref()).await?;
            conn.done();
            if let Some(a) = answer {
                return Ok(a);
            }
        }
        // Lock the job, decide again, write.
        let mut conn = self.pool.acquire().await?;
        let mut tx = conn.begin().await?;
        let row = sqlx::query(&self.sql.lock_job)
            .bind(spec.job.as_str())
            .fetch_one(&mut *tx)
            .await?;
        let fence: i64 = row.try_get("fence")?;
        let now: i64 = row.try_get("now_ms")?;
        let mut runs = self.runs(&mut tx, fence as u64);
        let out = sql::claim_locked(&mut runs, spec, dead, now).await?;
        // Nothing written (someone else won meanwhile): roll back, which
        // also drops the no-op update of the job row and so does not wait
        // for a WAL flush the way a commit would.
        if runs.wrote {
            tx.commit().await?;
        } else {
            tx.rollback().await?;
        }
        conn.done();
        Ok(out)
    }

    /// Claims `specs` (one holder) as one group commit, the batch a busy
    /// sidecar runs for concurrent claims, whatever else is in flight: per
    /// claim, in the order given, its answer. For tests and tools; a sidecar
    /// gathers its batches itself.
    pub async fn claim_batch(
        &self,
        specs: &[ClaimSpec],
        dead: &DeadHolders,
    ) -> Vec<Result<ClaimAnswer>> {
        self.batcher
            .claim_all(specs, dead)
            .await
            .into_iter()
            .map(|a| a.map_err(AttemptError::into_error))
            .collect()
    }

    /// The run, read without a lock.
    async fn snapshot(&self, job: &Job, slot: SlotMs) -> AttemptResult<Option<RunRow>> {
        let mut conn = self.pool.acquire().await?;
        let (_, run) = self.peek(&mut conn, job, slot).await?;
        conn.done();
        Ok(run)
    }

    /// For renew and release: takes the job's lock and returns the clock
    /// after it. A job without a row has no runs.
    async fn lock_job_of_run(&self, conn: &mut PgConnection, job: &Job) -> AttemptResult<i64> {
        Ok(self
            .lock_existing_job(conn, job)
            .await?
            .ok_or_else(|| Error::NotFound("no such run".into()))?)
    }

    async fn renew_once(&self, spec: &RenewSpec, dead: &DeadHolders) -> AttemptResult<Renewed> {
        // Refuse without a lock when a plain read already says so.
        let snap = self.snapshot(&spec.job, spec.slot_ms).await?;
        decide_renew(snap.as_ref(), &spec.token, dead)?;
        let mut conn = self.pool.acquire().await?;
        let mut tx = conn.begin().await?;
        let now = self.lock_job_of_run(&mut tx, &spec.job).await?;
        let out = sql::renew_locked(&mut self.runs(&mut tx, 0), spec, dead, now).await?;
        tx.commit().await?;
        conn.done();
        Ok(out)
    }

    async fn release_once(&self, spec: &ReleaseSpec, dead: &DeadHolders) -> AttemptResult<()> {
        let snap = self.snapshot(&spec.job, spec.slot_ms).await?;
        if decide_release(snap.as_ref(), &spec.token, dead)? == ReleaseDecision::AlreadyReleased {
            return Ok(());
        }
        let mut conn = self.pool.acquire().await?;
        let mut tx = conn.begin().await?;
        let now = self.lock_job_of_run(&mut tx, &spec.job).await?;
        sql::release_locked(&mut self.runs(&mut tx, 0), spec, dead, now).await?;
        tx.commit().await?;
        conn.done();
        Ok(())
    }

    async fn end_lease_once(
        &self,
        job: &Job,
        slot_ms: SlotMs,
        token: &Token,
    ) -> AttemptResult<bool> {
        let mut conn = self.pool.acquire().await?;
        let mut tx = conn.begin().await?;
        let Some(now) = self.lock_existing_job(&mut tx, job).await? else {
            tx.rollback().await?;
            conn.done();
            return Ok(false);
        };
        let n = sqlx::query(&self.sql.end_lease)
            .bind(job.as_str())
            .bind(slot_ms)
            .bind(token.as_str())
            .bind(now)
            .execute(&mut *tx)
            .await?
            .rows_affected();
        tx.commit().await?;
        conn.done();
        Ok(n > 0)
    }
}

#[async_trait]
impl Store for PostgresStore {
    fn info(&self) -> &StoreInfo {
        &self.info
    }

    async fn claim(&self, spec: &ClaimSpec, dead: &DeadHolders) -> Result<ClaimAnswer> {
        match self.claim {
            // The function cannot re-check liveness records: a claim that
            // would take over an expired holder runs as a transaction.
            PgClaim::Function if !dead.has_conditional() => {
                self.retrying(|| self.batcher.claim(spec, dead)).await
            }
            PgClaim::Function => self.retrying(|| self.claim_transaction(spec, dead)).await,
            PgClaim::Transaction => self.retrying(|| self.claim_transaction(spec, dead)).await,
        }
    }

    async fn release(&self, spec: &ReleaseSpec, dead: &DeadHolders) -> Result<()> {
        self.retrying(|| self.release_once(spec, dead)).await
    }

    async fn history(
        &self,
        job: &Job,
        limit: u32,
        before_slot_ms: Option<i64>,
    ) -> Result<HistoryPage> {
        let rows = self
            .retrying(|| {
                self.fetch_all(
                    sqlx::query(&self.sql.history)
                        .bind(job.as_str())
                        .bind(before_slot_ms.unwrap_or(i64::MAX))
                        .bind(limit as i64),
                )
            })
            .await?;
        Ok(HistoryPage {
            runs: rows.iter().map(run_from_row).collect::<Result<_>>()?,
            complete: true,
            note: None,
        })
    }

    async fn ping(&self) -> Result<()> {
        self.retrying(|| self.execute(sqlx::query("SELECT 1")))
            .await
            .map(drop)
    }

    async fn now_ms(&self) -> Result<i64> {
        self.retrying(|| async {
            let mut conn = self.pool.acquire().await?;
            let now: i64 = sqlx::query_scalar(&format!("SELECT {NOW_MS}"))
                .fetch_one(&mut *conn)
                .await?;
            conn.done();
            Ok(now)
        })
        .await
    }

    fn leases(&self) -> Option<&dyn Leases> {
        Some(self)
    }
}

#[async_trait]
impl Leases for PostgresStore {
    async fn renew(&self, spec: &RenewSpec, dead: &DeadHolders) -> Result<Renewed> {
        self.retrying(|| self.renew_once(spec, dead)).await
    }

    async fn end_lease(&self, job: &Job, slot_ms: SlotMs, token: &Token) -> Result<bool> {
        self.retrying(|| self.end_lease_once(job, slot_ms, token))
            .await
    }

    /// One statement: each run's row lock orders it against a claim of that
    /// run (which holds the row `FOR UPDATE`), and the condition is checked
    /// again on the newest row version after the wait.
    async fn end_leases_of(&self, holder: &Holder) -> Result<u64> {
        self.retrying(|| {
            self.execute(
                sqlx::query(&self.sql.end_leases_of)
                    .bind(&holder.node)
                    .bind(holder.instance as i64),
            )
        })
        .await
    }

    /// Deletes one batch; rows a claim holds are skipped, not waited for.
    async fn prune(&self, cutoff_ms: i64, batch: u32) -> Result<u64> {
        self.retrying(|| {
            self.execute(
                sqlx::query(&self.sql.prune_liveness)
                    .bind(cutoff_ms)
                    .bind(batch as i64),
            )
        })
        .await?;
        self.retrying(|| {
            self.execute(
                sqlx::query(&self.sql.prune)
                    .bind(cutoff_ms)
                    .bind(batch as i64),
            )
        })
        .await
    }

    fn keeps_liveness(&self) -> bool {
        true
    }

    async fn beat(&self, holder: &Holder) -> Result<u64> {
        self.retrying(|| async {
            let mut conn = self.pool.acquire().await?;
            let c: i64 = sqlx::query_scalar(&self.sql.beat)
                .bind(holder.node.as_str())
                .bind(holder.instance as i64)
                .fetch_one(&mut *conn)
                .await?;
            conn.done();
            Ok(c as u64)
        })
        .await
    }

    async fn beats_of(&self, holders: &[Holder]) -> Result<Vec<u64>> {
        self.retrying(|| async {
            let mut conn = self.pool.acquire().await?;
            let out = fetch_liveness(&mut conn, &self.sql.liveness, holders).await?;
            conn.done();
            Ok(out)
        })
        .await
    }
}
