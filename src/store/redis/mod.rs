//! The Redis store: one URL scheme, four strategies.
//!
//! ```text
//! redis://[user:pass@]HOST:PORT/DB?strategy=lease|stream-id|idmp|script&prefix=anarchon
//! redis+cluster://[user:pass@]HOST:PORT[,HOST:PORT…]?strategy=…
//! ```
//!
//! | strategy | module | the atomic step |
//! |---|---|---|
//! | `lease` (default) | [`lease`] | one Lua script (`lease.lua`, `EVALSHA`) runs the §3.1 decision table |
//! | `stream-id` | [`stream_id`] | `XADD <stream> <slot_ms>-0`: the stream refuses an ID it already has |
//! | `idmp` | [`idmp`] | `XADD … IDMP <job> <slot_ms>` (Redis ≥ 8.6): the server de-duplicates |
//! | `script` | [`script`] | one Lua script (`script.lua`) scans the job's window, appends if absent |
//!
//! Every key of a job carries the `{job}` hash tag (`<prefix>:{<job>}:…`), so
//! every key a claim touches sits in one Redis Cluster hash slot, and a Lua
//! script may touch all of them. The only keys outside a job's slot are the
//! lease strategy's indexes (runs per holder, the job registry for pruning);
//! on a cluster they are written by separate commands after the atomic step
//! (they are best-effort helpers, never part of a decision).
//!
//! Connections are multiplexed and reconnect by themselves (a
//! `ConnectionManager`, or the cluster client's own connections), so
//! concurrent claims are pipelined on one socket per node. A Redis that
//! cannot be reached is [`Error::Unavailable`]; nothing that failed is ever
//! reported as `WON`. Every step is idempotent for the same token, so a resend
//! after a lost answer finds the caller's own claim.

mod idmp;
mod lease;
mod once;
mod script;
mod stream_id;

use std::fmt;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ::redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use ::redis::cluster::ClusterClient;
use ::redis::cluster_async::ClusterConnection;
use ::redis::{Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, ServerErrorKind, Value};

use super::{DynStore, StoreOptions};
use crate::claim::{host_now_ms, Holder, Job};
use crate::error::{Error, Result};

pub use idmp::IdmpStore;
pub use lease::LeaseStore;
pub use script::ScriptStore;
pub use stream_id::StreamIdStore;

/// How a Redis backend decides a claim.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strategy {
    Lease,
    StreamId,
    Idmp,
    Script,
}

impl Strategy {
    pub fn parse(s: &str) -> Result<Strategy> {
        Ok(match s {
            "lease" => Strategy::Lease,
            "stream-id" => Strategy::StreamId,
            "idmp" => Strategy::Idmp,
            "script" => Strategy::Script,
            other => {
                return Err(Error::invalid(
                    "backend",
                    format!(
                    "unknown redis strategy {other:?}; expected lease, stream-id, idmp or script"
                ),
                ))
            }
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Strategy::Lease => "lease",
            Strategy::StreamId => "stream-id",
            Strategy::Idmp => "idmp",
            Strategy::Script => "script",
        }
    }
}

/// A parsed `redis://` or `redis+cluster://` backend URL.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisConfig {
    /// `redis+cluster://`: use the cluster client.
    pub cluster: bool,
    /// Connection URLs without the query: the server, or the cluster's seed nodes.
    pub nodes: Vec<String>,
    pub strategy: Strategy,
    /// Every key starts with `<prefix>:`.
    pub prefix: String,
    /// `script`: how far back the script looks (and how long entries are kept).
    pub window_ms: u64,
    /// `idmp`: `IDMP-DURATION`, set when the stream is created (whole seconds).
    pub idmp_duration_ms: u64,
    /// `idmp`: `IDMP-MAXSIZE`, set when the stream is created.
    pub idmp_maxsize: u64,
    /// `lease`: approximate cap of each job's history stream (`XADD … MAXLEN ~`).
    pub history_maxlen: u64,
    /// `lease`, one server: after the server is found to have forgotten its
    /// claims (a restart without persistence), no claim is decided for this
    /// long. It must be at least the longest lease a claim holds.
    pub quarantine_ms: u64,
}

