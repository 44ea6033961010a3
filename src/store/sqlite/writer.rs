//! The SQLite writer: one task, one connection, group commit.
//!
//! Every operation that may write (claim, renew, release, ending leases,
//! liveness beats, pruning) is sent to one Tokio task that owns a
//! `rusqlite` connection. The task takes the first operation waiting, lets
//! the runtime run once more (the operations of other RPCs that are ready
//! join the queue), takes whatever is queued (up to `max_batch`, at most
//! [`MAX_BATCH`]; it never waits for a batch to fill, so one client pays no
//! batching delay), and then:
//!
//! 1. answers what a plain read settles (most losing claims, resends, refused
//!    renews) without the write lock. It does so only while that pays: when
//!    every operation of the last batch wrote (a run of winning claims, say),
//!    the next batch goes straight to step 2, where each operation reads its
//!    row anyway, instead of reading every row twice. One operation that
//!    wrote nothing (settled by the read, or decided under the lock without a
//!    write) turns the reads back on for the next batch;
//! 2. opens **one** `BEGIN IMMEDIATE` for the rest and runs each of them in
//!    turn, under SQLite's database write lock, with the same flow as a lone
//!    operation ([`sql::claim_locked`], [`sql::renew_locked`],
//!    [`sql::release_locked`]): read again, decide, write;
//! 3. commits once, and only then replies. The commit does not sync the
//!    WAL; the flusher thread ([`flush`]) does, in the background, so that
//!    the checkpoint finds little left to sync.
//!
//! The operations of a batch run one after another; should one fail, the
//! batch runs again with each operation in its own `SAVEPOINT`: one
//! that fails is rolled back to it and answered with its own error, and the
//! others go on. A failed `COMMIT` answers every operation of the batch
//! `UNAVAILABLE`, so an error is never hidden behind a `WON` that did not
//! reach the file. Operations of one batch are decided one after another, as
//! they would be one transaction each, so the batch changes only how many
//! commits (and WAL appends) the file sees.
//!
//! **On the runtime, never blocked there.** A batch runs on the runtime's
//! own thread, between the RPCs that fed it: no thread is woken to take an
//! operation and none to take its answer back (round 20 in
//! docs/BENCHMARKS.md: a quarter more claims at a quarter less CPU each). A
//! batch is CPU and the page cache: its WAL frames go to the page cache, the
//! flusher thread ([`flush`]) syncs them. The two steps that may wait run on
//! a blocking thread instead, the connection moved there and back, while new
//! operations queue:
//! * the **write lock held by another connection** (another process on the
//!   same file). On the runtime the connection has no busy handler, so
//!   `BEGIN IMMEDIATE` answers busy at once; the batch then waits for the
//!   lock up to `busy_timeout` on the blocking thread. A plain read that
//!   meets a busy file settles nothing: the operation is decided under the
//!   lock;
//! * the **checkpoint**, once the WAL holds [`CHECKPOINT_FRAMES`] pages:
//!   it copies the WAL back into the file and syncs both. It runs in
//!   the writer's own sequence, between two batches, so the next
//!   transaction starts the WAL over. SQLite's automatic checkpoint stays as
//!   a backstop, at [`BACKSTOP_PAGES`].
//!
//! Why `rusqlite` rather than sqlx's connection: sqlx runs each SQLite
//! statement on a worker thread behind a channel, so a claim (three to five
//! statements) crosses threads that often; here a whole batch runs at once
//! with cached prepared statements. docs/BENCHMARKS.md has the figures.
//!
//! The decision flow in [`sql`] is written against the async [`RunAccess`];
//! this writer's implementation never awaits, so each flow completes on its
//! first poll ([`now`]).

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::FutureExt;
use rusqlite::{params, Connection, OpenFlags, OptionalExtension};
use tokio::sync::{mpsc, oneshot};

use super::super::sql::{self, RunAccess, RUN_COLUMNS};
use super::flush;
use crate::claim::*;
use crate::error::{Error, Result};

/// The most operations one transaction gathers (and the default of the
/// URL's `max_batch`).
pub const MAX_BATCH: usize = 64;
/// Operations waiting for the writer, at most (senders wait beyond it).
const QUEUE: usize = 4096;

