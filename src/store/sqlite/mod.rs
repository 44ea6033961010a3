//! The SQLite store: the embedded default.
//!
//! Why the step is atomic: every write opens with `BEGIN IMMEDIATE`, which
//! takes SQLite's single database write lock *before* the run is read, so the
//! read, the decision and the write happen while no other connection — in
//! this process or in any other process sharing the file — can write.
//! Contenders wait up to `busy_timeout`. Inside this process every write goes
//! through one writer task ([`writer`]), which gathers the operations that
//! arrive together into one transaction (group commit), each decided on its
//! own under the lock. `now` is the host clock, read after the lock is taken
//! (every writer of the file shares that clock).
//!
//! Most claims never write: a plain `SELECT` first answers finished runs,
//! live leases and resends; only a missing run or a lapsed lease enters the
//! write transaction, which reads and decides again under the lock.

mod flush;
mod writer;

use std::path::Path;
use std::str::FromStr;

use async_trait::async_trait;
use rusqlite::params;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};

use super::backend_url::{count, split_options};
use super::sql::{self, run_from_row, RUN_COLUMNS};
use super::{Backend, Leases, Store, StoreInfo, StoreOptions};
use crate::claim::*;
use crate::error::{Error, Result};
pub(super) use writer::MAX_BATCH;
use writer::{now, Phase, Writer};

/// Parses `sqlite://PATH[?max_batch=N]`. `max_batch` (1 to [`MAX_BATCH`],
/// default [`MAX_BATCH`]) bounds the writes of one group commit; 1 commits
/// every write on its own. Any other option is refused by name.
pub(super) fn parse_url(url: &str) -> Result<Backend> {
    let opts = split_options(url, &["max_batch"], &[])?;
    opts.each_once()?;
    let path = opts.base.strip_prefix("sqlite://").unwrap_or_default();
    if path.is_empty() {
        return Err(Error::invalid("backend", "sqlite:// needs a file path"));
    }
    let max_batch = match opts.get("max_batch") {
        None => MAX_BATCH,
        Some(v) => count("max_batch", v, MAX_BATCH)?,
    };
    Ok(Backend::Sqlite {
        path: path.to_owned(),
        max_batch,
    })
}

/// The SQLite store: sqlx runs the migrations and the reads that never
/// write (history, ping); every operation that may write goes to the
/// [`Writer`] thread.
pub struct SqliteStore {
    pool: SqlitePool,
    writer: Writer,
    info: StoreInfo,
}

