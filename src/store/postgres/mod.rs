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

use std::future::Future;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use backon::{ExponentialBuilder, Retryable};
use sha2::{Digest, Sha256};
use sqlx::postgres::{PgConnectOptions, PgRow};
use sqlx::{Connection, Executor, PgConnection, Row};

use self::pool::Pool;
use super::sql::{self, run_from_row, RunAccess, RUN_COLUMNS};
use super::{Backend, Leases, Store, StoreInfo, StoreOptions};
use crate::claim::*;
use crate::error::{Error, Result};

mod batch;
mod pool;

/// The table prefix when the URL names none.
pub const DEFAULT_TABLE: &str = "anarchon";
/// Connections per store when the URL names no `max_connections`.
pub const DEFAULT_MAX_CONNECTIONS: u32 = 16;
/// How long a request waits for a free connection before it is `UNAVAILABLE`.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(5);
/// Retries of a serialization failure or deadlock before giving up.
const CONFLICT_RETRIES: usize = 5;

/// The database's clock, in epoch milliseconds.
const NOW_MS: &str = "floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint";

/// The embedded migrations: version, name, SQL with `{prefix}` for the table
/// prefix. Append only.
const MIGRATIONS: &[(i32, &str, &str)] = &[
    (
        1,
        "runs",
        include_str!("../../../migrations/postgres/0001_runs.sql"),
    ),
    (
        2,
        "claim_function",
        include_str!("../../../migrations/postgres/0002_claim_function.sql"),
    ),
    (
        3,
        "liveness",
        include_str!("../../../migrations/postgres/0003_liveness.sql"),
    ),
    (
        4,
        "store_identity",
        include_str!("../../../migrations/postgres/0004_store_identity.sql"),
    ),
    (
        5,
        "run_lease",
        include_str!("../../../migrations/postgres/0005_run_lease.sql"),
    ),
    (
        6,
        "claim_batch",
        include_str!("../../../migrations/postgres/0006_claim_batch.sql"),
    ),
];

/// Where and how a PostgreSQL store runs, from its backend URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgTarget {
    /// What the driver gets: the URL without the parameters below.
    pub url: String,
    /// `table`: the prefix of the store's tables.
    pub table: String,
    /// `max_connections`: the pool size.
    pub max_connections: u32,
    /// `claim`: how a claim runs.
    pub claim: PgClaim,
}

/// How a claim runs. Both take the same steps under the same locks and decide
/// with the same table; the conformance suite runs against both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PgClaim {
    /// `claim=function` (default): one round trip, a call of the
    /// `<prefix>_claim` PL/pgSQL function the migrations create, for each
    /// claim of a batch gathered from concurrent requests (group commit,
    /// `<prefix>_claim_batch`, see [`batch`]).
    Function,
    /// `claim=transaction`: a plain read, then the transaction driven from
    /// Rust with the shared `claim::decide` (up to six round trips).
    Transaction,
}

/// Parses
/// `postgres://USER@HOST:PORT/DB?table=PREFIX[&max_connections=N][&claim=function|transaction]`.
/// Every other parameter is left to the driver (`sslmode`, `application_name`,
/// …). Without an `application_name`, connections are named
/// `anarchon/<prefix>`, so an operator can find them in `pg_stat_activity`.
pub(super) fn parse_url(url: &str) -> Result<Backend> {
    // The URL itself is not repeated: it may hold a password.
    let mut u = url::Url::parse(url)
        .map_err(|e| Error::invalid("backend", format!("not a valid postgres:// URL: {e}")))?;
    let mut table = DEFAULT_TABLE.to_owned();
    let mut max_connections = DEFAULT_MAX_CONNECTIONS;
    let mut claim = PgClaim::Function;
    let mut named = false;
    let mut rest = Vec::new();
    for (k, v) in u.query_pairs() {
        match &*k {
            "table" => table = v.into_owned(),
            "max_connections" => {
                max_connections = v
                    .parse()
                    .ok()
                    .filter(|n| (1..=1000).contains(n))
                    .ok_or_else(|| {
                        Error::invalid(
                            "max_connections",
                            format!("must be a number from 1 to 1000, got {v:?}"),
                        )
                    })?
            }
            "claim" => {
                claim = match &*v {
                    "function" => PgClaim::Function,
                    "transaction" => PgClaim::Transaction,
                    other => {
                        return Err(Error::invalid(
                            "claim",
                            format!("must be function or transaction, got {other:?}"),
                        ))
                    }
                }
            }
            _ => {
                named |= k == "application_name";
                rest.push((k.into_owned(), v.into_owned()));
            }
        }
    }
    check_table(&table)?;
    if !named {
        rest.push(("application_name".into(), format!("anarchon/{table}")));
    }
    u.query_pairs_mut().clear().extend_pairs(rest);
    Ok(Backend::Postgres(PgTarget {
        url: u.to_string(),
        table,
        max_connections,
        claim,
    }))
}

