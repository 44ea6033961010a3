//! The store layer: one trait, one implementation per backend, chosen by the
//! backend URL's scheme.
//!
//! A store makes the claim decision in one indivisible step of its own
//! (a locked transaction, a Lua script, a full-or-empty queue, a
//! de-duplicated publish). Contention comes back as a [`ClaimAnswer`]
//! outcome; store trouble as an [`Error`], never as `WON`.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use crate::claim::*;
use crate::error::{Error, Result};

pub mod backend_url;
mod broker;
mod future;
mod nats;
mod postgres;
mod rabbitmq;
mod redis;
mod sql;
mod sqlite;

pub use nats::NatsStore;
pub use postgres::{PgClaim, PgTarget, PostgresStore};
pub use rabbitmq::RabbitStore;
pub use redis::{RedisConfig, Strategy as RedisStrategy};
pub use sqlite::SqliteStore;

/// What a backend can do, and how long it remembers a run.
#[derive(Debug, Clone)]
pub struct StoreInfo {
    /// `sqlite`, `postgres`, `redis-lease`, ...
    pub backend: &'static str,
    /// Lease backends keep runs with leases and hand them over; once backends
    /// only remember that a slot was claimed.
    pub leases: bool,
    /// Whether `History` returns full run records.
    pub full_history: bool,
    /// How long a run is remembered, in words (shown in `History`).
    pub retention: String,
    /// Which store this is, for the mesh hello: sidecars whose identities
    /// differ do not share claims and refuse to link. An id kept in the
    /// store (SQLite, PostgreSQL, Redis) or a hash of where the store lives
    /// (RabbitMQ, NATS); never a credential. Empty: unknown (no check).
    pub identity: String,
}

/// A store identity from where a store lives — host, port, database or
/// vhost, and the key prefix — for stores that cannot keep an id of their
/// own: `KIND:` and the first 16 bytes of SHA-256 in hex. The user name,
/// password and query options are left out.
pub fn address_identity(kind: &str, urls: &[&str], prefix: &str) -> String {
    use sha2::{Digest, Sha256};
    let mut places = Vec::new();
    for url in urls {
        let rest = url.split_once("://").map_or(*url, |(_, r)| r);
        let rest = rest.split(['?', '#']).next().unwrap_or_default();
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let hosts = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
        for host in hosts.split(',').filter(|h| !h.is_empty()) {
            places.push(format!("{host}/{path}").to_lowercase());
        }
    }
    places.sort();
    places.dedup();
    let digest = Sha256::digest(format!("{kind}\0{}\0{prefix}", places.join(",")));
    format!("{kind}:{}", hex::encode(&digest[..16]))
}

/// A fresh random store id (32 hex), for a store that keeps its own.
pub fn new_store_id() -> String {
    hex::encode(rand::random::<[u8; 16]>())
}

/// Tunables every store may use.
#[derive(Debug, Clone)]
pub struct StoreOptions {
    /// How long finished runs are kept.
    pub retention: Duration,
    /// SQLite: how long to wait for the write lock.
    pub busy_timeout: Duration,
    /// Claims of slots further ahead of the store's clock are refused
    /// (`INVALID_ARGUMENT` naming `slot_ms`) before the store writes anything.
    pub max_future: Duration,
}

impl StoreOptions {
    pub fn from_config(c: &crate::Config) -> Self {
        StoreOptions {
            retention: c.retention(),
            busy_timeout: Duration::from_millis(c.busy_timeout_ms),
            max_future: Duration::from_millis(c.max_future_ms),
        }
    }
}

/// The defaults of [`Config::default`](crate::Config): they are declared
/// there, once.
impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions::from_config(&crate::Config::default())
    }
}

/// What every backend does: the claim, the release, history, reachability.
/// Backends with leases add [`Leases`].
#[async_trait]
pub trait Store: Send + Sync + 'static {
    fn info(&self) -> &StoreInfo;

    /// The claim decision, in one atomic step. `dead` lists holders whose
    /// runs no longer exclude anyone (some of them on the condition that
    /// their liveness counter still has a given value: see `Leases`).
    async fn claim(&self, spec: &ClaimSpec, dead: &DeadHolders) -> Result<ClaimAnswer>;

    /// Marks the run finished if `spec.token` holds it. Idempotent.
    async fn release(&self, spec: &ReleaseSpec, dead: &DeadHolders) -> Result<()>;

    /// Runs of `job`, newest slot first.
    async fn history(
        &self,
        job: &Job,
        limit: u32,
        before_slot_ms: Option<i64>,
    ) -> Result<HistoryPage>;

    /// Is the store reachable?
    async fn ping(&self) -> Result<()>;

    /// The store's clock, in epoch milliseconds: the `now` its claim step
    /// uses. Stores whose clock is the host's (SQLite, RabbitMQ, NATS) keep
    /// this default.
    async fn now_ms(&self) -> Result<i64> {
        Ok(host_now_ms())
    }

    /// The lease capability, for backends that keep runs with leases and
    /// hand them over (`info().leases`). Once backends have none.
    fn leases(&self) -> Option<&dyn Leases> {
        None
    }
}