impl fmt::Debug for RedisConfig {
    // The URLs may carry a password: never print it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let nodes: Vec<String> = self.nodes.iter().map(|n| redact(n)).collect();
        f.debug_struct("RedisConfig")
            .field("cluster", &self.cluster)
            .field("nodes", &nodes)
            .field("strategy", &self.strategy)
            .field("prefix", &self.prefix)
            .field("window_ms", &self.window_ms)
            .field("idmp_duration_ms", &self.idmp_duration_ms)
            .field("idmp_maxsize", &self.idmp_maxsize)
            .field("history_maxlen", &self.history_maxlen)
            .field("quarantine_ms", &self.quarantine_ms)
            .finish()
    }
}

/// `redis://user:secret@host` → `redis://user:***@host`.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let userinfo = &url[s + 3..at];
            let user = userinfo.split(':').next().unwrap_or_default();
            format!("{}{}:***{}", &url[..s + 3], user, &url[at..])
        }
        _ => url.to_owned(),
    }
}

pub const DEFAULT_PREFIX: &str = "anarchon";
pub const DEFAULT_WINDOW_MS: u64 = 24 * 3_600_000;
pub const DEFAULT_IDMP_DURATION_MS: u64 = 24 * 3_600_000;
pub const DEFAULT_IDMP_MAXSIZE: u64 = 10_000;
pub const DEFAULT_HISTORY_MAXLEN: u64 = 1_000;
/// Twice the default lease (30 s).
pub const DEFAULT_QUARANTINE_MS: u64 = 60_000;