impl SqliteStore {
    /// Opens (creating it if need be) the file at `path` and starts its
    /// writer, whose transactions carry up to `max_batch` writes.
    pub async fn open(path: &str, max_batch: usize, opts: &StoreOptions) -> Result<SqliteStore> {
        if let Some(dir) = Path::new(path).parent() {
            if !dir.as_os_str().is_empty() {
                std::fs::create_dir_all(dir).map_err(|e| {
                    Error::Unavailable(format!("cannot create {}: {e}", dir.display()))
                })?;
            }
        }
        // One opener at a time, from connecting to the writer's start: a new
        // file is turned to WAL (an exclusive lock, which SQLite refuses at
        // once, busy handler or not, while another connection reads the
        // file) and then migrated; stores opening it together were refused
        // as busy.
        let lock = open_lock(path).await?;
        let connect = SqliteConnectOptions::from_str("sqlite://")
            .map_err(convert)?
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(opts.busy_timeout)
            .foreign_keys(false);
        let pool = SqlitePoolOptions::new()
            .max_connections(4)
            .min_connections(1)
            .connect_with(connect)
            .await
            .map_err(convert)?;
        sqlx::migrate!("./migrations/sqlite")
            .run(&pool)
            .await
            .map_err(|e| Error::Store(format!("sqlite migrations failed: {e}")))?;
        let id: String = sqlx::query_scalar("SELECT value FROM meta WHERE key = 'store_id'")
            .fetch_one(&pool)
            .await
            .map_err(convert)?;
        let writer = Writer::start(path, opts.busy_timeout, max_batch)?;
        drop(lock);
        Ok(SqliteStore {
            pool,
            writer,
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

/// An exclusive lock on a file next to the database (`PATH.migrate.lock`),
/// held while a store opens the database, so that several processes
/// starting at once open, convert and migrate it one after another.
async fn open_lock(path: &str) -> Result<std::fs::File> {
    let lock_path = format!("{path}.migrate.lock");
    tokio::task::spawn_blocking(move || -> std::io::Result<std::fs::File> {
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)?;
        f.lock()?;
        Ok(f)
    })
    .await
    .map_err(|e| Error::Store(format!("open lock task: {e}")))?
    .map_err(|e| Error::Unavailable(format!("cannot lock {path}.migrate.lock: {e}")))
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

#[async_trait]
impl Store for SqliteStore {
    fn info(&self) -> &StoreInfo {
        &self.info
    }

    async fn claim(&self, spec: &ClaimSpec, dead: &DeadHolders) -> Result<ClaimAnswer> {
        let (spec, dead) = (spec.clone(), dead.clone());
        self.writer
            .run(move |a, phase| match phase {
                // Most answers need no write lock.
                Phase::Read => {
                    let run = a.read_run(&spec.job, spec.slot_ms)?;
                    let now_ms = host_now_ms();
                    now(sql::answer_without_write(
                        a,
                        &spec,
                        &dead,
                        now_ms,
                        run.as_ref(),
                    ))
                }
                // Decide again under the write lock, and write.
                Phase::Locked { now: now_ms } => {
                    now(sql::claim_locked(a, &spec, &dead, now_ms)).map(Some)
                }
            })
            .await
    }

    async fn release(&self, spec: &ReleaseSpec, dead: &DeadHolders) -> Result<()> {
        let (spec, dead) = (spec.clone(), dead.clone());
        self.writer
            .run(move |a, phase| match phase {
                Phase::Read => {
                    let run = a.read_run(&spec.job, spec.slot_ms)?;
                    Ok((decide_release(run.as_ref(), &spec.token, &dead)?
                        == ReleaseDecision::AlreadyReleased)
                        .then_some(()))
                }
                Phase::Locked { now: now_ms } => {
                    now(sql::release_locked(a, &spec, &dead, now_ms)).map(Some)
                }
            })
            .await
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
        let (spec, dead) = (spec.clone(), dead.clone());
        self.writer
            .run(move |a, phase| match phase {
                // Refuse without the write lock when a plain read says so.
                Phase::Read => {
                    let run = a.read_run(&spec.job, spec.slot_ms)?;
                    decide_renew(run.as_ref(), &spec.token, &dead)?;
                    Ok(None)
                }
                Phase::Locked { now: now_ms } => {
                    now(sql::renew_locked(a, &spec, &dead, now_ms)).map(Some)
                }
            })
            .await
    }

    async fn end_lease(&self, job: &Job, slot_ms: SlotMs, token: &Token) -> Result<bool> {
        let (job, token) = (job.clone(), token.clone());
        self.writer
            .run(move |a, phase| match phase {
                Phase::Read => Ok(None),
                Phase::Locked { now } => {
                    let n = a.execute(
                        "UPDATE runs SET lease_until_ms = ?1 WHERE job = ?2 AND slot_ms = ?3 AND token = ?4 AND state = 'RUNNING' AND lease_until_ms > ?1",
                        params![now, job.as_str(), slot_ms, token.as_str()],
                    )?;
                    Ok(Some(n > 0))
                }
            })
            .await
    }

    async fn end_leases_of(&self, holder: &Holder) -> Result<u64> {
        // No index carries the holder (migration 0006): the runs it holds
        // are found with a plain read on the pool, beside the writer, so
        // that the scan holds up no claim; the writer then ends each one
        // that is still running under this holder with a current lease. A
        // run the holder wins after the read keeps its lease, which runs out
        // as usual (and the holder has left the mesh by now, so peers take
        // its runs over as a dead holder's).
        let held: Vec<(String, i64)> = sqlx::query_as(
            "SELECT job, slot_ms FROM runs
             WHERE state = 'RUNNING' AND holder_node = ?1 AND holder_instance = ?2",
        )
        .bind(holder.node.as_str())
        .bind(holder.instance as i64)
        .fetch_all(&self.pool)
        .await
        .map_err(convert)?;
        if held.is_empty() {
            return Ok(0);
        }
        let holder = holder.clone();
        self.writer
            .run(move |a, phase| match phase {
                Phase::Read => Ok(None),
                Phase::Locked { now } => {
                    let mut ended = 0;
                    for (job, slot) in &held {
                        ended += a.execute(
                            "UPDATE runs SET lease_until_ms = ?1
                             WHERE job = ?2 AND slot_ms = ?3 AND state = 'RUNNING'
                               AND holder_node = ?4 AND holder_instance = ?5 AND lease_until_ms > ?1",
                            params![now, job, slot, holder.node, holder.instance as i64],
                        )?;
                    }
                    Ok(Some(ended))
                }
            })
            .await
    }

    async fn prune(&self, cutoff_ms: i64, batch: u32) -> Result<u64> {
        self.writer
            .run(move |a, phase| match phase {
                Phase::Read => Ok(None),
                Phase::Locked { .. } => {
                    // Each job's runs by the primary key, slots below the
                    // cutoff (no index on claimed_at_ms: migration 0005);
                    // CROSS JOIN keeps jobs the outer loop.
                    let n = a.execute(
                        "DELETE FROM runs WHERE (job, slot_ms) IN (
                           SELECT r.job, r.slot_ms FROM jobs j
                           CROSS JOIN runs r ON r.job = j.job AND r.slot_ms < ?1
                           WHERE r.claimed_at_ms < ?1 AND (r.state <> 'RUNNING' OR r.lease_until_ms < ?1)
                           LIMIT ?2)",
                        params![cutoff_ms, batch as i64],
                    )?;
                    // Liveness records of instances gone for longer than the retention.
                    a.execute(
                        "DELETE FROM liveness WHERE (node, instance) IN (
                           SELECT node, instance FROM liveness WHERE updated_at_ms < ?1 LIMIT ?2)",
                        params![cutoff_ms, batch as i64],
                    )?;
                    Ok(Some(n))
                }
            })
            .await
    }

    fn keeps_liveness(&self) -> bool {
        true
    }

    async fn beat(&self, holder: &Holder) -> Result<u64> {
        let holder = holder.clone();
        self.writer
            .run(move |a, phase| match phase {
                Phase::Read => Ok(None),
                Phase::Locked { now } => {
                    let counter = a.scalar(
                        "INSERT INTO liveness (node, instance, counter, updated_at_ms) VALUES (?1, ?2, 1, ?3)
                         ON CONFLICT (node, instance) DO UPDATE
                           SET counter = counter + 1, updated_at_ms = excluded.updated_at_ms
                         RETURNING counter",
                        params![holder.node, holder.instance as i64, now],
                    )?;
                    Ok(Some(counter as u64))
                }
            })
            .await
    }

    async fn beats_of(&self, holders: &[Holder]) -> Result<Vec<u64>> {
        let holders = holders.to_vec();
        self.writer
            .run(move |a, phase| match phase {
                Phase::Read => a.read_liveness(&holders).map(Some),
                Phase::Locked { .. } => Ok(None),
            })
            .await
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc as std_mpsc;
    use std::time::Duration;

    use super::*;

    async fn store(dir: &tempfile::TempDir) -> SqliteStore {
        store_with(dir, MAX_BATCH, &StoreOptions::default()).await
    }

    async fn store_with(
        dir: &tempfile::TempDir,
        max_batch: usize,
        opts: &StoreOptions,
    ) -> SqliteStore {
        let path = dir.path().join("a.db");
        SqliteStore::open(path.to_str().unwrap(), max_batch, opts)
            .await
            .unwrap()
    }

    fn meta_write(
        key: impl Into<String>,
        fail: bool,
    ) -> impl FnMut(&mut writer::Access<'_>, Phase) -> Result<Option<()>> + Send {
        let key = key.into();
        move |a, phase| match phase {
            Phase::Read => Ok(None),
            Phase::Locked { .. } => {
                a.execute(
                    "INSERT INTO meta (key, value) VALUES (?1, 'x')",
                    params![key],
                )?;
                if fail {
                    return Err(Error::Store("failed after its write".into()));
                }
                Ok(Some(()))
            }
        }
    }

    async fn has_key(s: &SqliteStore, key: &str) -> bool {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM meta WHERE key = ?")
            .bind(key)
            .fetch_one(&s.pool)
            .await
            .unwrap()
            == 1
    }

    /// Three writes (the second fails after writing) queued together behind
    /// a blocker on the writer; returns the transactions they took and
    /// their answers. The blocker holds the writer's runtime thread: the
    /// caller's runtime needs another one (`multi_thread`).
    async fn three_queued_writes(s: &SqliteStore) -> (u64, [Result<()>; 3]) {
        // The writer waits in this plain read until `go`; the three
        // writes are sent only once it waits there, so they queue up behind
        // it and run as one batch (sent before, one of them could share the
        // blocker's batch and the rest make a second one).
        let (go, wait) = std_mpsc::channel::<()>();
        let (started, waiting) = tokio::sync::oneshot::channel::<()>();
        let mut started = Some(started);
        let blocker = s.writer.run(move |_, phase| {
            if let Phase::Read = phase {
                if let Some(started) = started.take() {
                    let _ = started.send(());
                }
                let _ = wait.recv_timeout(Duration::from_secs(10));
            }
            Ok(Some(()))
        });
        let commits = s.writer.commits();
        let writes = async {
            waiting.await.unwrap();
            // The go comes from a thread of its own, not from a runtime
            // timer: while the blocker holds a worker, the runtime's timers
            // may not be driven at all (the other worker sleeps until it has
            // a task), and the blocker would wait its whole 10 s.
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                go.send(()).unwrap();
            });
            tokio::join!(
                s.writer.run(meta_write("ok1", false)),
                s.writer.run(meta_write("bad", true)),
                s.writer.run(meta_write("ok2", false)),
            )
        };
        let (held, (ok1, bad, ok2)) = tokio::join!(blocker, writes);
        held.unwrap();
        (s.writer.commits() - commits, [ok1, bad, ok2])
    }

    /// An operation that logs the phases it ran in, and writes `key` under
    /// the lock (or nothing, without a key).
    fn logged(
        key: Option<&'static str>,
        log: std::sync::Arc<std::sync::Mutex<Vec<(&'static str, &'static str)>>>,
    ) -> impl FnMut(&mut writer::Access<'_>, Phase) -> Result<Option<()>> + Send {
        let name = key.unwrap_or("none");
        move |a, phase| match phase {
            Phase::Read => {
                log.lock().unwrap().push((name, "read"));
                Ok(None)
            }
            Phase::Locked { .. } => {
                log.lock().unwrap().push((name, "locked"));
                if let Some(key) = key {
                    a.execute(
                        "INSERT INTO meta (key, value) VALUES (?1, 'x')",
                        params![key],
                    )?;
                }
                Ok(Some(()))
            }
        }
    }

    /// The plain read before the lock runs only while it pays: after a
    /// batch in which every operation wrote, the next goes straight to the
    /// lock; one operation that wrote nothing turns the reads back on.
    #[tokio::test]
    async fn the_reads_before_the_lock_stop_while_every_operation_writes() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(&dir).await;
        let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        // Settles the open's own batches: the store may have written (or
        // not) while it opened.
        s.writer.run(logged(None, log.clone())).await.unwrap();
        log.lock().unwrap().clear();
        for key in [Some("w1"), Some("w2"), None, Some("w3"), Some("w4")] {
            s.writer.run(logged(key, log.clone())).await.unwrap();
        }
        assert_eq!(
            *log.lock().unwrap(),
            [
                ("w1", "read"), // the last batch wrote nothing
                ("w1", "locked"),
                ("w2", "locked"), // w1 wrote: no read
                ("none", "locked"),
                ("w3", "read"), // `none` wrote nothing: the reads are back
                ("w3", "locked"),
                ("w4", "locked"),
            ]
        );
        for key in ["w1", "w2", "w3", "w4"] {
            assert!(has_key(&s, key).await, "{key}");
        }
    }