/// Where an operation is in its batch.
#[derive(Debug, Clone, Copy)]
pub(super) enum Phase {
    /// Before the transaction, on a plain read: answer `Ok(Some)` when the
    /// read settles it, `Ok(None)` when it needs the write lock.
    Read,
    /// Under the write lock; `now` is the host clock read after it was taken.
    Locked { now: i64 },
}

/// The handle the store holds; dropping it stops the writer.
pub(super) struct Writer {
    ops: mpsc::Sender<Box<dyn Step>>,
    /// Transactions committed so far (one per batch that took the write lock); read by
    /// the tests that check batching.
    #[cfg_attr(not(test), allow(dead_code))]
    commits: Arc<AtomicU64>,
    /// Syncs of the WAL by the flusher so far ([`flush`]); read by its test.
    #[cfg_attr(not(test), allow(dead_code))]
    flushes: Arc<AtomicU64>,
}

impl Writer {
    /// Opens the writer's connection on `path` (the migrations have run) and
    /// starts its task on the current Tokio runtime.
    pub(super) fn start(path: &str, busy_timeout: Duration, max_batch: usize) -> Result<Writer> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|e| {
            Error::Store(format!(
                "cannot start the sqlite writer outside a runtime: {e}"
            ))
        })?;
        let conn = open(path).map_err(convert)?;
        conn.pragma_update(None, "wal_autocheckpoint", BACKSTOP_PAGES)
            .map_err(convert)?;
        let (tx, rx) = mpsc::channel(QUEUE);
        let commits = Arc::new(AtomicU64::new(0));
        let flushes = Arc::new(AtomicU64::new(0));
        let wal_path = format!("{path}-wal");
        let nudge = flush::start(wal_path.clone(), flushes.clone())
            .map_err(|e| Error::Store(format!("cannot start the sqlite writer's flusher: {e}")))?;
        let core = Core {
            conn,
            commits: commits.clone(),
            nudge,
            busy_timeout,
            wal_path,
            wal: None,
        };
        runtime.spawn(serve(core, rx, max_batch.clamp(1, MAX_BATCH)));
        Ok(Writer {
            ops: tx,
            commits,
            flushes,
        })
    }

    /// Transactions committed so far.
    #[cfg(test)]
    pub(super) fn commits(&self) -> u64 {
        self.commits.load(Ordering::Relaxed)
    }

    /// Syncs of the WAL by the flusher so far.
    #[cfg(test)]
    pub(super) fn flushes(&self) -> u64 {
        self.flushes.load(Ordering::Relaxed)
    }

    /// Runs `op` on the writer: first in [`Phase::Read`], then, if
    /// that did not settle it, in [`Phase::Locked`] inside a batch.
    pub(super) async fn run<T, F>(&self, op: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnMut(&mut Access<'_>, Phase) -> Result<Option<T>> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let step = Op {
            op,
            out: None,
            reply: Some(reply),
        };
        let stopped = || Error::Unavailable("sqlite: the writer has stopped".into());
        self.ops.send(Box::new(step)).await.map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

/// The writer's connection. It has no busy handler: on the runtime a busy
/// file is answered at once, and [`Core::wait_for_lock`] waits for it on a
/// blocking thread.
fn open(path: &str) -> rusqlite::Result<Connection> {
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    conn.busy_timeout(Duration::ZERO)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    // A larger page cache and a memory map keep an aged file (a million
    // finished runs) as fast as a fresh one: the index pages stay in memory.
    conn.pragma_update(None, "cache_size", -65_536)?; // KiB: 64 MiB
    conn.pragma_update(None, "mmap_size", 268_435_456)?; // 256 MiB
    conn.set_prepared_statement_cache_capacity(32);
    Ok(conn)
}

/// WAL frames (4 KiB pages) after which the writer checkpoints, between two
/// batches, on a blocking thread. SQLite's default is 1,000; a longer WAL
/// lets the pages a burst of claims rewrites again and again (the runs
/// table's tail, its indexes, the jobs rows) reach the database file once
/// per checkpoint instead of several times. The checkpoint runs in the
/// writer's own sequence, so it can copy the whole WAL and the next
/// transaction starts the WAL over: the file stays near 16 MiB. (A
/// checkpoint on another connection, concurrent with the writes, was
/// measured too: it never let the WAL start over, which grew to 16.6 GB
/// over 10⁶ aged runs. Four designs of a background copier cut the p99 but
/// left a WAL 3–9 times longer and a lower aged rate: docs/BENCHMARKS.md,
/// round 3.)
const CHECKPOINT_FRAMES: u32 = 4_000;

/// WAL pages after which SQLite's own automatic checkpoint runs inside a
/// commit, on the runtime: a backstop, reached only if the writer cannot
/// read the WAL file ([`Core::wal_is_long`]).
const BACKSTOP_PAGES: i64 = 16_000;

/// One queued operation, as the writer sees it.
trait Step: Send {
    /// Before the transaction: `true` when a plain read answered it (the
    /// reply is sent).
    fn read(&mut self, a: &mut Access<'_>) -> bool;
    /// Under the lock: runs it and keeps its outcome; `false` on an error
    /// (roll its writes back).
    fn locked(&mut self, a: &mut Access<'_>, now: i64) -> bool;
    /// After the commit: sends the kept outcome, or the commit's failure.
    fn reply(self: Box<Self>, commit: std::result::Result<(), &str>);
}

struct Op<T, F> {
    op: F,
    out: Option<Result<T>>,
    reply: Option<oneshot::Sender<Result<T>>>,
}

impl<T, F> Step for Op<T, F>
where
    T: Send,
    F: FnMut(&mut Access<'_>, Phase) -> Result<Option<T>> + Send,
{
    fn read(&mut self, a: &mut Access<'_>) -> bool {
        let settled = match (self.op)(a, Phase::Read) {
            Ok(None) => return false,
            // Another connection holds a lock the read needs: decide it
            // under the write lock, which waits for it.
            Err(e) if is_busy(&e) => return false,
            Ok(Some(v)) => Ok(v),
            Err(e) => Err(e),
        };
        if let Some(reply) = self.reply.take() {
            // The caller may have gone (a cancelled RPC); nothing to do then.
            let _ = reply.send(settled);
        }
        true
    }

    fn locked(&mut self, a: &mut Access<'_>, now: i64) -> bool {
        let out = match (self.op)(a, Phase::Locked { now }) {
            Ok(Some(v)) => Ok(v),
            Ok(None) => Err(Error::Store(
                "sqlite: an operation gave no answer under the lock".into(),
            )),
            Err(e) => Err(e),
        };
        let ok = out.is_ok();
        self.out = Some(out);
        ok
    }

    fn reply(mut self: Box<Self>, commit: std::result::Result<(), &str>) {
        let out = match (commit, self.out.take()) {
            (_, Some(Err(e))) => Err(e),
            (Err(why), _) => Err(Error::Unavailable(format!("sqlite: {why}"))),
            (Ok(()), Some(v)) => v,
            (Ok(()), None) => Err(Error::Store("sqlite: an operation was not run".into())),
        };
        if let Some(reply) = self.reply.take() {
            let _ = reply.send(out);
        }
    }
}

/// What the writer task owns. It moves to a blocking thread and back for
/// the steps that may wait.
struct Core {
    conn: Connection,
    /// Transactions committed so far.
    commits: Arc<AtomicU64>,
    nudge: flush::Nudge,
    /// How long a batch waits for another connection's write lock.
    busy_timeout: Duration,
    /// The WAL file, opened at the first commit, read for its length
    /// ([`Core::wal_is_long`]). SQLite takes no lock on it, so this
    /// descriptor cannot drop one of SQLite's POSIX locks when it closes.
    wal_path: String,
    wal: Option<std::fs::File>,
}

/// The task: take what is queued, settle the reads, commit the rest as one
/// transaction; wait for a lock or checkpoint off the runtime. It ends when
/// the [`Writer`] is dropped, or if a blocking step is lost (its thread
/// panicked, or the runtime is shutting down); the operations still queued
/// are then answered `UNAVAILABLE` by their dropped replies.
async fn serve(mut core: Core, mut rx: mpsc::Receiver<Box<dyn Step>>, max_batch: usize) {
    let mut batch: Vec<Box<dyn Step>> = Vec::with_capacity(max_batch);
    let mut read_first = true;
    while let Some(first) = rx.recv().await {
        // The RPCs the runtime has ready queue their operations too.
        tokio::task::yield_now().await;
        batch.push(first);
        while batch.len() < max_batch {
            match rx.try_recv() {
                Ok(op) => batch.push(op),
                Err(_) => break,
            }
        }
        let mut settled = 0;
        if read_first {
            settled = read_phase(&mut core.conn, &mut batch);
        }
        let commits = core.commits.load(Ordering::Relaxed);
        if !batch.is_empty() {
            // No busy handler here: a lock held elsewhere returns at once,
            // and the batch, not yet run, waits for it off the runtime.
            let idle = match begin(&mut core.conn) {
                Err(e) if locked_out(&e) => {
                    let waited = off_runtime(core, batch, |core, batch| core.wait_for_lock(batch));
                    let Some((c, b, idle)) = waited.await else {
                        return;
                    };
                    (core, batch) = (c, b);
                    idle
                }
                begun => commit_batch(&mut core, &mut batch, begun),
            };
            settled += idle;
        }
        read_first = settled > 0;
        batch.clear();
        // Only a commit makes the WAL longer.
        if core.commits.load(Ordering::Relaxed) != commits && core.wal_is_long() {
            let done = off_runtime(core, batch, |core, _| core.checkpoint());
            let Some((c, b, ())) = done.await else {
                return;
            };
            (core, batch) = (c, b);
        }
    }
}

/// Runs `step` with the core and the batch on a blocking thread, and gives
/// them back; `None` if the step was lost.
async fn off_runtime<T: Send + 'static>(
    mut core: Core,
    mut batch: Vec<Box<dyn Step>>,
    step: impl FnOnce(&mut Core, &mut Vec<Box<dyn Step>>) -> T + Send + 'static,
) -> Option<(Core, Vec<Box<dyn Step>>, T)> {
    let done = tokio::task::spawn_blocking(move || {
        let out = step(&mut core, &mut batch);
        (core, batch, out)
    });
    match done.await {
        Ok(v) => Some(v),
        Err(e) => {
            tracing::error!(error = %e, "sqlite: the writer's blocking step was lost; the writer stops");
            None
        }
    }
}

impl Core {
    /// On a blocking thread: the batch's transaction, waiting up to
    /// `busy_timeout` for the write lock.
    fn wait_for_lock(&mut self, batch: &mut Vec<Box<dyn Step>>) -> usize {
        // Should the handler not be set, the batch is answered busy at once:
        // an answer, never a wrong one.
        let _ = self.conn.busy_timeout(self.busy_timeout);
        let begun = begin(&mut self.conn);
        let idle = commit_batch(self, batch, begun);
        let _ = self.conn.busy_timeout(Duration::ZERO);
        idle
    }

    /// Whether the WAL holds [`CHECKPOINT_FRAMES`] frames or more: two
    /// `pread`s of the WAL file (<https://sqlite.org/walformat.html>). A
    /// frame belongs to the WAL's current generation when its header carries
    /// the salts of the WAL's header, which change whenever the WAL starts
    /// over; so the WAL is that long when the frame at that position carries
    /// them. (`rusqlite` does not expose SQLite's WAL hook, which reports the
    /// count after each commit.) A frame there left by a rolled-back
    /// transaction only brings a checkpoint forward. `false` when the file
    /// cannot be read: SQLite's backstop checkpoint bounds the WAL then.
    fn wal_is_long(&mut self) -> bool {
        use std::os::unix::fs::FileExt;
        if self.wal.is_none() {
            self.wal = std::fs::File::open(&self.wal_path).ok();
        }
        let Some(wal) = &self.wal else {
            return false;
        };
        // Magic, format, page size, checkpoint sequence, salt-1, salt-2, checksum.
        let mut header = [0u8; 32];
        if wal.read_exact_at(&mut header, 0).is_err() {
            return false;
        }
        let page = u32::from_be_bytes([header[8], header[9], header[10], header[11]]);
        // Page number, database size, salt-1, salt-2, checksum.
        let mut frame = [0u8; 24];
        let at = 32 + u64::from(CHECKPOINT_FRAMES - 1) * (u64::from(page) + 24);
        wal.read_exact_at(&mut frame, at).is_ok() && frame[8..16] == header[16..24]
    }

    /// On a blocking thread: copies the WAL back into the database file
    /// (`PASSIVE`: it never waits for a reader; what a reader still needs is
    /// copied next time).
    fn checkpoint(&mut self) {
        let res = self
            .conn
            .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| {
                Ok((r.get::<_, i64>(1)?, r.get::<_, i64>(2)?))
            });
        match res {
            Ok((log, copied)) => tracing::debug!(log, copied, "sqlite: checkpoint"),
            Err(e) => tracing::warn!(error = %e, "sqlite: the checkpoint failed"),
        }
    }
}

/// Answers what a plain read settles, in one read transaction (one snapshot,
/// one round of WAL read locks); returns how many it answered.
fn read_phase(conn: &mut Connection, batch: &mut Vec<Box<dyn Step>>) -> usize {
    let mut a = Access {
        conn,
        locked: false,
    };
    let snapshot = a.exec("BEGIN").is_ok();
    let queued = batch.len();
    batch.retain_mut(|op| !op.read(&mut a));
    if snapshot {
        let _ = a.exec("COMMIT");
    }
    queued - batch.len()
}

/// Opens a batch's write transaction: takes the write lock, waiting for it
/// as long as the connection's busy handler says.
fn begin(conn: &mut Connection) -> rusqlite::Result<()> {
    Access { conn, locked: true }.exec("BEGIN IMMEDIATE")
}

/// Runs the batch in the transaction [`begin`] opened (or answers it all
/// with `begun`'s error), commits, and answers every operation; returns how
/// many wrote nothing under the lock (a plain read might have answered
/// them), or the batch's length when it did not commit. A commit is counted
/// before its operations are answered, so whoever holds an answer sees the
/// commit that carried it in `commits`.
fn commit_batch(
    core: &mut Core,
    batch: &mut Vec<Box<dyn Step>>,
    begun: rusqlite::Result<()>,
) -> usize {
    let mut a = Access {
        conn: &mut core.conn,
        locked: true,
    };
    let mut idle = 0;
    let end = match begun {
        Err(e) => Err(convert(e).to_string()),
        Ok(()) => {
            let broken = run_locked(&mut a, batch, &mut idle);
            match broken {
                Some(why) => {
                    let _ = a.exec("ROLLBACK");
                    Err(why)
                }
                None => a.exec("COMMIT").map_err(|e| {
                    let _ = a.exec("ROLLBACK");
                    format!("commit failed: {e}")
                }),
            }
        }
    };
    if end.is_ok() {
        core.commits.fetch_add(1, Ordering::Relaxed);
        core.nudge.commit();
    }
    let end = end.as_ref().map(|_| ()).map_err(String::as_str);
    if end.is_err() {
        idle = batch.len();
    }
    for op in batch.drain(..) {
        op.reply(end);
    }
    idle
}

/// Runs the batch under the lock. Returns why the whole transaction must be
/// rolled back, if it must: a lone operation failed, or a savepoint could
/// not be kept.
///
/// The operations run one after another with no savepoint between them (two
/// statements fewer per operation); an operation almost never fails, and
/// when one does, the transaction is rolled back and the whole batch runs
/// again with each operation in its own savepoint ([`run_in_savepoints`]),
/// so that only the one that failed is rolled back. Nobody has been
/// answered yet: the replies go out after the commit.
fn run_locked(a: &mut Access<'_>, batch: &mut [Box<dyn Step>], idle: &mut usize) -> Option<String> {
    *idle = 0;
    if let [lone] = batch {
        // A lone operation needs no savepoint: its error rolls the whole
        // transaction back (and it is answered with that error).
        return (!run_one(a, lone, idle)).then(|| "the operation failed".to_string());
    }
    // `all` stops at the first failure: the rest run in the second pass.
    if batch.iter_mut().all(|op| run_one(a, op, idle)) {
        return None;
    }
    *idle = 0;
    if let Err(e) = a.exec("ROLLBACK").and_then(|()| a.exec("BEGIN IMMEDIATE")) {
        return Some(format!("the batch could not start again: {e}"));
    }
    run_in_savepoints(a, batch, idle)
}

/// Runs one operation under the lock; counts it in `idle` when it changed
/// no row. Returns `false` when it failed.
fn run_one(a: &mut Access<'_>, op: &mut Box<dyn Step>, idle: &mut usize) -> bool {
    let before = a.conn.total_changes();
    let ok = op.locked(a, host_now_ms());
    if a.conn.total_changes() == before {
        *idle += 1;
    }
    ok
}

/// Runs each operation of the batch in its own savepoint: one that fails is
/// rolled back to it, and the others go on.
fn run_in_savepoints(
    a: &mut Access<'_>,
    batch: &mut [Box<dyn Step>],
    idle: &mut usize,
) -> Option<String> {
    for op in batch.iter_mut() {
        let savepoint = a.exec("SAVEPOINT op").and_then(|()| {
            if run_one(a, op, idle) {
                a.exec("RELEASE op")
            } else {
                a.exec("ROLLBACK TO op").and_then(|()| a.exec("RELEASE op"))
            }
        });
        if let Err(e) = savepoint {
            return Some(format!(
                "a savepoint failed, the batch was rolled back: {e}"
            ));
        }
    }
    None
}

/// Translates rusqlite errors: a busy or locked database is `UNAVAILABLE`
/// (retry), anything else a store error. Never a win.
fn convert(e: rusqlite::Error) -> Error {
    if locked_out(&e) {
        Error::Unavailable(format!("{BUSY}{e}"))
    } else {
        Error::Store(format!("sqlite: {e}"))
    }
}

/// How every busy error's message starts ([`convert`], [`is_busy`]).
const BUSY: &str = "sqlite is busy: ";

/// A busy or locked database: another connection holds a lock.
fn locked_out(e: &rusqlite::Error) -> bool {
    use rusqlite::ErrorCode::{DatabaseBusy, DatabaseLocked};
    matches!(
        e.sqlite_error_code(),
        Some(DatabaseBusy) | Some(DatabaseLocked)
    )
}

/// Whether `e` is [`convert`]'s answer to a busy or locked database.
fn is_busy(e: &Error) -> bool {
    matches!(e, Error::Unavailable(m) if m.starts_with(BUSY))
}

/// Completes a [`RunAccess`] flow that never awaits (the writer's access).
pub(super) fn now<T>(flow: impl Future<Output = Result<T>>) -> Result<T> {
    flow.now_or_never().unwrap_or_else(|| {
        Err(Error::Store(
            "sqlite: a store flow waited in the writer".into(),
        ))
    })
}

/// The writer's connection, as the decision flows see it.
pub(super) struct Access<'c> {
    conn: &'c mut Connection,
    /// Inside the batch's `BEGIN IMMEDIATE` (it may write), or in the plain
    /// read before it (it may not).
    locked: bool,
}

const READ_RUN: &str = "SELECT slot_ms, state, attempt, fencing, token, holder_node, holder_instance, lease_until_ms, claimed_at_ms, finished_at_ms FROM runs WHERE job = ?1 AND slot_ms = ?2";

impl Access<'_> {
    fn exec(&mut self, sql: &str) -> rusqlite::Result<()> {
        self.conn.prepare_cached(sql)?.execute([])?;
        Ok(())
    }

    /// Runs a statement with parameters; returns the rows it changed.
    pub(super) fn execute(&mut self, sql: &str, p: impl rusqlite::Params) -> Result<u64> {
        let n = self
            .conn
            .prepare_cached(sql)
            .and_then(|mut s| s.execute(p))
            .map_err(convert)?;
        Ok(n as u64)
    }

    /// The run (job, slot), if any.
    pub(super) fn read_run(&mut self, job: &Job, slot: SlotMs) -> Result<Option<RunRow>> {
        debug_assert!(READ_RUN.contains(RUN_COLUMNS));
        let mut stmt = self.conn.prepare_cached(READ_RUN).map_err(convert)?;
        let row = stmt
            .query_row(params![job.as_str(), slot], |row| Ok(run_of(row)))
            .optional()
            .map_err(convert)?;
        row.transpose()
    }

    /// The liveness counters of `holders` (0 without a record).
    pub(super) fn read_liveness(&mut self, holders: &[Holder]) -> Result<Vec<u64>> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT counter FROM liveness WHERE node = ?1 AND instance = ?2")
            .map_err(convert)?;
        holders
            .iter()
            .map(|h| {
                let c: Option<i64> = stmt
                    .query_row(params![h.node, h.instance as i64], |r| r.get(0))
                    .optional()
                    .map_err(convert)?;
                Ok(c.unwrap_or(0) as u64)
            })
            .collect()
    }

    /// Runs a statement that returns one integer.
    pub(super) fn scalar(&mut self, sql: &str, p: impl rusqlite::Params) -> Result<i64> {
        self.conn
            .prepare_cached(sql)
            .and_then(|mut s| s.query_row(p, |r| r.get(0)))
            .map_err(convert)
    }
}