impl RedisConfig {
    /// Parses and checks a `redis://` or `redis+cluster://` URL without connecting.
    pub fn parse(url: &str) -> Result<RedisConfig> {
        let bad = |m: String| Error::invalid("backend", m);
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| bad(format!("{} is not a URL", redact(url))))?;
        let (base, query) = match rest.split_once('?') {
            Some((b, q)) => (b, q),
            None => (rest, ""),
        };
        let mut cfg = RedisConfig {
            cluster: false,
            nodes: Vec::new(),
            strategy: Strategy::Lease,
            prefix: DEFAULT_PREFIX.to_owned(),
            window_ms: DEFAULT_WINDOW_MS,
            idmp_duration_ms: DEFAULT_IDMP_DURATION_MS,
            idmp_maxsize: DEFAULT_IDMP_MAXSIZE,
            history_maxlen: DEFAULT_HISTORY_MAXLEN,
            quarantine_ms: DEFAULT_QUARANTINE_MS,
        };
        for (k, v) in url::form_urlencoded::parse(query.as_bytes()) {
            let num = |v: &str| {
                v.parse::<u64>()
                    .map_err(|_| bad(format!("redis option {k}={v:?} is not a whole number")))
            };
            match &*k {
                "strategy" => cfg.strategy = Strategy::parse(&v)?,
                "prefix" => cfg.prefix = v.into_owned(),
                "window_ms" => cfg.window_ms = num(&v)?,
                "idmp_duration_ms" => cfg.idmp_duration_ms = num(&v)?,
                "idmp_maxsize" => cfg.idmp_maxsize = num(&v)?,
                "history_maxlen" => cfg.history_maxlen = num(&v)?,
                "quarantine_ms" => cfg.quarantine_ms = num(&v)?,
                other => {
                    return Err(bad(format!(
                        "unknown redis option {other:?}; known: strategy, prefix, window_ms, idmp_duration_ms, idmp_maxsize, history_maxlen, quarantine_ms"
                    )))
                }
            }
        }
        match scheme {
            "redis" => {
                let node = format!("redis://{base}");
                ::redis::Client::open(node.as_str())
                    .map_err(|e| bad(format!("{}: {e}", redact(&node))))?;
                cfg.nodes = vec![node];
            }
            "redis+cluster" => {
                cfg.cluster = true;
                let (userinfo, hosts) = match base.rsplit_once('@') {
                    Some((u, h)) => (format!("{u}@"), h),
                    None => (String::new(), base),
                };
                let hosts = match hosts.split_once('/') {
                    Some((h, "" | "0")) => h,
                    Some((_, db)) => {
                        return Err(bad(format!(
                            "a Redis Cluster has only database 0, not {db:?}"
                        )))
                    }
                    None => hosts,
                };
                for h in hosts.split(',').map(str::trim).filter(|h| !h.is_empty()) {
                    cfg.nodes.push(format!("redis://{userinfo}{h}"));
                }
                if cfg.nodes.is_empty() {
                    return Err(bad("redis+cluster:// needs at least one HOST:PORT".into()));
                }
                ClusterClient::new(cfg.nodes.clone())
                    .map_err(|e| bad(format!("redis+cluster nodes: {e}")))?;
            }
            other => return Err(bad(format!("{other}:// is not a Redis scheme"))),
        }
        cfg.check()?;
        Ok(cfg)
    }

    fn check(&self) -> Result<()> {
        let bad = |m: String| Err(Error::invalid("backend", m));
        if self.prefix.is_empty()
            || self.prefix.len() > 100
            || !self
                .prefix
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '/' | '-'))
        {
            // Braces would break the `{job}` hash tag.
            return bad(format!(
                "redis prefix {:?} must be 1-100 characters of [A-Za-z0-9._:/-]",
                self.prefix
            ));
        }
        if self.window_ms < 1000 {
            return bad(format!("window_ms={} is below 1000", self.window_ms));
        }
        if !(1000..=86_400_000).contains(&self.idmp_duration_ms) {
            return bad(format!(
                "idmp_duration_ms={} is outside 1000..=86400000 (IDMP-DURATION takes 1-86400 s)",
                self.idmp_duration_ms
            ));
        }
        if !(1..=10_000).contains(&self.idmp_maxsize) {
            return bad(format!(
                "idmp_maxsize={} is outside 1..=10000",
                self.idmp_maxsize
            ));
        }
        if self.history_maxlen == 0 {
            return bad("history_maxlen must be at least 1".into());
        }
        if self.quarantine_ms > 7 * 86_400_000 {
            return bad(format!(
                "quarantine_ms={} is above a week",
                self.quarantine_ms
            ));
        }
        Ok(())
    }

    /// The `StoreInfo::backend` name.
    pub fn backend_name(&self) -> &'static str {
        match (self.cluster, self.strategy) {
            (false, Strategy::Lease) => "redis-lease",
            (false, Strategy::StreamId) => "redis-stream-id",
            (false, Strategy::Idmp) => "redis-idmp",
            (false, Strategy::Script) => "redis-script",
            (true, Strategy::Lease) => "redis-cluster-lease",
            (true, Strategy::StreamId) => "redis-cluster-stream-id",
            (true, Strategy::Idmp) => "redis-cluster-idmp",
            (true, Strategy::Script) => "redis-cluster-script",
        }
    }

    /// The `StoreInfo::identity`: a hash of the servers, database, prefix
    /// and strategy (an id kept in Redis would be lost with the data of a
    /// server without persistence, and split the mesh at its restart).
    pub fn identity(&self) -> String {
        // `redis://h:1` and `redis://h:1/0` are the same database.
        let nodes: Vec<String> = self
            .nodes
            .iter()
            .map(|n| {
                let base = n.split(['?', '#']).next().unwrap_or_default();
                let rest = base.split_once("://").map_or(base, |(_, r)| r);
                match rest.split_once('/') {
                    Some((_, db)) if !db.trim_matches('/').is_empty() => base.to_owned(),
                    _ => format!("{}/0", base.trim_end_matches('/')),
                }
            })
            .collect();
        let nodes: Vec<&str> = nodes.iter().map(String::as_str).collect();
        super::address_identity(self.backend_name(), &nodes, &self.prefix)
    }
}

/// Connects, checks the server can run the strategy, and returns the store.
pub async fn open(cfg: &RedisConfig, opts: &StoreOptions) -> Result<DynStore> {
    let conn = Conn::connect(cfg).await?;
    Ok(match cfg.strategy {
        Strategy::Lease => Arc::new(LeaseStore::open(conn, cfg, opts).await?),
        Strategy::StreamId => Arc::new(StreamIdStore::open(conn, cfg).await?),
        Strategy::Idmp => Arc::new(IdmpStore::open(conn, cfg).await?),
        Strategy::Script => Arc::new(ScriptStore::open(conn, cfg).await?),
    })
}