/// The table prefix goes into identifiers, so it is held to
/// `[a-z_][a-z0-9_]{0,40}`, not ending in `_` (the tables are
/// `<prefix>_runs`, …: `x_` would make `x__runs`).
fn check_table(table: &str) -> Result<()> {
    if table.ends_with('_') {
        return Err(Error::invalid(
            "table",
            format!(
                "{table:?} must not end with _: the tables are named {table}_runs, {table}_jobs, …; \
                 use {:?}",
                table.trim_end_matches('_')
            ),
        ));
    }
    let ok = table.len() <= 41
        && table
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_lowercase() || b == b'_')
        && table
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(
            "table",
            format!("{table:?} must match [a-z_][a-z0-9_]{{0,40}}"),
        ))
    }
}

/// A statement with its parameters bound.
type PgQuery<'q> = sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>;

/// How one attempt failed: a conflict worth another try, or for good.
#[derive(Debug)]
enum Fail {
    /// Serialization failure (40001) or deadlock (40P01).
    Conflict(String),
    Final(Error),
}

type Attempt<T> = std::result::Result<T, Fail>;

impl From<Error> for Fail {
    fn from(e: Error) -> Fail {
        Fail::Final(e)
    }
}

/// Translates sqlx errors: conflicts are retried; a lost connection, a
/// server going down, an exhausted pool or I/O trouble is `UNAVAILABLE`;
/// anything else a store error. Never a win.
impl From<sqlx::Error> for Fail {
    fn from(e: sqlx::Error) -> Fail {
        match &e {
            sqlx::Error::Database(db) => {
                classify(&db.code().unwrap_or_default(), format!("postgres: {db}"))
            }
            sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed => {
                Fail::Final(Error::Unavailable(format!("postgres: {e}")))
            }
            _ => Fail::Final(Error::Store(format!("postgres: {e}"))),
        }
    }
}

/// A database error by its SQLSTATE: a conflict is retried; connection
/// exceptions, insufficient resources (too many connections), operator
/// intervention (shutdown, terminated backend, cancelled statement), a
/// read-only standby after a failover and a lock timeout are
/// `UNAVAILABLE`; anything else a store error.
fn classify(code: &str, message: String) -> Fail {
    match code {
        "40001" | "40P01" => Fail::Conflict(message),
        c if c.starts_with("08")
            || c.starts_with("53")
            || c.starts_with("57")
            || c == "25006"
            || c == "55P03" =>
        {
            Fail::Final(Error::Unavailable(message))
        }
        _ => Fail::Final(Error::Store(message)),
    }
}

impl Fail {
    fn into_error(self) -> Error {
        match self {
            Fail::Conflict(m) => Error::Unavailable(format!(
                "still conflicting after {CONFLICT_RETRIES} retries: {m}"
            )),
            Fail::Final(e) => e,
        }
    }
}

/// Runs `op`, again after a serialization failure or deadlock, a bounded
/// number of times with small jittered backoff.
async fn retry_conflicts<T, F, Fut>(op: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Attempt<T>>,
{
    let policy = ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(2))
        .with_max_delay(Duration::from_millis(50))
        .with_max_times(CONFLICT_RETRIES)
        .with_jitter();
    op.retry(policy)
        .when(|f| matches!(f, Fail::Conflict(_)))
        .notify(|f, after| tracing::debug!(error = ?f, ?after, "postgres conflict, retrying"))
        .await
        .map_err(Fail::into_error)
}