/// The running runs of a job other than a slot, with a current lease, read
/// `by` an index or the primary key; `INDEXED BY` because without statistics
/// SQLite would walk the job's whole history by the primary key.
fn others_sql(by: &str) -> String {
    format!("SELECT {RUN_COLUMNS} FROM runs {by} AND slot_ms <> ?2 AND lease_until_ms > ?3")
}
/// For a watched job: through the partial index (migration 0006).
static OTHERS_WATCHED: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    others_sql("INDEXED BY runs_watched WHERE job = ?1 AND state = 'RUNNING' AND watch = 1")
});
/// For a job not (yet) watched: its runs by the primary key.
static OTHERS_BY_KEY: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| others_sql("WHERE job = ?1 AND state = 'RUNNING'"));

impl Access<'_> {
    /// Makes `job` watched: its flag set (its row made, fence 0, if it has
    /// none: the first win then draws 1, as before) and its running runs
    /// marked for the index. Under the lock only.
    fn watch(&mut self, job: &Job) -> Result<()> {
        let job = job.as_str();
        self.execute(
            "INSERT INTO jobs (job, fence, watch) VALUES (?1, 0, 1)
             ON CONFLICT (job) DO UPDATE SET watch = 1",
            params![job],
        )?;
        self.execute(
            "UPDATE runs SET watch = 1 WHERE job = ?1 AND state = 'RUNNING' AND watch <> 1",
            params![job],
        )?;
        Ok(())
    }
}