/// How long one command may take before the claim answers `UNAVAILABLE`.
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(5);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// A multiplexed, self-reconnecting connection to one server or a cluster.
/// Cloning is cheap; every clone shares the same sockets, so concurrent
/// requests are pipelined.
#[derive(Clone)]
pub(crate) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl Conn {
    async fn connect(cfg: &RedisConfig) -> Result<Conn> {
        if cfg.cluster {
            let client = ClusterClient::builder(cfg.nodes.clone())
                .connection_timeout(CONNECT_TIMEOUT)
                .response_timeout(RESPONSE_TIMEOUT)
                .retries(3)
                .build()
                .map_err(convert)?;
            let conn = client.get_async_connection().await.map_err(convert)?;
            Ok(Conn::Cluster(conn))
        } else {
            let url = cfg.nodes.first().map(String::as_str).unwrap_or_default();
            let client = ::redis::Client::open(url).map_err(convert)?;
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(CONNECT_TIMEOUT))
                .set_response_timeout(Some(RESPONSE_TIMEOUT))
                .set_number_of_retries(2)
                .set_min_delay(Duration::from_millis(50))
                .set_max_delay(Duration::from_millis(500));
            let conn = ConnectionManager::new_with_config(client, config)
                .await
                .map_err(convert)?;
            Ok(Conn::Single(conn))
        }
    }

    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self, Conn::Cluster(_))
    }

    /// Runs a script by `EVALSHA`. The redis crate loads it and retries once
    /// on `NOSCRIPT`; a `SCRIPT FLUSH` or a restart between that load and
    /// the retry answers `NOSCRIPT` again, so this tries a few times more.
    /// A script that answered `NOSCRIPT` never ran, so a retry is safe.
    pub(crate) async fn invoke(&self, inv: &::redis::ScriptInvocation<'_>) -> Result<Value> {
        let mut tries = 0;
        loop {
            match inv.invoke_async(&mut self.clone()).await {
                Err(e) if tries < 3 && e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                    tries += 1;
                }
                res => return res.map_err(convert),
            }
        }
    }

    /// Runs one command.
    pub(crate) async fn query<T: ::redis::FromRedisValue>(&self, cmd: &Cmd) -> Result<T> {
        let mut c = self.clone();
        cmd.query_async(&mut c).await.map_err(convert)
    }

    /// `INFO server` of every node this connection reaches (one per master
    /// on a cluster).
    pub(crate) async fn server_infos(&self) -> Result<Vec<String>> {
        let v: Value = self.query(::redis::cmd("INFO").arg("server")).await?;
        let mut out = Vec::new();
        collect_strings(&v, &mut out);
        Ok(out)
    }
}

fn collect_strings(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::BulkString(b) => out.push(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => out.push(s.clone()),
        Value::VerbatimString { text, .. } => out.push(text.clone()),
        Value::Map(m) => m.iter().for_each(|(_, v)| collect_strings(v, out)),
        Value::Array(a) | Value::Set(a) => a.iter().for_each(|v| collect_strings(v, out)),
        _ => {}
    }
}