/// The statements, spelled once for the configured prefix.
struct Statements {
    /// Claims, one call of `<prefix>_claim_batch` (see
    /// `migrations/postgres/0006_claim_batch.sql`): per claim, its index in
    /// the arrays (from 1), its error or its decision and run.
    claim_batch: Arc<str>,
    /// The database's clock and the run, without a lock.
    peek: String,
    /// The claim's first statement: upsert the job row (taking its lock),
    /// returning the job's fencing counter and the clock.
    lock_job: String,
    /// Renew/Release/end_lease: lock an existing job row, returning the clock.
    lock_existing_job: String,
    run_for_update: String,
    others: String,
    /// Moves the job's fencing counter on (never back) and writes the run.
    write_run: String,
    renew: String,
    release: String,
    end_lease: String,
    end_leases_of: String,
    history: String,
    prune: String,
    /// Raises an instance's liveness counter; returns it.
    beat: String,
    /// Liveness counters of (node, instance) arrays, read FOR SHARE.
    liveness_for_share: String,
    /// Liveness counters of (node, instance) arrays, without a lock.
    liveness: String,
    /// Deletes liveness records not refreshed since a cutoff.
    prune_liveness: String,
}

impl Statements {
    fn new(p: &str) -> Statements {
        let runs = format!("{p}_runs");
        let jobs = format!("{p}_jobs");
        let liveness = format!("{p}_liveness");
        let liveness_of = format!(
            "SELECT d.n AS node, d.i AS instance, l.counter
             FROM unnest($1::text[], $2::bigint[]) AS d(n, i)
             JOIN {liveness} l ON l.node = d.n AND l.instance = d.i"
        );
        Statements {
            beat: format!(
                "INSERT INTO {liveness} (node, instance, counter, updated_at_ms)
                 VALUES ($1, $2, 1, {NOW_MS})
                 ON CONFLICT (node, instance) DO UPDATE
                   SET counter = {liveness}.counter + 1, updated_at_ms = excluded.updated_at_ms
                 RETURNING counter"
            ),
            liveness_for_share: format!("{liveness_of} FOR SHARE OF l"),
            liveness: liveness_of,
            prune_liveness: format!(
                "DELETE FROM {liveness} WHERE (node, instance) IN (
                   SELECT node, instance FROM {liveness} WHERE updated_at_ms < $1 LIMIT $2)"
            ),
            claim_batch: format!(
                "SELECT o_index AS idx, o_error AS error, o_decision AS decision, o_now_ms AS now_ms,
                   o_overlap_node AS overlap_node, o_overlap_instance AS overlap_instance,
                   o_slot_ms AS slot_ms, o_state AS state, o_attempt AS attempt,
                   o_fencing AS fencing, o_token AS token, o_holder_node AS holder_node,
                   o_holder_instance AS holder_instance, o_lease_until_ms AS lease_until_ms,
                   o_claimed_at_ms AS claimed_at_ms, o_finished_at_ms AS finished_at_ms
                 FROM {p}_claim_batch($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)"
            )
            .into(),
            peek: format!(
                "SELECT {NOW_MS} AS now_ms, {RUN_COLUMNS}
                 FROM (VALUES (1)) AS one LEFT JOIN {runs} ON job = $1 AND slot_ms = $2"
            ),
            lock_job: format!(
                "INSERT INTO {jobs} AS j (job, fence) VALUES ($1, 0)
                 ON CONFLICT (job) DO UPDATE SET fence = j.fence
                 RETURNING j.fence, {NOW_MS} AS now_ms"
            ),
            lock_existing_job: format!(
                "UPDATE {jobs} SET fence = fence WHERE job = $1 RETURNING {NOW_MS} AS now_ms"
            ),
            run_for_update: format!(
                "SELECT {RUN_COLUMNS} FROM {runs} WHERE job = $1 AND slot_ms = $2 FOR UPDATE"
            ),
            others: format!(
                "SELECT {RUN_COLUMNS} FROM {runs}
                 WHERE job = $1 AND state = 'RUNNING' AND slot_ms <> $2 AND lease_until_ms > $3"
            ),
            write_run: format!(
                "WITH fence AS (UPDATE {jobs} SET fence = $12 WHERE job = $1 AND fence < $12) {}",
                sql::upsert_run_sql(&runs)
            ),
            // $3 the clock, $4 the lease asked for (0 = the run's own, see
            // sql::RENEW_LEASE).
            renew: format!(
                "UPDATE {runs} SET lease_until_ms = $3 + {}
                 WHERE job = $1 AND slot_ms = $2 RETURNING lease_until_ms",
                sql::renew_lease("$4", "GREATEST")
            ),
            release: format!(
                "UPDATE {runs} SET state = $3, finished_at_ms = $4 WHERE job = $1 AND slot_ms = $2"
            ),
            end_lease: format!(
                "UPDATE {runs} SET lease_until_ms = $4
                 WHERE job = $1 AND slot_ms = $2 AND token = $3
                   AND state = 'RUNNING' AND lease_until_ms > $4"
            ),
            end_leases_of: format!(
                "WITH c AS (SELECT {NOW_MS} AS now_ms)
                 UPDATE {runs} SET lease_until_ms = c.now_ms FROM c
                 WHERE holder_node = $1 AND holder_instance = $2
                   AND state = 'RUNNING' AND lease_until_ms > c.now_ms"
            ),
            history: format!(
                "SELECT {RUN_COLUMNS} FROM {runs} WHERE job = $1 AND slot_ms < $2
                 ORDER BY slot_ms DESC LIMIT $3"
            ),
            // Only runs whose slot is older than the cutoff too: a slot
            // claimed long before its time must not be forgotten before a late
            // claim of it could still come.
            prune: format!(
                "DELETE FROM {runs} WHERE (job, slot_ms) IN (
                   SELECT job, slot_ms FROM {runs}
                   WHERE claimed_at_ms < $1 AND slot_ms < $1
                     AND (state <> 'RUNNING' OR lease_until_ms < $1)
                   LIMIT $2 FOR UPDATE SKIP LOCKED)"
            ),
        }
    }
}

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
            let mut conn = pool.acquire().await.map_err(Fail::into_error)?;
            migrate(&mut conn, table).await?;
            let select = format!("SELECT value FROM {table}_meta WHERE key = 'store_id'");
            let id: String = sqlx::query_scalar(&select)
                .fetch_one(&mut *conn)
                .await
                .map_err(|e| Fail::from(e).into_error())?;
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
            batcher: batch::Batcher::start(pool.clone(), sql.claim_batch.clone()),
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