    fn claim_spec(job: &Job, slot_ms: i64, node: &str, overlap: Overlap) -> ClaimSpec {
        ClaimSpec {
            job: job.clone(),
            slot_ms,
            token: Token::generate(),
            holder: Holder {
                node: node.into(),
                instance: 1,
            },
            lease_ms: 60_000,
            max_late_ms: 60_000,
            overlap,
            max_attempts: 3,
        }
    }

    /// A claim by `node` with no holder dead.
    async fn claim_as(
        s: &SqliteStore,
        job: &Job,
        slot_ms: i64,
        node: &str,
        overlap: Overlap,
    ) -> ClaimAnswer {
        s.claim(
            &claim_spec(job, slot_ms, node, overlap),
            &DeadHolders::default(),
        )
        .await
        .unwrap()
    }

    /// (jobs.watch, the run's watch) as stored, for migration 0006.
    async fn watch_of(s: &SqliteStore, job: &Job, slot_ms: i64) -> (Option<i64>, Option<i64>) {
        let job_flag = sqlx::query_scalar("SELECT watch FROM jobs WHERE job = ?")
            .bind(job.as_str())
            .fetch_optional(&s.pool)
            .await
            .unwrap();
        let run_flag = sqlx::query_scalar("SELECT watch FROM runs WHERE job = ? AND slot_ms = ?")
            .bind(job.as_str())
            .bind(slot_ms)
            .fetch_optional(&s.pool)
            .await
            .unwrap();
        (job_flag, run_flag)
    }