/// The lease capability: renewals, ending leases, pruning, and the
/// per-instance liveness record that lets a claim take an expired holder's
/// run over safely (`docs/safety.md`).
#[async_trait]
pub trait Leases: Send + Sync {
    /// Extends the lease if `spec.token` still holds the run.
    async fn renew(&self, spec: &RenewSpec, dead: &DeadHolders) -> Result<Renewed>;

    /// Ends the lease of the run held with `token` at once (a `Hold` stream
    /// broke), so the next claimer takes it over. Returns whether a lease ended.
    async fn end_lease(&self, job: &Job, slot_ms: SlotMs, token: &Token) -> Result<bool>;

    /// Ends the leases of every run `holder` holds (graceful leave).
    async fn end_leases_of(&self, holder: &Holder) -> Result<u64>;

    /// Deletes up to `batch` runs finished (or lapsed) before `cutoff_ms`,
    /// and liveness records not refreshed since.
    async fn prune(&self, cutoff_ms: i64, batch: u32) -> Result<u64>;

    /// Whether this store keeps a liveness record per sidecar instance that
    /// its claim step re-checks. Without one (Redis Cluster), an expired
    /// holder's runs are taken over only when their lease runs out.
    fn keeps_liveness(&self) -> bool;

    /// Raises `holder`'s liveness counter (creating the record at 1) and
    /// returns the new value.
    async fn beat(&self, holder: &Holder) -> Result<u64>;

    /// The liveness counters of `holders`, in order; 0 for a holder without
    /// a record.
    async fn beats_of(&self, holders: &[Holder]) -> Result<Vec<u64>>;
}

pub type DynStore = Arc<dyn Store>;

/// A parsed backend URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    /// `sqlite://PATH[?max_batch=N]`
    Sqlite {
        path: String,
        /// The most writes one transaction of the writer carries (1: every
        /// claim commits on its own).
        max_batch: usize,
    },
    Redis(RedisConfig),
    Postgres(PgTarget),
    /// `amqp[s]://user:pass@host:port/vhost?prefix=&slot_ttl_ms=&timeout_ms=`
    Amqp {
        url: String,
        prefix: String,
        slot_ttl_ms: u64,
        timeout_ms: u64,
    },
    /// `nats://[user:pass@]host:port[,host:port]?prefix=&duplicate_window_ms=&timeout_ms=`
    Nats {
        url: String,
        prefix: String,
        duplicate_window_ms: u64,
        timeout_ms: u64,
    },
}

impl Backend {
    /// The backend's name as shown in answers and metrics.
    pub fn name(&self) -> &'static str {
        match self {
            Backend::Sqlite { .. } => "sqlite",
            Backend::Redis(c) => c.backend_name(),
            Backend::Postgres(_) => "postgres",
            Backend::Amqp { .. } => "rabbitmq",
            Backend::Nats { .. } => "nats",
        }
    }

    /// Once backends that forget a claimed slot after a while: the option
    /// that sets how long, and its value. It must exceed `max_late_ms`, or a
    /// late claimer could win a slot that was already won and forgotten.
    pub fn memory_ms(&self) -> Option<(&'static str, u64)> {
        match self {
            Backend::Amqp { slot_ttl_ms, .. } => Some(("slot_ttl_ms", *slot_ttl_ms)),
            Backend::Nats {
                duplicate_window_ms,
                ..
            } => Some(("duplicate_window_ms", *duplicate_window_ms)),
            _ => None,
        }
    }

    /// Parses and checks a backend URL without connecting.
    pub fn parse(url: &str) -> Result<Backend> {
        let bad = |m: String| Error::invalid("backend", m);
        let (scheme, _) = url
            .split_once("://")
            .ok_or_else(|| bad(format!("{url:?} is not a URL (expected scheme://...)")))?;
        match scheme {
            "sqlite" => sqlite::parse_url(url),
            "redis" | "redis+cluster" | "redis+sentinel" | "redis+unix" => {
                Ok(Backend::Redis(RedisConfig::parse(url)?))
            }
            "postgres" | "postgresql" => postgres::parse_url(url),
            "amqp" | "amqps" => rabbitmq::parse_url(url),
            "nats" => nats::parse_url(url),
            other => Err(bad(format!(
                "unknown scheme {other:?}; expected sqlite://, postgres://, redis://, redis+cluster://, redis+sentinel://, redis+unix://, amqp://, amqps:// or nats://"
            ))),
        }
    }
}