/// The advisory lock key that serialises the migrations of one prefix.
fn migration_lock_key(table: &str) -> i64 {
    let digest = Sha256::digest(format!("anarchon migrations {table}").as_bytes());
    let mut key = [0u8; 8];
    key.copy_from_slice(&digest[..8]);
    i64::from_be_bytes(key)
}

/// Applies the embedded migrations that `<table>_migrations` does not list,
/// in one transaction that holds an advisory lock for the prefix: sidecars
/// starting at once against an empty database queue here, and the first one
/// creates the tables while the others then find them done.
async fn migrate(conn: &mut PgConnection, table: &str) -> Result<()> {
    migrate_once(conn, table)
        .await
        .map_err(|f| match f.into_error() {
            Error::Store(m) => Error::Store(format!("postgres migrations failed: {m}")),
            other => other,
        })
}

async fn migrate_once(conn: &mut PgConnection, table: &str) -> Attempt<()> {
    let create = format!(
        "CREATE TABLE IF NOT EXISTS {table}_migrations (
           version    INTEGER     PRIMARY KEY,
           name       TEXT        NOT NULL,
           applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
    );
    let select = format!("SELECT version FROM {table}_migrations");
    let record = format!("INSERT INTO {table}_migrations (version, name) VALUES ($1, $2)");
    let mut tx = conn.begin().await?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(migration_lock_key(table))
        .execute(&mut *tx)
        .await?;
    (&mut *tx).execute(create.as_str()).await?;
    let applied: Vec<i32> = sqlx::query_scalar(&select).fetch_all(&mut *tx).await?;
    for (version, name, text) in MIGRATIONS {
        if applied.contains(version) {
            continue;
        }
        // Several statements: sent as one simple query (no parameters).
        let text = text.replace("{prefix}", table);
        (&mut *tx).execute(text.as_str()).await?;
        sqlx::query(&record)
            .bind(version)
            .bind(name)
            .execute(&mut *tx)
            .await?;
        tracing::info!(version, name, table, "applied postgres migration");
    }
    let known = MIGRATIONS.iter().map(|m| m.0).max().unwrap_or(0);
    if let Some(newer) = applied.iter().copied().filter(|&v| v > known).max() {
        tracing::warn!(
            version = newer,
            known,
            table,
            "the database was migrated by a newer anarchon"
        );
    }
    tx.commit().await?;
    Ok(())
}