fn run_of(row: &rusqlite::Row<'_>) -> Result<RunRow> {
    let bad = |e: rusqlite::Error| Error::Store(format!("malformed run row: {e}"));
    sql::run_from_columns(
        |c| row.get::<_, i64>(c).map_err(bad),
        |c| row.get::<_, String>(c).map_err(bad),
    )
}

/// A run is written with its job's `watch` flag (migration 0006): indexed
/// while running if the job is checked for overlap. A job without a row is
/// taken as watched, the safe side (a won claim has drawn its fence, so its
/// job has one).
static UPSERT_RUN: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    sql::upsert_run_sql(
        "runs",
        Some((
            "watch",
            "coalesce((SELECT watch FROM jobs WHERE job = $1), 1)",
        )),
    )
});
/// `$1` the clock, `$2` the lease asked for (0 = the run's own), `$3` job, `$4` slot.
static RENEW: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "UPDATE runs SET lease_until_ms = $1 + {} WHERE job = $3 AND slot_ms = $4 RETURNING lease_until_ms",
        sql::renew_lease("$2", "max")
    )
});

#[async_trait]
impl RunAccess for Access<'_> {
    type Err = Error;

    async fn run(&mut self, job: &Job, slot: SlotMs) -> Result<Option<RunRow>> {
        self.read_run(job, slot)
    }

    /// Through the index of watched jobs' running runs (migration 0006).
    /// Under the lock, the first time a job is asked about, the job becomes
    /// watched and its running runs are marked, in this transaction, so
    /// that the index holds every running run of the job from then on. In
    /// the plain read before the lock (which writes nothing), a job not yet
    /// watched has its runs read by the primary key instead: its whole
    /// history, once.
    async fn others(&mut self, job: &Job, slot: SlotMs, now: i64) -> Result<Vec<RunRow>> {
        let watched = self
            .conn
            .prepare_cached("SELECT watch FROM jobs WHERE job = ?1")
            .and_then(|mut s| {
                s.query_row(params![job.as_str()], |r| r.get::<_, i64>(0))
                    .optional()
            })
            .map_err(convert)?
            == Some(1);
        let sql: &str = if watched {
            &OTHERS_WATCHED
        } else if self.locked {
            self.watch(job)?;
            &OTHERS_WATCHED
        } else {
            &OTHERS_BY_KEY
        };
        let mut stmt = self.conn.prepare_cached(sql).map_err(convert)?;
        let rows = stmt
            .query_map(params![job.as_str(), slot, now], |row| Ok(run_of(row)))
            .map_err(convert)?;
        rows.map(|r| r.map_err(convert)?).collect()
    }

    /// Raises the job's counter, then reads it: two statements instead of
    /// an upsert with `RETURNING`, because SQLite buffers a `RETURNING`
    /// statement's rows in an ephemeral table that it opens and closes at
    /// every execution (a b-tree and its page cache, once per won claim).
    /// The writer holds the database's write lock here, so nothing moves
    /// the counter between the two.
    async fn next_fence(&mut self, job: &Job) -> Result<u64> {
        let job = job.as_str();
        if self.execute(
            "UPDATE jobs SET fence = fence + 1 WHERE job = ?1",
            params![job],
        )? == 0
        {
            // Not watched until a claim asks about overlap (migration 0006).
            self.execute(
                "INSERT INTO jobs (job, fence, watch) VALUES (?1, 1, 0)",
                params![job],
            )?;
            return Ok(1);
        }
        let fence = self.scalar("SELECT fence FROM jobs WHERE job = ?1", params![job])?;
        Ok(fence as u64)
    }

    async fn write(&mut self, job: &Job, r: &RunRow) -> Result<()> {
        self.execute(
            &UPSERT_RUN,
            params![
                job.as_str(),
                r.slot_ms,
                r.state.as_str(),
                r.attempt as i64,
                r.fencing as i64,
                r.token.as_str(),
                r.holder.node.as_str(),
                r.holder.instance as i64,
                r.lease_until_ms,
                r.claimed_at_ms,
                r.finished_at_ms,
            ],
        )?;
        Ok(())
    }

    async fn extend(&mut self, job: &Job, slot: SlotMs, now: i64, lease_ms: i64) -> Result<i64> {
        self.scalar(&RENEW, params![now, lease_ms, job.as_str(), slot])
    }

    async fn finish(&mut self, job: &Job, slot: SlotMs, state: RunState, now: i64) -> Result<()> {
        self.execute(
            "UPDATE runs SET state = ?1, finished_at_ms = ?2 WHERE job = ?3 AND slot_ms = ?4",
            params![state.as_str(), now, job.as_str(), slot],
        )?;
        Ok(())
    }

    async fn liveness(&mut self, holders: &[Holder]) -> Result<Vec<u64>> {
        self.read_liveness(holders)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A plain read that meets a busy database settles nothing: the
    /// operation is decided under the lock, which waits for the lock, and
    /// answered from there. Any other error of a plain read is the answer.
    #[tokio::test]
    async fn a_busy_plain_read_is_decided_under_the_lock() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.db");
        rusqlite::Connection::open(&path)
            .unwrap()
            .execute_batch("PRAGMA journal_mode=WAL; CREATE TABLE t(x);")
            .unwrap();
        let w = Writer::start(path.to_str().unwrap(), Duration::from_secs(1), MAX_BATCH).unwrap();
        let busy = || {
            convert(rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(5),
                None,
            ))
        };
        assert!(is_busy(&busy()), "{:?}", busy());
        let answer = w
            .run(move |_, phase| match phase {
                Phase::Read => Err(busy()),
                Phase::Locked { .. } => Ok(Some("locked")),
            })
            .await;
        assert_eq!(answer.unwrap(), "locked");
        let answer = w
            .run(|_, phase| match phase {
                Phase::Read => Err(Error::Store("refused".into())),
                Phase::Locked { .. } => Ok(Some(())),
            })
            .await;
        assert!(matches!(answer, Err(Error::Store(_))), "{answer:?}");
    }
}
