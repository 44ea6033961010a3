//! The SQLite store: the embedded default.
//!
//! Why the step is atomic: every write opens with `BEGIN IMMEDIATE`, which
//! takes SQLite's single database write lock *before* the run is read, so the
//! read, the decision and the write happen while no other connection — in
//! this process or in any other process sharing the file — can write.
//! Contenders wait up to `busy_timeout`. Inside this process writers also
//! queue on a mutex first, so they never spin in SQLite's busy handler
//! against each other. `now` is the host clock, read after the lock is taken
//! (every writer of the file shares that clock).
//!
//! Most claims never write: a plain `SELECT` first answers finished runs,
//! live leases and resends; only a missing run or a lapsed lease opens the
//! write transaction, which reads and decides again under the lock.

use std::path::Path;
use std::str::FromStr;
use std::sync::LazyLock;

use async_trait::async_trait;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::SqliteConnection;
use sqlx::{Sqlite, Transaction};
use tokio::sync::{Mutex, MutexGuard};

use super::sql::{self, run_from_row, RunAccess, RUN_COLUMNS};
use super::{Leases, Store, StoreInfo, StoreOptions};
use crate::claim::*;
use crate::error::{Error, Result};

pub struct SqliteStore {
    pool: SqlitePool,
    /// Serialises this process's writers before they reach SQLite's lock.
    write: Mutex<()>,
    info: StoreInfo,
}

static UPSERT_RUN: LazyLock<String> = LazyLock::new(|| sql::upsert_run_sql("runs"));
/// `$1` the clock, `$2` the lease asked for (0 = the run's own), `$3` job, `$4` slot.
static RENEW: LazyLock<String> = LazyLock::new(|| {
    format!(
        "UPDATE runs SET lease_until_ms = $1 + {} WHERE job = $3 AND slot_ms = $4 RETURNING lease_until_ms",
        sql::renew_lease("$2", "max")
    )
});

impl SqliteStore {
    pub async fn open(path: &str, opts: &StoreOptions) -> Result<SqliteStore> {
        if let Some(dir) = Path::new(path).parent() {
            if !dir.as_os_str().is_empty() {
                std::fs::create_dir_all(dir).map_err(|e| {
                    Error::Unavailable(format!("cannot create {}: {e}", dir.display()))
                })?;
            }
        }
        let connect = SqliteConnectOptions::from_str("sqlite://")
            .map_err(convert)?
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(opts.busy_timeout)
            .foreign_keys(false);
        let pool = SqlitePoolOptions::new()
            .max_connections(8)
            .min_connections(1)
            .connect_with(connect)
            .await
            .map_err(convert)?;
        migrate(&pool, path).await?;
        let id: String = sqlx::query_scalar("SELECT value FROM meta WHERE key = 'store_id'")
            .fetch_one(&pool)
            .await
            .map_err(convert)?;
        Ok(SqliteStore {
            pool,
            write: Mutex::new(()),
            info: StoreInfo {
                backend: "sqlite",
                leases: true,
                full_history: true,
                retention: sql::retention_note(opts.retention),
                identity: format!("sqlite:{id}"),
            },
        })
    }
}

/// Runs the embedded migrations, holding an exclusive lock on a file next to
/// the database so that several processes starting at once do not race.
async fn migrate(pool: &SqlitePool, path: &str) -> Result<()> {
    let lock_path = format!("{path}.migrate.lock");
    let lock = tokio::task::spawn_blocking(move || -> std::io::Result<std::fs::File> {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)?;
        f.lock()?;
        Ok(f)
    })
    .await
    .map_err(|e| Error::Store(format!("migration lock task: {e}")))?
    .map_err(|e| Error::Unavailable(format!("cannot lock for migrations: {e}")))?;
    let res = sqlx::migrate!("./migrations/sqlite")
        .run(pool)
        .await
        .map_err(|e| Error::Store(format!("sqlite migrations failed: {e}")));
    drop(lock);
    res
}