/// The run in a row whose run columns may all be NULL (no run).
fn optional_run(row: &PgRow) -> Attempt<Option<RunRow>> {
    if row.try_get::<Option<String>, _>("state")?.is_none() {
        return Ok(None);
    }
    Ok(Some(run_from_row(row)?))
}

/// A claim's answer from a row of `<prefix>_claim` (or of one element of
/// `<prefix>_claim_batch`), under the column names of
/// [`Statements::claim_batch`].
fn answer_of(row: &PgRow, spec: &ClaimSpec) -> Attempt<ClaimAnswer> {
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
    type Err = Fail;

    async fn run(&mut self, job: &Job, slot: SlotMs) -> Attempt<Option<RunRow>> {
        let row = sqlx::query(&self.sql.run_for_update)
            .bind(job.as_str())
            .bind(slot)
            .fetch_optional(&mut *self.conn)
            .await?;
        Ok(row.as_ref().map(run_from_row).transpose()?)
    }

    async fn others(&mut self, job: &Job, slot: SlotMs, now: i64) -> Attempt<Vec<RunRow>> {
        let rows = sqlx::query(&self.sql.others)
            .bind(job.as_str())
            .bind(slot)
            .bind(now)
            .fetch_all(&mut *self.conn)
            .await?;
        Ok(rows.iter().map(run_from_row).collect::<Result<_>>()?)
    }

    async fn next_fence(&mut self, _job: &Job) -> Attempt<u64> {
        // The job row is locked: nobody else moves its counter until COMMIT,
        // and `write` stores the new value together with the run.
        self.fence += 1;
        Ok(self.fence)
    }

    async fn write(&mut self, job: &Job, run: &RunRow) -> Attempt<()> {
        sql::bind_run(sqlx::query(&self.sql.write_run), job, run)
            .bind(self.fence as i64)
            .execute(&mut *self.conn)
            .await?;
        self.wrote = true;
        Ok(())
    }

    async fn extend(&mut self, job: &Job, slot: SlotMs, now: i64, lease_ms: i64) -> Attempt<i64> {
        let lease_until: i64 = sqlx::query_scalar(&self.sql.renew)
            .bind(job.as_str())
            .bind(slot)
            .bind(now)
            .bind(lease_ms)
            .fetch_one(&mut *self.conn)
            .await?;
        Ok(lease_until)
    }

    async fn finish(&mut self, job: &Job, slot: SlotMs, state: RunState, now: i64) -> Attempt<()> {
        sqlx::query(&self.sql.release)
            .bind(job.as_str())
            .bind(slot)
            .bind(state.as_str())
            .bind(now)
            .execute(&mut *self.conn)
            .await?;
        Ok(())
    }

    async fn liveness(&mut self, holders: &[Holder]) -> Attempt<Vec<u64>> {
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
) -> Attempt<Vec<u64>> {
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
        Fut: Future<Output = Attempt<T>>,
    {
        let out = retry_conflicts(op).await;
        if let Err(Error::Unavailable(e)) = &out {
            tracing::warn!(error = %e, "postgres unavailable");
            self.pool.mark_outage();
        }
        out
    }

    /// One statement on a lent connection; the rows it changed.
    async fn execute(&self, q: PgQuery<'_>) -> Attempt<u64> {
        let mut conn = self.pool.acquire().await?;
        let n = q.execute(&mut *conn).await?.rows_affected();
        conn.done();
        Ok(n)
    }

    /// One query on a lent connection; its rows.
    async fn fetch_all(&self, q: PgQuery<'_>) -> Attempt<Vec<PgRow>> {
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
    ) -> Attempt<(i64, Option<RunRow>)> {
        let row = sqlx::query(&self.sql.peek)
            .bind(job.as_str())
            .bind(slot)
            .fetch_one(conn)
            .await?;
        Ok((row.try_get("now_ms")?, optional_run(&row)?))
    }

    /// Locks an existing job row; `None` when the job has no row (so no runs).
    async fn lock_existing_job(&self, conn: &mut PgConnection, job: &Job) -> Attempt<Option<i64>> {
        Ok(sqlx::query_scalar(&self.sql.lock_existing_job)
            .bind(job.as_str())
            .fetch_optional(conn)
            .await?)
    }

    async fn claim_transaction(
        &self,
        spec: &ClaimSpec,
        dead: &DeadHolders,
    ) -> Attempt<ClaimAnswer> {
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

    /// The run, read without a lock.
    async fn snapshot(&self, job: &Job, slot: SlotMs) -> Attempt<Option<RunRow>> {
        let mut conn = self.pool.acquire().await?;
        let (_, run) = self.peek(&mut conn, job, slot).await?;
        conn.done();
        Ok(run)
    }

    /// For renew and release: takes the job's lock and returns the clock
    /// after it. A job without a row has no runs.
    async fn lock_job_of_run(&self, conn: &mut PgConnection, job: &Job) -> Attempt<i64> {
        Ok(self
            .lock_existing_job(conn, job)
            .await?
            .ok_or_else(|| Error::NotFound("no such run".into()))?)
    }

    async fn renew_once(&self, spec: &RenewSpec, dead: &DeadHolders) -> Attempt<Renewed> {
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

    async fn release_once(&self, spec: &ReleaseSpec, dead: &DeadHolders) -> Attempt<()> {
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

    async fn end_lease_once(&self, job: &Job, slot_ms: SlotMs, token: &Token) -> Attempt<bool> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn target(url: &str) -> PgTarget {
        match parse_url(url).unwrap() {
            Backend::Postgres(t) => t,
            other => panic!("not postgres: {other:?}"),
        }
    }

    #[test]
    fn urls() {
        let t = target("postgres://u@h:5433/db?table=t_1&sslmode=disable");
        assert_eq!(
            t,
            PgTarget {
                url: "postgres://u@h:5433/db?sslmode=disable&application_name=anarchon%2Ft_1"
                    .into(),
                table: "t_1".into(),
                max_connections: DEFAULT_MAX_CONNECTIONS,
                claim: PgClaim::Function,
            }
        );
        let t =
            target("postgresql://u@h/db?application_name=x&max_connections=3&claim=transaction");
        assert_eq!(t.url, "postgresql://u@h/db?application_name=x");
        assert_eq!(t.table, DEFAULT_TABLE);
        assert_eq!(t.max_connections, 3);
        assert_eq!(t.claim, PgClaim::Transaction);
        assert!(matches!(
            parse_url("postgres://u@h/db?claim=lua"),
            Err(Error::InvalidArgument { field: "claim", .. })
        ));
    }

    #[test]
    fn table_prefix_is_checked_and_named() {
        for bad in [
            "",
            "1abc",
            "A",
            "a-b",
            "a;drop",
            &"a".repeat(42),
            "ü",
            "x_",
            "_",
        ] {
            let e = parse_url(&format!("postgres://u@h/db?table={bad}")).unwrap_err();
            assert!(
                matches!(e, Error::InvalidArgument { field: "table", .. }),
                "{bad}: {e}"
            );
        }
        for good in ["_a", "a", "anarchon", "t_0f", &"a".repeat(41)] {
            assert!(parse_url(&format!("postgres://u@h/db?table={good}")).is_ok());
        }
        let e = parse_url("postgres://u@h/db?max_connections=0").unwrap_err();
        assert!(matches!(
            e,
            Error::InvalidArgument {
                field: "max_connections",
                ..
            }
        ));
    }

    /// A server error with just a SQLSTATE.
    #[derive(Debug)]
    struct Coded(&'static str);

    impl std::fmt::Display for Coded {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "sqlstate {}", self.0)
        }
    }

    impl std::error::Error for Coded {}

    impl sqlx::error::DatabaseError for Coded {
        fn message(&self) -> &str {
            self.0
        }
        fn code(&self) -> Option<std::borrow::Cow<'_, str>> {
            Some(self.0.into())
        }
        fn as_error(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn as_error_mut(&mut self) -> &mut (dyn std::error::Error + Send + Sync + 'static) {
            self
        }
        fn into_error(self: Box<Self>) -> Box<dyn std::error::Error + Send + Sync + 'static> {
            self
        }
        fn kind(&self) -> sqlx::error::ErrorKind {
            sqlx::error::ErrorKind::Other
        }
    }

    fn db(code: &'static str) -> sqlx::Error {
        sqlx::Error::Database(Box::new(Coded(code)))
    }

    #[test]
    fn errors_are_translated() {
        for c in ["40001", "40P01"] {
            assert!(matches!(Fail::from(db(c)), Fail::Conflict(_)), "{c}");
        }
        for c in [
            "08006", "57P01", "57P03", "53300", "25006", "55P03", "57014",
        ] {
            assert!(
                matches!(Fail::from(db(c)).into_error(), Error::Unavailable(_)),
                "{c}"
            );
        }
        for c in ["23505", "42P01", "22P02"] {
            assert!(
                matches!(Fail::from(db(c)).into_error(), Error::Store(_)),
                "{c}"
            );
        }
        let io = sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        for e in [io, sqlx::Error::PoolTimedOut, sqlx::Error::PoolClosed] {
            assert!(matches!(Fail::from(e).into_error(), Error::Unavailable(_)));
        }
        assert!(matches!(
            Fail::from(sqlx::Error::RowNotFound).into_error(),
            Error::Store(_)
        ));
    }

    #[tokio::test]
    async fn conflicts_are_retried_a_bounded_number_of_times() {
        use std::sync::atomic::Ordering;
        let tries = std::sync::atomic::AtomicUsize::new(0);
        let out = retry_conflicts(|| async {
            match tries.fetch_add(1, Ordering::SeqCst) {
                0 | 1 => Err(Fail::from(db("40P01"))),
                _ => Ok(7),
            }
        })
        .await;
        assert_eq!(out.unwrap(), 7);
        assert_eq!(tries.load(Ordering::SeqCst), 3);

        tries.store(0, Ordering::SeqCst);
        let out: Result<()> = retry_conflicts(|| async {
            tries.fetch_add(1, Ordering::SeqCst);
            Err(Fail::from(db("40001")))
        })
        .await;
        assert!(matches!(out, Err(Error::Unavailable(_))), "{out:?}");
        assert_eq!(tries.load(Ordering::SeqCst), CONFLICT_RETRIES + 1);

        // Anything else is not retried.
        tries.store(0, Ordering::SeqCst);
        let out: Result<()> = retry_conflicts(|| async {
            tries.fetch_add(1, Ordering::SeqCst);
            Err(Fail::from(db("57P01")))
        })
        .await;
        assert!(matches!(out, Err(Error::Unavailable(_))));
        assert_eq!(tries.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn lock_keys_differ_per_prefix() {
        assert_ne!(migration_lock_key("a"), migration_lock_key("b"));
        assert_eq!(migration_lock_key("a"), migration_lock_key("a"));
    }
}