/// `redis_version:8.6.0` → (8, 6).
pub(crate) fn server_version(info: &str) -> Option<(u32, u32)> {
    let line = info
        .lines()
        .find_map(|l| l.trim().strip_prefix("redis_version:"))?;
    let mut parts = line.trim().split('.');
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// Translates redis errors: anything that means "could not reach Redis, or
/// it could not answer now" is `UNAVAILABLE` (retry, with the same token);
/// everything else is a store error. Never a win.
pub(crate) fn convert(e: RedisError) -> Error {
    let unavailable = e.is_io_error()
        || e.is_connection_refusal()
        || e.is_connection_dropped()
        || e.is_timeout()
        || matches!(
            e.kind(),
            ErrorKind::Io
                | ErrorKind::ClusterConnectionNotFound
                | ErrorKind::Server(
                    ServerErrorKind::BusyLoading
                        | ServerErrorKind::TryAgain
                        | ServerErrorKind::ClusterDown
                        | ServerErrorKind::MasterDown
                        | ServerErrorKind::ReadOnly
                )
        )
        || matches!(e.code(), Some("BUSY"));
    if unavailable {
        Error::Unavailable(format!("redis: {e}"))
    } else {
        Error::Store(format!("redis: {e}"))
    }
}

/// The keys of one job. Every one carries the `{job}` hash tag, so all of
/// them live in the same cluster hash slot.
#[derive(Debug, Clone)]
pub(crate) struct JobKeys {
    base: String,
}

impl JobKeys {
    pub(crate) fn new(prefix: &str, job: &Job) -> JobKeys {
        JobKeys {
            base: format!("{prefix}:{{{}}}", job.as_str()),
        }
    }

    pub(crate) fn key(&self, suffix: &str) -> String {
        format!("{}:{suffix}", self.base)
    }
}

/// The key of the set of runs a holder holds (lease strategy).
pub(crate) fn holder_key(prefix: &str, h: &Holder) -> String {
    format!("{prefix}:holder:{}:{}", h.node, h.instance)
}

/// Redis's clock (`TIME`), in epoch milliseconds.
pub(crate) async fn time_ms(conn: &Conn) -> Result<i64> {
    let (secs, micros): (i64, i64) = conn.query(&::redis::cmd("TIME")).await?;
    Ok(secs * 1000 + micros / 1000)
}

/// The Redis clock for steps that are a single plain command (no script to
/// call `TIME` in): the host clock plus an offset measured with `TIME`,
/// refreshed every few seconds. Its error is about half a round trip.
pub(crate) struct RedisClock {
    offset_ms: AtomicI64,
    measured_at_ms: AtomicI64,
}

const CLOCK_REFRESH_MS: i64 = 5_000;

impl RedisClock {
    pub(crate) async fn new(conn: &Conn) -> Result<RedisClock> {
        let c = RedisClock {
            offset_ms: AtomicI64::new(0),
            measured_at_ms: AtomicI64::new(0),
        };
        c.measure(conn).await?;
        Ok(c)
    }

    async fn measure(&self, conn: &Conn) -> Result<()> {
        let before = host_now_ms();
        let (secs, micros): (i64, i64) = conn.query(&::redis::cmd("TIME")).await?;
        let after = host_now_ms();
        let redis_ms = secs * 1000 + micros / 1000;
        self.offset_ms
            .store(redis_ms - (before + after) / 2, Ordering::Relaxed);
        self.measured_at_ms.store(after, Ordering::Relaxed);
        Ok(())
    }

    /// Redis's `now`, in epoch milliseconds.
    pub(crate) async fn now(&self, conn: &Conn) -> Result<i64> {
        let host = host_now_ms();
        if host - self.measured_at_ms.load(Ordering::Relaxed) > CLOCK_REFRESH_MS {
            self.measure(conn).await?;
            return Ok(host_now_ms() + self.offset_ms.load(Ordering::Relaxed));
        }
        Ok(host + self.offset_ms.load(Ordering::Relaxed))
    }
}

/// Small accessors for script replies.
pub(crate) mod reply {
    use super::Value;
    use crate::error::{Error, Result};

    pub(crate) fn array(v: Value) -> Result<Vec<Value>> {
        match v {
            Value::Array(a) | Value::Set(a) => Ok(a),
            Value::Nil => Ok(Vec::new()),
            other => Err(Error::Store(format!(
                "redis: expected an array, got {other:?}"
            ))),
        }
    }

    pub(crate) fn int(v: Option<&Value>) -> Result<i64> {
        match v {
            Some(Value::Int(i)) => Ok(*i),
            Some(Value::BulkString(b)) => std::str::from_utf8(b)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| Error::Store("redis: expected a number".into())),
            Some(Value::SimpleString(s)) => s
                .parse()
                .map_err(|_| Error::Store("redis: expected a number".into())),
            other => Err(Error::Store(format!(
                "redis: expected a number, got {other:?}"
            ))),
        }
    }

    pub(crate) fn string(v: Option<&Value>) -> Result<String> {
        match v {
            Some(Value::BulkString(b)) => Ok(String::from_utf8_lossy(b).into_owned()),
            Some(Value::SimpleString(s)) => Ok(s.clone()),
            Some(Value::Int(i)) => Ok(i.to_string()),
            Some(Value::Nil) | None => Ok(String::new()),
            other => Err(Error::Store(format!(
                "redis: expected a string, got {other:?}"
            ))),
        }
    }
}

/// A fencing number from a stream entry ID `<ms>-<seq>`: strictly increasing
/// with the ID, so later claims of a job get higher numbers.
pub(crate) fn fencing_of_id(id: &str) -> Result<u64> {
    let (ms, seq) = parse_id(id)?;
    Ok(ms.saturating_mul(1 << 16).saturating_add(seq.min(0xffff)))
}

