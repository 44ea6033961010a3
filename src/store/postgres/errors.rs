//! How a PostgreSQL attempt fails, and the bounded retry of conflicts.

use std::future::Future;
use std::time::Duration;

use backon::{ExponentialBuilder, Retryable};

use crate::error::{Error, Result};

/// Retries of a serialization failure or deadlock before giving up.
const CONFLICT_RETRIES: usize = 5;

/// How one attempt failed: a conflict worth another try, or for good.
#[derive(Debug)]
pub(super) enum AttemptError {
    /// Serialization failure (40001) or deadlock (40P01).
    Conflict(String),
    Final(Error),
}

/// What one attempt returns: its value, or how it failed.
pub(super) type AttemptResult<T> = std::result::Result<T, AttemptError>;

impl From<Error> for AttemptError {
    fn from(e: Error) -> AttemptError {
        AttemptError::Final(e)
    }
}

/// Translates sqlx errors: conflicts are retried; a lost connection, a
/// server going down, an exhausted pool or I/O trouble is `UNAVAILABLE`;
/// anything else a store error. Never a win.
impl From<sqlx::Error> for AttemptError {
    fn from(e: sqlx::Error) -> AttemptError {
        match &e {
            sqlx::Error::Database(db) => {
                classify(&db.code().unwrap_or_default(), format!("postgres: {db}"))
            }
            sqlx::Error::Io(_)
            | sqlx::Error::Tls(_)
            | sqlx::Error::PoolTimedOut
            | sqlx::Error::PoolClosed
            | sqlx::Error::WorkerCrashed => {
                AttemptError::Final(Error::Unavailable(format!("postgres: {e}")))
            }
            _ => AttemptError::Final(Error::Store(format!("postgres: {e}"))),
        }
    }
}

/// A database error by its SQLSTATE: a conflict is retried; connection
/// exceptions, insufficient resources (too many connections), operator
/// intervention (shutdown, terminated backend, cancelled statement), a
/// read-only standby after a failover and a lock timeout are
/// `UNAVAILABLE`; anything else a store error.
pub(super) fn classify(code: &str, message: String) -> AttemptError {
    match code {
        "40001" | "40P01" => AttemptError::Conflict(message),
        c if c.starts_with("08")
            || c.starts_with("53")
            || c.starts_with("57")
            || c == "25006"
            || c == "55P03" =>
        {
            AttemptError::Final(Error::Unavailable(message))
        }
        _ => AttemptError::Final(Error::Store(message)),
    }
}

impl AttemptError {
    pub(super) fn into_error(self) -> Error {
        match self {
            AttemptError::Conflict(m) => Error::Unavailable(format!(
                "still conflicting after {CONFLICT_RETRIES} retries: {m}"
            )),
            AttemptError::Final(e) => e,
        }
    }
}

/// Runs `op`, again after a serialization failure or deadlock, a bounded
/// number of times with small jittered backoff.
pub(super) async fn retry_conflicts<T, F, Fut>(op: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = AttemptResult<T>>,
{
    let policy = ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(2))
        .with_max_delay(Duration::from_millis(50))
        .with_max_times(CONFLICT_RETRIES)
        .with_jitter();
    op.retry(policy)
        .when(|f| matches!(f, AttemptError::Conflict(_)))
        .notify(|f, after| tracing::debug!(error = ?f, ?after, "postgres conflict, retrying"))
        .await
        .map_err(AttemptError::into_error)
}

#[cfg(test)]
mod tests {
    use super::*;

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
            assert!(
                matches!(AttemptError::from(db(c)), AttemptError::Conflict(_)),
                "{c}"
            );
        }
        for c in [
            "08006", "57P01", "57P03", "53300", "25006", "55P03", "57014",
        ] {
            assert!(
                matches!(
                    AttemptError::from(db(c)).into_error(),
                    Error::Unavailable(_)
                ),
                "{c}"
            );
        }
        for c in ["23505", "42P01", "22P02"] {
            assert!(
                matches!(AttemptError::from(db(c)).into_error(), Error::Store(_)),
                "{c}"
            );
        }
        let io = sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        for e in [io, sqlx::Error::PoolTimedOut, sqlx::Error::PoolClosed] {
            assert!(matches!(
                AttemptError::from(e).into_error(),
                Error::Unavailable(_)
            ));
        }
        assert!(matches!(
            AttemptError::from(sqlx::Error::RowNotFound).into_error(),
            Error::Store(_)
        ));
    }

    #[tokio::test]
    async fn conflicts_are_retried_a_bounded_number_of_times() {
        use std::sync::atomic::Ordering;
        let tries = std::sync::atomic::AtomicUsize::new(0);
        let out = retry_conflicts(|| async {
            match tries.fetch_add(1, Ordering::SeqCst) {
                0 | 1 => Err(AttemptError::from(db("40P01"))),
                _ => Ok(7),
            }
        })
        .await;
        assert_eq!(out.unwrap(), 7);
        assert_eq!(tries.load(Ordering::SeqCst), 3);

        tries.store(0, Ordering::SeqCst);
        let out: Result<()> = retry_conflicts(|| async {
            tries.fetch_add(1, Ordering::SeqCst);
            Err(AttemptError::from(db("40001")))
        })
        .await;
        assert!(matches!(out, Err(Error::Unavailable(_))), "{out:?}");
        assert_eq!(tries.load(Ordering::SeqCst), CONFLICT_RETRIES + 1);

        // Anything else is not retried.
        tries.store(0, Ordering::SeqCst);
        let out: Result<()> = retry_conflicts(|| async {
            tries.fetch_add(1, Ordering::SeqCst);
            Err(AttemptError::from(db("57P01")))
        })
        .await;
        assert!(matches!(out, Err(Error::Unavailable(_))));
        assert_eq!(tries.load(Ordering::SeqCst), 1);
    }
}