    /// Runs one claim flow in the phase asked for, on the writer: the
    /// plain read before the lock (`locked` false; `None` when it does not
    /// settle the claim) or the decision under it.
    async fn claim_in(s: &SqliteStore, spec: &ClaimSpec, locked: bool) -> Option<ClaimAnswer> {
        // An operation that writes nothing turns the plain reads back on
        // for the next batch.
        s.writer.run(|_, _| Ok(Some(()))).await.unwrap();
        let spec = spec.clone();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let mut tx = Some(tx);
        s.writer
            .run(move |a, phase| {
                let got = match phase {
                    Phase::Read if locked => return Ok(None),
                    Phase::Read => {
                        let run = a.read_run(&spec.job, spec.slot_ms)?;
                        now(sql::answer_without_write(
                            a,
                            &spec,
                            &DeadHolders::default(),
                            host_now_ms(),
                            run.as_ref(),
                        ))?
                    }
                    Phase::Locked { .. } if !locked => panic!("the plain read was skipped"),
                    Phase::Locked { now: now_ms } => Some(now(sql::claim_locked(
                        a,
                        &spec,
                        &DeadHolders::default(),
                        now_ms,
                    ))?),
                };
                if let Some(tx) = tx.take() {
                    let _ = tx.send(got);
                }
                Ok(Some(()))
            })
            .await
            .unwrap();
        rx.await.unwrap()
    }