/// Translates sqlx errors: a busy/locked database or a lost connection is
/// `UNAVAILABLE` (retry), anything else a store error. Never a win.
fn convert(e: sqlx::Error) -> Error {
    match &e {
        sqlx::Error::Database(db) => {
            let code = db.code().unwrap_or_default();
            // SQLITE_BUSY (5), SQLITE_LOCKED (6) and their extended codes.
            let primary = code.parse::<i64>().unwrap_or(0) & 0xff;
            if primary == 5 || primary == 6 {
                Error::Unavailable(format!("sqlite is busy: {db}"))
            } else {
                Error::Store(format!("sqlite: {db}"))
            }
        }
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => Error::Unavailable(format!("sqlite: {e}")),
        _ => Error::Store(format!("sqlite: {e}")),
    }
}

async fn read_run(conn: &mut SqliteConnection, job: &Job, slot: SlotMs) -> Result<Option<RunRow>> {
    let sql = format!("SELECT {RUN_COLUMNS} FROM runs WHERE job = ? AND slot_ms = ?");
    let row = sqlx::query(&sql)
        .bind(job.as_str())
        .bind(slot)
        .fetch_optional(conn)
        .await
        .map_err(convert)?;
    row.as_ref().map(run_from_row).transpose()
}

/// The running runs of `job` other than `slot` whose lease is current.
async fn read_others(
    conn: &mut SqliteConnection,
    job: &Job,
    slot: SlotMs,
    now: i64,
) -> Result<Vec<RunRow>> {
    let sql = format!(
        "SELECT {RUN_COLUMNS} FROM runs WHERE job = ? AND state = 'RUNNING' AND slot_ms <> ? AND lease_until_ms > ?"
    );
    let rows = sqlx::query(&sql)
        .bind(job.as_str())
        .bind(slot)
        .bind(now)
        .fetch_all(conn)
        .await
        .map_err(convert)?;
    rows.iter().map(run_from_row).collect()
}

async fn write_run(conn: &mut SqliteConnection, job: &Job, r: &RunRow) -> Result<()> {
    sql::bind_run(sqlx::query(&UPSERT_RUN), job, r)
        .execute(conn)
        .await
        .map_err(convert)?;
    Ok(())
}

async fn next_fence(conn: &mut SqliteConnection, job: &Job) -> Result<u64> {
    let fence: i64 = sqlx::query_scalar(
        "INSERT INTO jobs (job, fence) VALUES (?, 1)
         ON CONFLICT (job) DO UPDATE SET fence = fence + 1 RETURNING fence",
    )
    .bind(job.as_str())
    .fetch_one(conn)
    .await
    .map_err(convert)?;
    Ok(fence as u64)
}

#[async_trait]
impl RunAccess for SqliteConnection {
    type Err = Error;

    async fn run(&mut self, job: &Job, slot: SlotMs) -> Result<Option<RunRow>> {
        read_run(self, job, slot).await
    }

    async fn others(&mut self, job: &Job, slot: SlotMs, now: i64) -> Result<Vec<RunRow>> {
        read_others(self, job, slot, now).await
    }

    async fn next_fence(&mut self, job: &Job) -> Result<u64> {
        next_fence(self, job).await
    }

    async fn write(&mut self, job: &Job, run: &RunRow) -> Result<()> {
        write_run(self, job, run).await
    }

    async fn liveness(&mut self, holders: &[Holder]) -> Result<Vec<u64>> {
        read_liveness(self, holders).await
    }
}

/// The liveness counters of `holders` (0 without a record).
async fn read_liveness(conn: &mut SqliteConnection, holders: &[Holder]) -> Result<Vec<u64>> {
    let mut out = Vec::with_capacity(holders.len());
    for h in holders {
        let c: Option<i64> =
            sqlx::query_scalar("SELECT counter FROM liveness WHERE node = ? AND instance = ?")
                .bind(&h.node)
                .bind(h.instance as i64)
                .fetch_optional(&mut *conn)
                .await
                .map_err(convert)?;
        out.push(c.unwrap_or(0) as u64);
    }
    Ok(out)
}

impl SqliteStore {
    /// Opens `BEGIN IMMEDIATE` behind this process's writer mutex. Dropping
    /// the transaction without `commit` rolls it back.
    async fn begin(&self) -> Result<(MutexGuard<'_, ()>, Transaction<'static, Sqlite>)> {
        let guard = self.write.lock().await;
        let tx = self
            .pool
            .begin_with("BEGIN IMMEDIATE")
            .await
            .map_err(convert)?;
        Ok((guard, tx))
    }

