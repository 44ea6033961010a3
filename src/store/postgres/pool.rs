//! The store's connections: a small pool without sqlx's release ping.
//!
//! sqlx's `Pool` pings every connection it gets back (a `Sync` round trip to
//! the server) before it lends it out again. A claim is one round trip, so
//! that ping doubled the work of the server and of the kernel per claim. This
//! pool lends and takes back connections without talking to the server.
//!
//! * A connection comes back only through [`Conn::done`], called when its
//!   work finished cleanly. One dropped on any other path (an error, a
//!   request cancelled at its deadline in the middle of a statement or a
//!   transaction) is closed instead: the next request never inherits a
//!   half-finished exchange or a wait for a lock it did not ask for.
//! * A connection lent out before the last outage the store saw (a lost
//!   connection, a server restart, a terminated backend) may have been cut:
//!   it is pinged once before its next use and replaced if dead, so after an
//!   outage only the requests that were already running fail.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{ConnectOptions, Connection};
use tokio::sync::{Semaphore, SemaphorePermit};

use super::{AttemptError, AttemptResult};
use crate::error::Error;

pub(super) struct Pool {
    connect: PgConnectOptions,
    /// Connections not lent out, with the time they were last lent out.
    idle: Mutex<Vec<(PgConnection, Instant)>>,
    /// One permit per connection that may exist.
    permits: Semaphore,
    /// How long a request waits for a permit or a new connection.
    timeout: Duration,
    epoch: Instant,
    /// Milliseconds after `epoch` of the last outage; 0 = none yet.
    outage_ms: AtomicU64,
}

/// A lent connection: given back by [`Conn::done`], closed if dropped
/// without it.
pub(super) struct Conn<'a> {
    conn: Option<PgConnection>,
    clean: bool,
    lent_at: Instant,
    pool: &'a Pool,
    _permit: SemaphorePermit<'a>,
}

impl Pool {
    pub(super) fn new(connect: PgConnectOptions, max: u32, timeout: Duration) -> Pool {
        Pool {
            connect,
            idle: Mutex::new(Vec::new()),
            permits: Semaphore::new(max as usize),
            timeout,
            epoch: Instant::now(),
            outage_ms: AtomicU64::new(0),
        }
    }

    /// Notes that the database was just unavailable: every connection lent
    /// out before now is checked before its next use.
    pub(super) fn mark_outage(&self) {
        let ms = self.epoch.elapsed().as_millis() as u64;
        self.outage_ms.fetch_max(ms.max(1), Ordering::Relaxed);
    }

    /// Whether a connection last lent out at `lent_at` may have been cut.
    fn suspect(&self, lent_at: Instant) -> bool {
        let last = self.outage_ms.load(Ordering::Relaxed);
        last != 0 && lent_at.saturating_duration_since(self.epoch).as_millis() as u64 <= last
    }

    /// Lends a connection: an idle one (checked if suspect), else a new one.
    /// `UNAVAILABLE` when none is free within the timeout or the server
    /// cannot be reached.
    pub(super) async fn acquire(&self) -> AttemptResult<Conn<'_>> {
        let permit = tokio::time::timeout(self.timeout, self.permits.acquire())
            .await
            .map_err(|_| AttemptError::from(sqlx::Error::PoolTimedOut))?
            .map_err(|_| AttemptError::from(sqlx::Error::PoolClosed))?;
        let lent_at = Instant::now();
        loop {
            let next = self.lock_idle().pop();
            let Some((mut conn, last_lent)) = next else {
                break;
            };
            if !self.suspect(last_lent) || self.alive(&mut conn).await {
                return Ok(Conn {
                    conn: Some(conn),
                    clean: false,
                    lent_at,
                    pool: self,
                    _permit: permit,
                });
            }
            tracing::debug!("dropping a dead postgres connection");
        }
        let conn = tokio::time::timeout(self.timeout, self.connect.connect())
            .await
            .map_err(|_| {
                AttemptError::Final(Error::Unavailable(
                    "postgres: no connection within the timeout".into(),
                ))
            })??;
        Ok(Conn {
            conn: Some(conn),
            clean: false,
            lent_at,
            pool: self,
            _permit: permit,
        })
    }

    /// Pings `conn`, within the timeout.
    async fn alive(&self, conn: &mut PgConnection) -> bool {
        matches!(
            tokio::time::timeout(self.timeout, conn.ping()).await,
            Ok(Ok(()))
        )
    }

    fn lock_idle(&self) -> std::sync::MutexGuard<'_, Vec<(PgConnection, Instant)>> {
        // A panic while holding this lock cannot leave the list half-changed.
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Conn<'_> {
    /// Gives the connection back: its work finished cleanly.
    pub(super) fn done(mut self) {
        self.clean = true;
    }
}

impl Deref for Conn<'_> {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        // Present from creation until drop.
        self.conn.as_ref().unwrap_or_else(|| unreachable!())
    }
}

impl DerefMut for Conn<'_> {
    fn deref_mut(&mut self) -> &mut PgConnection {
        self.conn.as_mut().unwrap_or_else(|| unreachable!())
    }
}

impl Drop for Conn<'_> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            if self.clean {
                self.pool.lock_idle().push((conn, self.lent_at));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_lent_before_an_outage_are_suspect() {
        let pool = Pool::new(PgConnectOptions::new(), 1, Duration::from_secs(1));
        let before = Instant::now();
        assert!(!pool.suspect(before), "no outage yet");
        std::thread::sleep(Duration::from_millis(5));
        pool.mark_outage();
        assert!(pool.suspect(before), "lent out before the outage");
        std::thread::sleep(Duration::from_millis(5));
        assert!(!pool.suspect(Instant::now()), "lent out after the outage");
    }
}