    /// Migration 0006: a job's running runs are indexed only once a SKIP
    /// claim has asked about the job, and a SKIP claim sees every running
    /// run of the job either way: through the primary key in the plain read
    /// before the lock, through the index under it, after marking them.
    #[tokio::test]
    async fn a_skip_claim_sees_runs_won_before_the_job_was_watched() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(&dir).await;
        let job = Job::parse("watched-later").unwrap();
        let t = host_now_ms();
        let won = claim_as(&s, &job, t - 1_000, "a", Overlap::Allow).await;
        assert_eq!(won.outcome, Outcome::Won, "{won:?}");
        assert_eq!(
            watch_of(&s, &job, t - 1_000).await,
            (Some(0), Some(0)),
            "an ALLOW job is not watched, its run not indexed"
        );
        let skip = claim_spec(&job, t, "b", Overlap::Skip);
        // The plain read: the job is not watched, its runs are read by key.
        let read = claim_in(&s, &skip, false)
            .await
            .expect("the read settles it");
        assert_eq!(read.outcome, Outcome::Overlap, "{read:?}");
        assert_eq!(watch_of(&s, &job, t - 1_000).await, (Some(0), Some(0)));
        // Under the lock: the job becomes watched, its running run marked.
        let locked = claim_in(&s, &skip, true).await.expect("decided");
        assert_eq!(locked.outcome, Outcome::Overlap, "{locked:?}");
        assert_eq!(watch_of(&s, &job, t - 1_000).await, (Some(1), Some(1)));
        // Runs won from then on are indexed, and seen through the index.
        let later = claim_as(&s, &job, t + 1_000, "c", Overlap::Allow).await;
        assert_eq!(later.outcome, Outcome::Won, "{later:?}");
        assert_eq!(watch_of(&s, &job, t + 1_000).await, (Some(1), Some(1)));
        let mut dead = DeadHolders::default();
        dead.mark_dead(Holder {
            node: "a".into(),
            instance: 1,
        });
        let mut skip2 = claim_spec(&job, t + 2_000, "d", Overlap::Skip);
        let o = s.claim(&skip2, &dead).await.unwrap();
        assert_eq!(
            o.outcome,
            Outcome::Overlap,
            "c's run, found by the index: {o:?}"
        );
        dead.mark_dead(Holder {
            node: "c".into(),
            instance: 1,
        });
        skip2.token = Token::generate();
        let w = s.claim(&skip2, &dead).await.unwrap();
        assert_eq!(w.outcome, Outcome::Won, "{w:?}");
        // A SKIP claim on a job with no row yet makes it watched with fence
        // 0, and its first win still draws fencing 1.
        let fresh = Job::parse("watched-first").unwrap();
        let first = claim_as(&s, &fresh, t, "a", Overlap::Skip).await;
        assert_eq!(
            (first.outcome, first.fencing),
            (Outcome::Won, 1),
            "{first:?}"
        );
        assert_eq!(watch_of(&s, &fresh, t).await, (Some(1), Some(1)));
    }

    /// A file migrated before 0006 keeps its running runs visible to SKIP
    /// claims: its jobs start unwatched, its runs marked by the default.
    #[tokio::test]
    async fn runs_written_before_the_watch_flag_stay_seen_by_skip_claims() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.db");
        let job = Job::parse("from-before").unwrap();
        let t = host_now_ms();
        {
            // The schema up to migration 0005, and a run an earlier sidecar won.
            let connect = SqliteConnectOptions::from_str("sqlite://")
                .unwrap()
                .filename(&path)
                .create_if_missing(true)
                .journal_mode(SqliteJournalMode::Wal);
            let pool = SqlitePoolOptions::new()
                .max_connections(1)
                .connect_with(connect)
                .await
                .unwrap();
            let mut m = sqlx::migrate!("./migrations/sqlite");
            let before: Vec<_> = m
                .migrations
                .iter()
                .filter(|m| m.version < 6)
                .cloned()
                .collect();
            assert_eq!(before.len(), 5);
            m.migrations = before.into();
            m.run(&pool).await.unwrap();
            sqlx::query("INSERT INTO jobs (job, fence) VALUES (?, 1)")
                .bind(job.as_str())
                .execute(&pool)
                .await
                .unwrap();
            sqlx::query(
                "INSERT INTO runs (job, slot_ms, state, attempt, fencing, token, holder_node,
                   holder_instance, lease_until_ms, claimed_at_ms)
                 VALUES (?, ?, 'RUNNING', 1, 1, ?, 'old', 1, ?, ?)",
            )
            .bind(job.as_str())
            .bind(t - 1_000)
            .bind(Token::generate().as_str())
            .bind(t + 60_000)
            .bind(t - 1_000)
            .execute(&pool)
            .await
            .unwrap();
            pool.close().await;
        }
        let s = store(&dir).await;
        assert_eq!(watch_of(&s, &job, t - 1_000).await, (Some(0), Some(1)));
        let skip = claim_spec(&job, t, "b", Overlap::Skip);
        let read = claim_in(&s, &skip, false)
            .await
            .expect("the read settles it");
        assert_eq!(read.outcome, Outcome::Overlap, "{read:?}");
        let locked = claim_in(&s, &skip, true).await.expect("decided");
        assert_eq!(locked.outcome, Outcome::Overlap, "{locked:?}");
        assert_eq!(watch_of(&s, &job, t - 1_000).await, (Some(1), Some(1)));
    }

    /// A leaving holder's runs are found without an index and ended; other
    /// holders' runs keep their leases.
    #[tokio::test]
    async fn a_leaving_holder_ends_its_runs_without_an_index() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(&dir).await;
        let t = host_now_ms();
        let (j1, j2) = (
            Job::parse("leave-1").unwrap(),
            Job::parse("leave-2").unwrap(),
        );
        for (job, slot, node) in [(&j1, t, "gone"), (&j2, t, "gone"), (&j2, t + 1, "stays")] {
            let a = claim_as(&s, job, slot, node, Overlap::Allow).await;
            assert_eq!(a.outcome, Outcome::Won, "{a:?}");
        }
        let gone = Holder {
            node: "gone".into(),
            instance: 1,
        };
        assert_eq!(s.end_leases_of(&gone).await.unwrap(), 2);
        assert_eq!(s.end_leases_of(&gone).await.unwrap(), 0, "already ended");
        let taken = claim_as(&s, &j1, t, "new", Overlap::Allow).await;
        assert_eq!(
            (taken.outcome, taken.attempt),
            (Outcome::Won, 2),
            "{taken:?}"
        );
        let kept = claim_as(&s, &j2, t + 1, "new", Overlap::Allow).await;
        assert_eq!(kept.outcome, Outcome::Running, "{kept:?}");
    }

    /// In one batch, an operation that fails after writing is answered with
    /// its own error and leaves nothing; the others commit, once each (the
    /// batch ran again with savepoints: `ok1`, written before the failure,
    /// would break its key's uniqueness had the first pass been kept).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_failing_operation_does_not_fail_its_batch() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(&dir).await;
        let (commits, answers) = three_queued_writes(&s).await;
        assert_eq!(commits, 1, "the three writes are one batch");
        each_answered_on_its_own(&s, answers).await;
    }

    /// The answers of [`three_queued_writes`], however they were committed:
    /// the two good writes land, the failing one is answered with its own
    /// error and leaves nothing.
    async fn each_answered_on_its_own(s: &SqliteStore, [ok1, bad, ok2]: [Result<()>; 3]) {
        ok1.unwrap();
        assert!(matches!(bad, Err(Error::Store(_))), "{bad:?}");
        ok2.unwrap();
        assert!(has_key(s, "ok1").await);
        assert!(!has_key(s, "bad").await);
        assert!(has_key(s, "ok2").await);
    }

    /// `max_batch=1`: the same queued writes commit one by one, with the
    /// same answers.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn max_batch_one_commits_every_write_on_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let s = store_with(&dir, 1, &StoreOptions::default()).await;
        let (commits, answers) = three_queued_writes(&s).await;
        // The failing write rolls its own transaction back: two commits.
        assert_eq!(commits, 2, "one transaction per write");
        each_answered_on_its_own(&s, answers).await;
    }

    /// Writes `n` values of 16,000 bytes under `tag`, one operation each.
    async fn write_big(s: &SqliteStore, tag: &str, n: usize) {
        for i in 0..n {
            let key = format!("{tag}{i}");
            s.writer
                .run(move |a, phase| match phase {
                    Phase::Read => Ok(None),
                    Phase::Locked { .. } => {
                        a.execute(
                            "INSERT INTO meta (key, value) VALUES (?1, hex(zeroblob(8000)))",
                            params![key],
                        )?;
                        Ok(Some(()))
                    }
                })
                .await
                .unwrap();
        }
    }

    fn file_len(path: &Path) -> u64 {
        std::fs::metadata(path).map_or(0, |m| m.len())
    }

    /// Under writes without a pause the WAL still starts over: the writer
    /// checkpoints between its own batches, so each checkpoint can copy the
    /// whole WAL and the next transaction starts it over. (A checkpoint on
    /// another connection never let it start over; see `CHECKPOINT_FRAMES`.
    /// SQLite's own checkpoint, the backstop, would let the WAL reach 64 MiB.)
    #[tokio::test]
    async fn the_wal_stays_bounded_under_writes_without_a_pause() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(&dir).await;
        // 16 writers of 400 values each: over 100 MB through the WAL, in
        // batches. The WAL file keeps its largest size, so its size at the
        // end is the most it ever held: 16 MiB (4,000 pages) and the batch
        // that passed them. A WAL that never starts over holds it all
        // (181 MB, measured with the writer's checkpoint turned off).
        let writers = (0..16).map(|w| {
            let s = &s;
            async move { write_big(s, &format!("w{w}-"), 400).await }
        });
        futures::future::join_all(writers).await;
        let wal = file_len(&dir.path().join("a.db-wal"));
        assert!(
            wal <= 24 << 20,
            "the WAL grew to {wal} bytes for 102 MB written: it did not start over"
        );
    }

    /// The flusher syncs the WAL after commits ([`flush`]), and only after
    /// them: a store that has committed nothing has synced nothing, and a
    /// burst of commits is synced at least once, never more often than it
    /// committed.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn commits_are_synced_to_disk_in_the_background() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(&dir).await;
        assert_eq!(s.writer.flushes(), 0, "synced before any commit");
        for w in 0..50 {
            s.writer
                .run(meta_write(format!("k{w}"), false))
                .await
                .unwrap();
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while s.writer.flushes() == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "50 commits, and no sync of the WAL in 10 s"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let (flushes, commits) = (s.writer.flushes(), s.writer.commits());
        assert!(
            flushes <= commits,
            "{flushes} syncs for {commits} commits: the flusher syncs only after a commit"
        );
    }

    /// Stores that open one new file at the same moment (sidecars started
    /// together on a shared file) all open it: none is refused as busy while
    /// another turns the new file to WAL or migrates it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn stores_opening_one_new_file_at_once_all_open() {
        for round in 0..20 {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("shared.db");
            let path = path.to_str().unwrap();
            let opts = StoreOptions::default();
            let (a, b, c) = tokio::join!(
                SqliteStore::open(path, MAX_BATCH, &opts),
                SqliteStore::open(path, MAX_BATCH, &opts),
                SqliteStore::open(path, MAX_BATCH, &opts),
            );
            for (name, s) in [("a", &a), ("b", &b), ("c", &c)] {
                assert!(
                    s.is_ok(),
                    "round {round}: store {name}: {:?}",
                    s.as_ref().err()
                );
            }
        }
    }

    /// A store on `a.db` in `dir` whose batches wait up to `busy` for
    /// another connection's write lock.
    async fn store_busy(dir: &tempfile::TempDir, busy: Duration) -> SqliteStore {
        let opts = StoreOptions {
            busy_timeout: busy,
            ..StoreOptions::default()
        };
        store_with(dir, MAX_BATCH, &opts).await
    }

    /// Another connection (another process on the file) that holds the
    /// write lock for `hold`, while a write is sent: the write's answer, and
    /// how many 10 ms ticks a task on the same one-thread runtime counted
    /// meanwhile.
    async fn write_behind_a_lock(
        s: &SqliteStore,
        dir: &tempfile::TempDir,
        hold: Duration,
    ) -> (Result<()>, u32) {
        let other = rusqlite::Connection::open(dir.path().join("a.db")).unwrap();
        other.execute_batch("BEGIN IMMEDIATE").unwrap();
        let ticker = async {
            let mut ticks = 0;
            let until = tokio::time::Instant::now() + hold;
            while tokio::time::Instant::now() < until {
                tokio::time::sleep(Duration::from_millis(10)).await;
                ticks += 1;
            }
            other.execute_batch("COMMIT").unwrap();
            ticks
        };
        tokio::join!(s.writer.run(meta_write("k", false)), ticker)
    }

    /// A write lock held by another connection is waited for off the
    /// runtime: the write waits for it and then lands, and the runtime
    /// (one thread here) keeps running meanwhile. A writer that waited on
    /// the runtime would stop the ticker, which is what lets the lock go.
    #[tokio::test]
    async fn a_lock_held_elsewhere_is_waited_for_off_the_runtime() {
        let dir = tempfile::tempdir().unwrap();
        let s = store_busy(&dir, Duration::from_secs(5)).await;
        let (written, ticks) = write_behind_a_lock(&s, &dir, Duration::from_millis(300)).await;
        written.unwrap();
        assert!(has_key(&s, "k").await);
        assert!(
            ticks >= 20,
            "{ticks} ticks of 10 ms in 300 ms: the runtime was held"
        );
        // And the writer is back on the runtime, without a busy handler.
        s.writer.run(meta_write("k2", false)).await.unwrap();
        assert!(has_key(&s, "k2").await);
    }

    /// A lock held longer than `busy_timeout` answers the write `UNAVAILABLE`
    /// and writes nothing; the next write, once the lock is gone, lands.
    #[tokio::test]
    async fn a_lock_held_past_the_busy_timeout_answers_unavailable() {
        let dir = tempfile::tempdir().unwrap();
        let s = store_busy(&dir, Duration::from_millis(100)).await;
        let (written, ticks) = write_behind_a_lock(&s, &dir, Duration::from_millis(400)).await;
        assert!(matches!(written, Err(Error::Unavailable(_))), "{written:?}");
        assert!(
            ticks >= 20,
            "{ticks} ticks of 10 ms in 400 ms: the runtime was held"
        );
        assert!(!has_key(&s, "k").await);
        s.writer.run(meta_write("k2", false)).await.unwrap();
        assert!(has_key(&s, "k2").await);
    }

    /// A lone operation that fails leaves nothing behind either.
    #[tokio::test]
    async fn a_lone_failing_operation_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(&dir).await;
        let commits = s.writer.commits();
        let bad = s.writer.run(meta_write("bad", true)).await;
        assert_eq!(s.writer.commits(), commits, "rolled back, not committed");
        assert!(matches!(bad, Err(Error::Store(_))), "{bad:?}");
        assert!(!has_key(&s, "bad").await);
        s.writer.run(meta_write("good", false)).await.unwrap();
        assert!(has_key(&s, "good").await);
    }
}