    async fn snapshot(&self, job: &Job, slot: SlotMs) -> Result<Option<RunRow>> {
        let mut conn = self.pool.acquire().await.map_err(convert)?;
        read_run(&mut conn, job, slot).await
    }
}

#[async_trait]
impl Store for SqliteStore {
    fn info(&self) -> &StoreInfo {
        &self.info
    }

    async fn claim(&self, spec: &ClaimSpec, dead: &DeadHolders) -> Result<ClaimAnswer> {
        // Read before the transaction: most answers need no write lock.
        {
            let mut conn = self.pool.acquire().await.map_err(convert)?;
            let run = read_run(&mut conn, &spec.job, spec.slot_ms).await?;
            let now = host_now_ms();
            if let Some(a) =
                sql::answer_without_write(&mut *conn, spec, dead, now, run.as_ref()).await?
            {
                return Ok(a);
            }
        }
        // Decide again under the write lock, and write.
        let (_guard, mut tx) = self.begin().await?;
        let now = host_now_ms();
        let out = sql::claim_locked(&mut *tx, spec, dead, now).await?;
        tx.commit().await.map_err(convert)?;
        Ok(out)
    }

    async fn release(&self, spec: &ReleaseSpec, dead: &DeadHolders) -> Result<()> {
        let snap = self.snapshot(&spec.job, spec.slot_ms).await?;
        if decide_release(snap.as_ref(), &spec.token, dead)? == ReleaseDecision::AlreadyReleased {
            return Ok(());
        }
        let (_guard, mut tx) = self.begin().await?;
        let conn = &mut *tx;
        let now = host_now_ms();
        let run = read_run(conn, &spec.job, spec.slot_ms).await?;
        if decide_release(run.as_ref(), &spec.token, dead)? == ReleaseDecision::Write {
            sqlx::query(
                "UPDATE runs SET state = ?, finished_at_ms = ? WHERE job = ? AND slot_ms = ?",
            )
            .bind(spec.result.state().as_str())
            .bind(now)
            .bind(spec.job.as_str())
            .bind(spec.slot_ms)
            .execute(&mut *conn)
            .await
            .map_err(convert)?;
        }
        tx.commit().await.map_err(convert)?;
        Ok(())
    }

    async fn history(
        &self,
        job: &Job,
        limit: u32,
        before_slot_ms: Option<i64>,
    ) -> Result<HistoryPage> {
        let sql = format!(
            "SELECT {RUN_COLUMNS} FROM runs WHERE job = ? AND slot_ms < ? ORDER BY slot_ms DESC LIMIT ?"
        );
        let rows = sqlx::query(&sql)
            .bind(job.as_str())
            .bind(before_slot_ms.unwrap_or(i64::MAX))
            .bind(limit as i64)
            .fetch_all(&self.pool)
            .await
            .map_err(convert)?;
        Ok(HistoryPage {
            runs: rows.iter().map(run_from_row).collect::<Result<_>>()?,
            complete: true,
            note: None,
        })
    }

    async fn ping(&self) -> Result<()> {
        sqlx::query("SELECT 1")
            .execute(&self.pool)
            .await
            .map_err(convert)?;
        Ok(())
    }

    fn leases(&self) -> Option<&dyn Leases> {
        Some(self)
    }
}

#[async_trait]
impl Leases for SqliteStore {
    async fn renew(&self, spec: &RenewSpec, dead: &DeadHolders) -> Result<Renewed> {
        // Refuse without the write lock when the snapshot already says so.
        let snap = self.snapshot(&spec.job, spec.slot_ms).await?;
        decide_renew(snap.as_ref(), &spec.token, dead)?;
        let (_guard, mut tx) = self.begin().await?;
        let conn = &mut *tx;
        let now = host_now_ms();
        let run = read_run(conn, &spec.job, spec.slot_ms).await?;
        let r = decide_renew(run.as_ref(), &spec.token, dead)?;
        let lease_until: i64 = sqlx::query_scalar(&RENEW)
            .bind(now)
            .bind(spec.lease_ms)
            .bind(spec.job.as_str())
            .bind(spec.slot_ms)
            .fetch_one(&mut *conn)
            .await
            .map_err(convert)?;
        let out = Renewed {
            lease_until_ms: lease_until,
            attempt: r.attempt,
            fencing: r.fencing,
            now_ms: now,
        };
        tx.commit().await.map_err(convert)?;
        Ok(out)
    }

