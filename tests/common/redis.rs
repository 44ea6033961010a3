//! Redis store factories for the suites: the real server at 127.0.0.1:6379,
//! the local cluster at 127.0.0.1:7000-7002 (scripts/services/
//! extra-redis-cluster.sh), the server on a Unix socket
//! (scripts/services/extra-redis-unix.sh), and an IDMP-capable server named by
//! `ANARCHON_TEST_REDIS_IDMP_URL`. Every store gets its own key prefix, so
//! tests never see each other's keys.

use anarchon::store::{self, DynStore, StoreOptions};

use super::services;

pub const REDIS: &str = "127.0.0.1:6379";
pub const CLUSTER: &str = "127.0.0.1:7000";
pub const CLUSTER_NODES: &str = "127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002";
/// The socket of scripts/services/extra-redis-unix.sh.
pub const UNIX_SOCKET: &str = "/tmp/anarchon-redis-unix/redis.sock";
pub const IDMP_ENV: &str = "ANARCHON_TEST_REDIS_IDMP_URL";

/// A key prefix no other test uses.
pub fn prefix() -> String {
    format!("anarchon-test-{:016x}", rand::random::<u64>())
}

/// `redis://127.0.0.1:6379/0?strategy=…&prefix=<unique>`.
pub fn url(strategy: &str) -> String {
    format!("redis://{REDIS}/0?strategy={strategy}&prefix={}", prefix())
}

/// `redis+cluster://127.0.0.1:7000,…?strategy=…&prefix=<unique>`.
pub fn cluster_url(strategy: &str) -> String {
    format!(
        "redis+cluster://{CLUSTER_NODES}?strategy={strategy}&prefix={}",
        prefix()
    )
}

pub fn have_redis() -> bool {
    services::require("Redis", REDIS)
}

pub fn have_cluster() -> bool {
    services::require("Redis Cluster", CLUSTER)
}

/// A store on the single Redis (`None`: Redis is down outside CI).
pub async fn single(strategy: &str) -> Option<DynStore> {
    open_if(have_redis(), url(strategy)).await
}

/// `redis+unix://<UNIX_SOCKET>?db=1&strategy=…&prefix=<unique>`.
pub fn unix_url(strategy: &str) -> String {
    format!(
        "redis+unix://{UNIX_SOCKET}?db=1&strategy={strategy}&prefix={}",
        prefix()
    )
}

pub fn have_unix() -> bool {
    services::require_unix("Redis on a Unix socket", UNIX_SOCKET)
}

/// A store on the Redis at [`UNIX_SOCKET`], over `redis+unix://`.
pub async fn unix(strategy: &str) -> Option<DynStore> {
    open_if(have_unix(), unix_url(strategy)).await
}

/// A store on the local Redis Cluster.
pub async fn cluster(strategy: &str) -> Option<DynStore> {
    open_if(have_cluster(), cluster_url(strategy)).await
}

/// The store at `url` when its server is `up`.
async fn open_if(up: bool, url: String) -> Option<DynStore> {
    if !up {
        return None;
    }
    Some(store::open(&url, &StoreOptions::default()).await.unwrap())
}

/// The `idmp` strategy on the Redis ≥ 8.6 named by
/// `ANARCHON_TEST_REDIS_IDMP_URL` (a `redis://` or `redis+cluster://` URL
/// without query); skipped when it is not set.
pub fn idmp_base() -> Option<String> {
    match std::env::var(IDMP_ENV) {
        Ok(u) if !u.is_empty() => Some(u),
        _ => {
            eprintln!("SKIPPED Redis idmp happy path: set {IDMP_ENV} to a Redis >= 8.6");
            None
        }
    }
}

pub async fn idmp() -> Option<DynStore> {
    let base = idmp_base()?;
    let sep = if base.contains('?') { '&' } else { '?' };
    let url = format!("{base}{sep}strategy=idmp&prefix={}", prefix());
    Some(store::open(&url, &StoreOptions::default()).await.unwrap())
}
