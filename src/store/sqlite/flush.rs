//! The WAL flusher: the writer's commits reach the disk in the background,
//! so that a checkpoint does not stall every claim on one long `fsync`.
//!
//! In WAL mode with `synchronous=NORMAL` a `COMMIT` writes its frames to the
//! WAL file without syncing it. The kernel then keeps those pages dirty in
//! its cache (its background writeback starts only at a share of RAM, or
//! after 30 s), so the checkpoint that the writer runs once the WAL holds
//! 4,000 pages first has to `fsync` some 16 MB of WAL while every queued
//! operation waits: 36 ms of a stall, about
//! twice a second at 16 clients on the project's machine, and the sidecar's
//! p99 (docs/BENCHMARKS.md, round 14).
//!
//! This thread `fdatasync`s the WAL file on its own descriptor shortly after
//! commits: at most once every [`FLUSH_EVERY`], and never while nothing is
//! committed (it sleeps on a channel the writer nudges after each commit).
//! The checkpoint's own `fsync` then finds only the last few milliseconds of
//! frames to write. Syncing earlier only makes committed frames durable
//! sooner: what SQLite writes, when it syncs and how it checkpoints do not
//! change. A failed sync is logged; SQLite's own next `fsync` of the file
//! sees the same error (Linux reports a writeback error to every descriptor
//! open when it happened).
//!
//! SQLite keeps its locks in the `-shm` file and on the database file, never
//! on the `-wal` file, so opening and closing the WAL here cannot drop one
//! of the writer's POSIX locks.

use std::fs::File;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::Duration;

/// The shortest time between two syncs of the WAL. 2, 5, 10 and 25 ms were
/// measured (round 14): 10 ms already took the p99 from 41 to 9 ms; 5 ms
/// carried about as many claims as 2 ms with half the syncs.
const FLUSH_EVERY: Duration = Duration::from_millis(5);

/// The writer's side: nudges the flusher after a commit.
pub(super) struct Nudge(SyncSender<()>);

impl Nudge {
    /// Tells the flusher that the WAL has new frames. Never blocks: a nudge
    /// already pending covers this one.
    pub(super) fn commit(&self) {
        match self.0.try_send(()) {
            Ok(()) | Err(TrySendError::Full(())) | Err(TrySendError::Disconnected(())) => {}
        }
    }
}

/// Starts the flusher of the WAL file `wal` (`<database>-wal`). It ends
/// when the returned [`Nudge`] is dropped (with the writer that
/// holds it). `flushes` counts the syncs that succeeded.
pub(super) fn start(wal: String, flushes: Arc<AtomicU64>) -> std::io::Result<Nudge> {
    let (tx, rx) = sync_channel(1);
    std::thread::Builder::new()
        .name("anarchon-sqlite-flush".into())
        .spawn(move || run(&wal, &rx, &flushes))?;
    Ok(Nudge(tx))
}

fn run(wal: &str, nudges: &Receiver<()>, flushes: &AtomicU64) {
    let mut file: Option<File> = None;
    let mut failing = false;
    while nudges.recv().is_ok() {
        // Opened at the first commit: a new database has no WAL before it.
        if file.is_none() {
            file = File::open(wal).ok();
        }
        if let Some(f) = &file {
            match f.sync_data() {
                Ok(()) => {
                    flushes.fetch_add(1, Ordering::Relaxed);
                    failing = false;
                }
                Err(e) if !failing => {
                    failing = true;
                    tracing::warn!(wal, error = %e, "sqlite: syncing the WAL failed");
                }
                Err(_) => {}
            }
        }
        // Commits during the pause leave one nudge pending: one sync for them all.
        std::thread::sleep(FLUSH_EVERY);
    }
}