    async fn end_lease(&self, job: &Job, slot_ms: SlotMs, token: &Token) -> Result<bool> {
        let (_guard, mut tx) = self.begin().await?;
        let conn = &mut *tx;
        let now = host_now_ms();
        let n = sqlx::query(
            "UPDATE runs SET lease_until_ms = ? WHERE job = ? AND slot_ms = ? AND token = ? AND state = 'RUNNING' AND lease_until_ms > ?",
        )
        .bind(now)
        .bind(job.as_str())
        .bind(slot_ms)
        .bind(token.as_str())
        .bind(now)
        .execute(&mut *conn)
        .await
        .map_err(convert)?
        .rows_affected();
        let out = n > 0;
        tx.commit().await.map_err(convert)?;
        Ok(out)
    }

    async fn end_leases_of(&self, holder: &Holder) -> Result<u64> {
        let (_guard, mut tx) = self.begin().await?;
        let conn = &mut *tx;
        let now = host_now_ms();
        let n = sqlx::query(
            "UPDATE runs SET lease_until_ms = ? WHERE holder_node = ? AND holder_instance = ? AND state = 'RUNNING' AND lease_until_ms > ?",
        )
        .bind(now)
        .bind(&holder.node)
        .bind(holder.instance as i64)
        .bind(now)
        .execute(&mut *conn)
        .await
        .map_err(convert)?
        .rows_affected();
        let out = n;
        tx.commit().await.map_err(convert)?;
        Ok(out)
    }

    async fn prune(&self, cutoff_ms: i64, batch: u32) -> Result<u64> {
        let (_guard, mut tx) = self.begin().await?;
        let conn = &mut *tx;
        let n = sqlx::query(
            "DELETE FROM runs WHERE (job, slot_ms) IN (
               SELECT job, slot_ms FROM runs
               WHERE claimed_at_ms < ? AND (state <> 'RUNNING' OR lease_until_ms < ?)
               LIMIT ?)",
        )
        .bind(cutoff_ms)
        .bind(cutoff_ms)
        .bind(batch as i64)
        .execute(&mut *conn)
        .await
        .map_err(convert)?
        .rows_affected();
        // Liveness records of instances gone for longer than the retention.
        sqlx::query(
            "DELETE FROM liveness WHERE (node, instance) IN (
               SELECT node, instance FROM liveness WHERE updated_at_ms < ? LIMIT ?)",
        )
        .bind(cutoff_ms)
        .bind(batch as i64)
        .execute(&mut *conn)
        .await
        .map_err(convert)?;
        let out = n;
        tx.commit().await.map_err(convert)?;
        Ok(out)
    }

    fn keeps_liveness(&self) -> bool {
        true
    }

    async fn beat(&self, holder: &Holder) -> Result<u64> {
        let (_guard, mut tx) = self.begin().await?;
        let counter: i64 = sqlx::query_scalar(
            "INSERT INTO liveness (node, instance, counter, updated_at_ms) VALUES (?, ?, 1, ?)
             ON CONFLICT (node, instance) DO UPDATE
               SET counter = counter + 1, updated_at_ms = excluded.updated_at_ms
             RETURNING counter",
        )
        .bind(&holder.node)
        .bind(holder.instance as i64)
        .bind(host_now_ms())
        .fetch_one(&mut *tx)
        .await
        .map_err(convert)?;
        tx.commit().await.map_err(convert)?;
        Ok(counter as u64)
    }

    async fn beats_of(&self, holders: &[Holder]) -> Result<Vec<u64>> {
        let mut conn = self.pool.acquire().await.map_err(convert)?;
        read_liveness(&mut conn, holders).await
    }
}