pub(crate) fn parse_id(id: &str) -> Result<(u64, u64)> {
    let bad = || Error::Store(format!("redis: malformed stream id {id:?}"));
    let (ms, seq) = id.split_once('-').ok_or_else(bad)?;
    Ok((
        ms.parse().map_err(|_| bad())?,
        seq.parse().map_err(|_| bad())?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_names_the_place_not_the_credentials() {
        let id = |u: &str| RedisConfig::parse(u).unwrap().identity();
        assert_eq!(id("redis://h:1"), id("redis://h:1/0"));
        assert_eq!(id("redis://h:1/0"), id("redis://:secret@h:1/0"));
        assert_ne!(id("redis://h:1/0"), id("redis://h:1/1"));
        assert_ne!(id("redis://h:1/0"), id("redis://h:1/0?prefix=other"));
        assert_ne!(id("redis://h:1/0"), id("redis://h:1/0?strategy=script"));
        assert_eq!(
            id("redis+cluster://a:1,b:2"),
            id("redis+cluster://u:pw@b:2,a:1")
        );
        assert!(!id("redis://:secret@h:1/0").contains("secret"));
        assert!(id("redis://h:1/0").starts_with("redis-lease:"));
    }

    #[test]
    fn urls() {
        let c = RedisConfig::parse("redis://127.0.0.1:6379/2").unwrap();
        assert_eq!(c.strategy, Strategy::Lease);
        assert_eq!(c.prefix, "anarchon");
        assert_eq!(c.nodes, vec!["redis://127.0.0.1:6379/2".to_string()]);
        assert!(!c.cluster);
        let c = RedisConfig::parse(
            "redis://h:1/0?strategy=script&prefix=t.x&window_ms=5000&history_maxlen=9",
        )
        .unwrap();
        assert_eq!(
            (c.strategy, c.prefix.as_str(), c.window_ms, c.history_maxlen),
            (Strategy::Script, "t.x", 5000, 9)
        );
        assert_eq!(c.quarantine_ms, DEFAULT_QUARANTINE_MS);
        let c = RedisConfig::parse("redis://h:1/0?quarantine_ms=0").unwrap();
        assert_eq!(c.quarantine_ms, 0);
        let c =
            RedisConfig::parse("redis+cluster://u:pw@a:7000,b:7001/?strategy=stream-id").unwrap();
        assert!(c.cluster);
        assert_eq!(
            c.nodes,
            vec![
                "redis://u:pw@a:7000".to_string(),
                "redis://u:pw@b:7001".into()
            ]
        );
        assert!(!format!("{c:?}").contains("pw"));
        for bad in [
            "redis://h:1?strategy=nope",
            "redis://h:1?prefix=a{b}",
            "redis://h:1?prefix=",
            "redis://h:1?colour=blue",
            "redis://h:1?window_ms=x",
            "redis://h:1?idmp_maxsize=20000",
            "redis://h:1?quarantine_ms=-1",
            "redis://h:1?quarantine_ms=999999999999",
            "redis://h:1?idmp_duration_ms=100",
            "redis+cluster://",
            "redis+cluster://a:1/3",
        ] {
            assert!(
                matches!(
                    RedisConfig::parse(bad),
                    Err(Error::InvalidArgument {
                        field: "backend",
                        ..
                    })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn redaction() {
        assert_eq!(redact("redis://u:pw@h:1/0"), "redis://u:***@h:1/0");
        assert_eq!(redact("redis://h:1/0"), "redis://h:1/0");
    }

    #[test]
    fn ids_and_versions() {
        assert_eq!(fencing_of_id("1-0").unwrap(), 1 << 16);
        assert!(fencing_of_id("5-1").unwrap() < fencing_of_id("6-0").unwrap());
        assert!(fencing_of_id("x").is_err());
        assert_eq!(
            server_version("# Server\r\nredis_version:7.0.15\r\n"),
            Some((7, 0))
        );
        assert_eq!(server_version("redis_version:8.6.1"), Some((8, 6)));
        assert_eq!(server_version("nothing"), None);
    }

    #[test]
    fn keys_carry_the_job_hash_tag() {
        let k = JobKeys::new("p", &Job::parse("a/b").unwrap());
        assert_eq!(k.key("runs"), "p:{a/b}:runs");
    }
}