/// Connects to the backend named by `url`, runs its migrations and returns it.
/// Every store it returns refuses slots more than `opts.max_future` ahead
/// of its clock ([`future::FutureGuard`]).
pub async fn open(url: &str, opts: &StoreOptions) -> Result<DynStore> {
    let store: DynStore = match Backend::parse(url)? {
        Backend::Sqlite { path, max_batch } => {
            Arc::new(SqliteStore::open(&path, max_batch, opts).await?)
        }
        Backend::Redis(cfg) => redis::open(&cfg, opts).await?,
        Backend::Postgres(target) => Arc::new(PostgresStore::open(&target, opts).await?),
        b @ Backend::Amqp { .. } => Arc::new(RabbitStore::open(&b).await?),
        b @ Backend::Nats { .. } => Arc::new(NatsStore::open(&b).await?),
    };
    Ok(Arc::new(future::FutureGuard::new(store, opts.max_future)))
}

/// Runs `prune` in small batches until nothing is left, then sleeps `every`
/// (lease backends; once backends forget by themselves).
pub async fn prune_loop(store: DynStore, retention: Duration, every: Duration) {
    let Some(leases) = store.leases() else {
        return;
    };
    loop {
        let cutoff = host_now_ms() - retention.as_millis() as i64;
        loop {
            match leases.prune(cutoff, 500).await {
                Ok(n) if n >= 500 => tokio::task::yield_now().await,
                Ok(n) => {
                    if n > 0 {
                        tracing::debug!(pruned = n, "pruned old runs");
                    }
                    break;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "pruning old runs failed");
                    break;
                }
            }
        }
        tokio::time::sleep(every).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn address_identity_leaves_credentials_and_options_out() {
        let a = address_identity("amqp", &["amqp://u:pw@h:5672/%2f?prefix=x"], "p");
        assert_eq!(
            a,
            address_identity("amqp", &["amqp://other:pw2@H:5672/%2f"], "p")
        );
        assert_ne!(a, address_identity("amqp", &["amqp://h:5672/vh"], "p"));
        assert_ne!(a, address_identity("amqp", &["amqp://h:5672/%2f"], "q"));
        assert_ne!(a, address_identity("nats", &["amqp://h:5672/%2f"], "p"));
        assert!(a.starts_with("amqp:") && !a.contains("pw"), "{a}");
        assert_eq!(
            address_identity("nats", &["nats://a:1,b:2"], "p"),
            address_identity("nats", &["nats://b:2,a:1"], "p")
        );
    }

    #[test]
    fn backend_urls() {
        assert_eq!(
            Backend::parse("sqlite://./d/a.db").unwrap(),
            Backend::Sqlite {
                path: "./d/a.db".into(),
                max_batch: 64,
            }
        );
        assert_eq!(
            Backend::parse("sqlite:///tmp/a.db?max_batch=1").unwrap(),
            Backend::Sqlite {
                path: "/tmp/a.db".into(),
                max_batch: 1,
            }
        );
        // An option SQLite does not know, or a batch out of range, is
        // refused by name rather than ignored.
        let unknown = Backend::parse("sqlite:///tmp/a.db?max_bacth=1").unwrap_err();
        assert!(unknown.to_string().contains("\"max_bacth\""), "{unknown}");
        for (url, field) in [
            ("sqlite:///tmp/a.db?max_batch=0", "max_batch"),
            ("sqlite:///tmp/a.db?max_batch=65", "max_batch"),
            ("sqlite:///tmp/a.db?max_batch=1&max_batch=2", "backend"),
        ] {
            match Backend::parse(url) {
                Err(Error::InvalidArgument { field: f, .. }) => assert_eq!(f, field, "{url}"),
                other => panic!("{url}: {other:?}"),
            }
        }
        for bad in ["", "sqlite://", "sqlite://?max_batch=1", "nope", "ftp://x"] {
            assert!(matches!(
                Backend::parse(bad),
                Err(Error::InvalidArgument {
                    field: "backend",
                    ..
                })
            ));
        }
    }
}
