//! The Redis store: one URL scheme, four strategies.
//!
//! ```text
//! redis://[user:pass@]HOST:PORT/DB?strategy=lease|stream-id|idmp|script&prefix=anarchon
//! redis+cluster://[user:pass@]HOST:PORT[,HOST:PORT…]?strategy=…&min_replicas=N&replica_timeout_ms=T
//! redis+sentinel://[user:pass@]HOST:PORT[,HOST:PORT…]/MASTER?strategy=…&min_replicas=N
//! redis+unix:///PATH/TO/redis.sock?db=N&user=U&pass=P&strategy=…
//! ```
//!
//! `redis+unix://` reaches one server over its Unix socket (`unixsocket` in
//! redis.conf), for a sidecar on the same host as its Redis: the same store
//! as `redis://`, without the loopback TCP stack on either side.
//!
//! [`conn`] holds the connection all strategies share: retries through a
//! failover, rebuilds of a stuck connection, following the Sentinels' master,
//! and `WAIT` for `min_replicas` after each deciding step.
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

mod call;
mod conn;
mod idmp;
mod lease;
mod once;
mod script;
mod stream_id;

use std::fmt;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use ::redis::cluster::ClusterClient;
use ::redis::{RedisError, Value};

use super::backend_url::{redact, split_options};
use super::{DynStore, StoreOptions};
use crate::claim::{host_now_ms, Holder, Job};
use crate::error::{Error, Result};

pub(crate) use call::ScriptCall;
pub(crate) use conn::Conn;
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
    /// `redis+sentinel://…/MASTER`: the master's name; `nodes` are then the
    /// Sentinels.
    pub sentinel: Option<String>,
    /// `redis+sentinel://`: `user:pass@` for the master (the same credentials
    /// as the Sentinels), or empty.
    pub master_userinfo: String,
    /// Replicas that must acknowledge a claim, renew or release (`WAIT`);
    /// `None`: 1 on a cluster or behind Sentinel when every master has a
    /// replica at start, else 0.
    pub min_replicas: Option<u32>,
    /// How long a step waits for `min_replicas` before it answers `UNAVAILABLE`.
    pub replica_timeout_ms: u64,
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
            .field("sentinel", &self.sentinel)
            .field("min_replicas", &self.min_replicas)
            .field("replica_timeout_ms", &self.replica_timeout_ms)
            .finish()
    }
}

/// The query options of a Redis backend URL.
const OPTIONS: &[&str] = &[
    "strategy",
    "prefix",
    "window_ms",
    "idmp_duration_ms",
    "idmp_maxsize",
    "history_maxlen",
    "quarantine_ms",
    "min_replicas",
    "replica_timeout_ms",
    "db",
    "user",
    "pass",
];

pub const DEFAULT_PREFIX: &str = "anarchon";
pub const DEFAULT_WINDOW_MS: u64 = 24 * 3_600_000;
pub const DEFAULT_IDMP_DURATION_MS: u64 = 24 * 3_600_000;
pub const DEFAULT_IDMP_MAXSIZE: u64 = 10_000;
pub const DEFAULT_HISTORY_MAXLEN: u64 = 1_000;
/// Twice the default lease (30 s).
pub const DEFAULT_QUARANTINE_MS: u64 = 60_000;
pub const DEFAULT_REPLICA_TIMEOUT_MS: u64 = 1_000;

impl RedisConfig {
    /// Parses and checks a `redis://` or `redis+cluster://` URL without connecting.
    pub fn parse(url: &str) -> Result<RedisConfig> {
        let bad = |m: String| Error::invalid("backend", m);
        let opts = split_options(url, OPTIONS, &[])?;
        let (scheme, base) = opts
            .base
            .split_once("://")
            .ok_or_else(|| bad(format!("{} is not a URL", redact(url))))?;
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
            sentinel: None,
            master_userinfo: String::new(),
            min_replicas: None,
            replica_timeout_ms: DEFAULT_REPLICA_TIMEOUT_MS,
        };
        // `redis+unix://` only: its database and credentials (a TCP URL
        // writes them as `user:pass@HOST:PORT/DB`).
        let mut unix: Vec<(&str, &str)> = Vec::new();
        for (k, v) in &opts.own {
            let num = |v: &str| {
                v.parse::<u64>()
                    .map_err(|_| bad(format!("redis option {k}={v:?} is not a whole number")))
            };
            match k.as_str() {
                "strategy" => cfg.strategy = Strategy::parse(v)?,
                "prefix" => cfg.prefix = v.clone(),
                "window_ms" => cfg.window_ms = num(v)?,
                "idmp_duration_ms" => cfg.idmp_duration_ms = num(v)?,
                "idmp_maxsize" => cfg.idmp_maxsize = num(v)?,
                "history_maxlen" => cfg.history_maxlen = num(v)?,
                "quarantine_ms" => cfg.quarantine_ms = num(v)?,
                "min_replicas" => {
                    let n = v.parse::<u32>().ok().filter(|n| *n <= 16).ok_or_else(|| {
                        bad(format!(
                            "redis option min_replicas={v:?} must be a whole number from 0 to 16"
                        ))
                    })?;
                    cfg.min_replicas = Some(n);
                }
                "replica_timeout_ms" => cfg.replica_timeout_ms = num(v)?,
                "db" => {
                    v.parse::<u32>().map_err(|_| {
                        bad(format!("redis option db={v:?} is not a database number"))
                    })?;
                    unix.push(("db", v.as_str()));
                }
                "user" | "pass" => unix.push((k.as_str(), v.as_str())),
                // split_options let no other option through.
                _ => {}
            }
        }
        match scheme {
            "redis" => {
                let node = format!("redis://{base}");
                ::redis::Client::open(node.as_str())
                    .map_err(|e| bad(format!("{}: {e}", redact(&node))))?;
                cfg.nodes = vec![node];
            }
            "redis+sentinel" => {
                let (userinfo, hosts) = match base.rsplit_once('@') {
                    Some((u, h)) => (format!("{u}@"), h),
                    None => (String::new(), base),
                };
                let (hosts, master) = match hosts.split_once('/') {
                    Some((h, m)) if !m.trim_matches('/').is_empty() && !m.contains('/') => (h, m),
                    _ => {
                        return Err(bad(
                            "redis+sentinel://HOST:PORT[,HOST:PORT…]/MASTER needs the master's name after the Sentinels".into(),
                        ))
                    }
                };
                for h in hosts.split(',').map(str::trim).filter(|h| !h.is_empty()) {
                    let node = format!("redis://{userinfo}{h}");
                    ::redis::Client::open(node.as_str())
                        .map_err(|e| bad(format!("{}: {e}", redact(&node))))?;
                    cfg.nodes.push(node);
                }
                if cfg.nodes.is_empty() {
                    return Err(bad(
                        "redis+sentinel:// needs at least one Sentinel HOST:PORT".into(),
                    ));
                }
                cfg.sentinel = Some(master.to_owned());
                cfg.master_userinfo = userinfo;
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
            "redis+unix" => {
                if !base.starts_with('/') || base.contains('@') {
                    return Err(bad(
                        "redis+unix:///PATH needs the socket's absolute path (three slashes), with credentials as ?user=U&pass=P".into(),
                    ));
                }
                let mut query = url::form_urlencoded::Serializer::new(String::new());
                if !unix.iter().any(|(k, _)| *k == "db") {
                    query.append_pair("db", "0");
                }
                for (k, v) in &unix {
                    query.append_pair(k, v);
                }
                let node = format!("redis+unix://{base}?{}", query.finish());
                ::redis::Client::open(node.as_str())
                    .map_err(|e| bad(format!("{}: {e}", redact(&node))))?;
                cfg.nodes = vec![node];
            }
            other => return Err(bad(format!("{other}:// is not a Redis scheme"))),
        }
        if let Some((k, _)) = unix.first().filter(|_| scheme != "redis+unix") {
            return Err(bad(format!(
                "redis option {k} is for redis+unix:// only; over TCP write redis://USER:PASS@HOST:PORT/DB"
            )));
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
        if !(10..=60_000).contains(&self.replica_timeout_ms) {
            return bad(format!(
                "replica_timeout_ms={} is outside 10..=60000",
                self.replica_timeout_ms
            ));
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
        if self.sentinel.is_some() {
            return match self.strategy {
                Strategy::Lease => "redis-sentinel-lease",
                Strategy::StreamId => "redis-sentinel-stream-id",
                Strategy::Idmp => "redis-sentinel-idmp",
                Strategy::Script => "redis-sentinel-script",
            };
        }
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
                if let Some(path) = n.strip_prefix("redis+unix://") {
                    // The socket and the database; never the credentials.
                    let (path, query) = path.split_once('?').unwrap_or((path, ""));
                    let db = url::form_urlencoded::parse(query.as_bytes())
                        .find(|(k, _)| k == "db")
                        .map_or_else(|| "0".to_owned(), |(_, v)| v.into_owned());
                    // One place for `address_identity`: `unix:` and the
                    // path stand where a URL's host would.
                    return format!("unix:{path}/{db}");
                }
                let base = n.split(['?', '#']).next().unwrap_or_default();
                let rest = base.split_once("://").map_or(base, |(_, r)| r);
                match rest.split_once('/') {
                    Some((_, db)) if !db.trim_matches('/').is_empty() => base.to_owned(),
                    _ => format!("{}/0", base.trim_end_matches('/')),
                }
            })
            .collect();
        let mut nodes = nodes;
        if let Some(master) = &self.sentinel {
            // The master's name is the place; the Sentinels only find it.
            nodes.push(format!("sentinel-master/{master}"));
        }
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

pub(crate) fn collect_strings(v: &Value, out: &mut Vec<String>) {
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

/// Translates redis errors: anything that means "could not reach Redis, or
/// it could not answer now" is `UNAVAILABLE` (retry, with the same token);
/// everything else is a store error. Never a win.
pub(crate) fn convert(e: RedisError) -> Error {
    if conn::transient(&e) || matches!(e.code(), Some("BUSY" | "NOREPLICAS")) {
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
            base: concat(&[prefix, ":{", job.as_str(), "}"]),
        }
    }

    pub(crate) fn key(&self, suffix: &str) -> String {
        concat(&[&self.base, ":", suffix])
    }
}

/// The parts joined, in one allocation of the exact size. The keys of a
/// claim are built with it: `format!` cost about 1,000 instructions a key
/// (its formatter, and the string grown several times), 8 % of the
/// sidecar's instructions per Redis claim (docs/BENCHMARKS.md, round 8).
pub(crate) fn concat(parts: &[&str]) -> String {
    let mut s = String::with_capacity(parts.iter().map(|p| p.len()).sum());
    for p in parts {
        s.push_str(p);
    }
    s
}

/// A Lua script, loaded on the server now: a broken server or script fails
/// at start, not at the first claim (`EVALSHA` reloads it on `NOSCRIPT`).
pub(crate) async fn load_script(conn: &Conn, lua: &str) -> Result<::redis::Script> {
    let script = ::redis::Script::new(lua);
    script
        .load_async(&mut conn.clone())
        .await
        .map_err(convert)?;
    Ok(script)
}

/// The key of the set of runs a holder holds (lease strategy).
pub(crate) fn holder_key(prefix: &str, h: &Holder) -> String {
    concat(&[
        prefix,
        ":holder:",
        &h.node,
        ":",
        itoa::Buffer::new().format(h.instance),
    ])
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
    fn a_unix_socket_url_names_its_path_database_and_credentials() {
        let c = RedisConfig::parse(
            "redis+unix:///run/redis/r.sock?strategy=lease&db=3&user=u&pass=p%26w&prefix=t",
        )
        .unwrap();
        assert_eq!(
            c.nodes,
            vec!["redis+unix:///run/redis/r.sock?db=3&user=u&pass=p%26w".to_string()]
        );
        assert_eq!(c.prefix, "t");
        assert!(!c.cluster && c.sentinel.is_none());
        assert_eq!(c.backend_name(), "redis-lease");
        assert!(!format!("{c:?}").contains("p%26w"), "{c:?}");
        let plain = RedisConfig::parse("redis+unix:///run/redis/r.sock").unwrap();
        assert_eq!(
            plain.nodes,
            vec!["redis+unix:///run/redis/r.sock?db=0".to_string()]
        );
        // The socket and the database are the place; the credentials are not.
        let id = |u: &str| RedisConfig::parse(u).unwrap().identity();
        assert_eq!(
            id("redis+unix:///run/r.sock"),
            id("redis+unix:///run/r.sock?db=0&pass=x")
        );
        assert_ne!(
            id("redis+unix:///run/r.sock"),
            id("redis+unix:///run/r.sock?db=1")
        );
        assert_ne!(
            id("redis+unix:///run/r.sock"),
            id("redis+unix:///run/s.sock")
        );
        assert_ne!(
            id("redis+unix:///run/r.sock"),
            id("redis://127.0.0.1:6379/0")
        );
        for (url, names) in [
            ("redis+unix://run/r.sock", "absolute path"),
            ("redis+unix://u:p@/run/r.sock", "absolute path"),
            ("redis+unix:///run/r.sock?db=x", "db=\"x\""),
            ("redis://h:1?db=2", "db is for redis+unix://"),
            ("redis+cluster://h:1?pass=p", "pass is for redis+unix://"),
        ] {
            match RedisConfig::parse(url) {
                Err(e) => {
                    let m = e.to_string();
                    assert!(m.contains("backend") && m.contains(names), "{url}: {m}");
                    assert!(!m.contains("=p&") && !m.ends_with("=p"), "{url}: {m}");
                }
                Ok(c) => panic!("{url} parsed: {c:?}"),
            }
        }
    }

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
            "redis+cluster://a:1?min_replicas=-1",
            "redis+cluster://a:1?min_replicas=x",
            "redis+cluster://a:1?min_replicas=99",
            "redis+cluster://a:1?replica_timeout_ms=0",
            "redis+cluster://a:1?replica_timeout_ms=soon",
            "redis+sentinel://a:1",
            "redis+sentinel://a:1/",
            "redis+sentinel:///m",
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
    fn replica_options_and_sentinel_urls() {
        let c = RedisConfig::parse("redis+cluster://a:1").unwrap();
        assert_eq!(
            (c.min_replicas, c.replica_timeout_ms),
            (None, DEFAULT_REPLICA_TIMEOUT_MS)
        );
        let c = RedisConfig::parse("redis+cluster://a:1?min_replicas=2&replica_timeout_ms=250")
            .unwrap();
        assert_eq!((c.min_replicas, c.replica_timeout_ms), (Some(2), 250));
        let c = RedisConfig::parse(
            "redis+sentinel://u:pw@s1:26379,s2:26380/mymaster?strategy=script&min_replicas=1",
        )
        .unwrap();
        assert_eq!(c.sentinel.as_deref(), Some("mymaster"));
        assert_eq!(c.master_userinfo, "u:pw@");
        assert_eq!(
            c.nodes,
            vec![
                "redis://u:pw@s1:26379".to_string(),
                "redis://u:pw@s2:26380".into()
            ]
        );
        assert_eq!(c.backend_name(), "redis-sentinel-script");
        assert!(!format!("{c:?}").contains("pw"));
        let other =
            RedisConfig::parse("redis+sentinel://s1:26379,s2:26380/other?strategy=script").unwrap();
        assert_ne!(c.identity(), other.identity());
        let msg = match RedisConfig::parse("redis://h:1?min_replicas=x") {
            Err(e) => e.to_string(),
            Ok(_) => String::new(),
        };
        assert!(msg.contains("min_replicas"), "{msg}");
        let msg = match RedisConfig::parse("redis://h:1?replica_timeout_ms=5") {
            Err(e) => e.to_string(),
            Ok(_) => String::new(),
        };
        assert!(msg.contains("replica_timeout_ms"), "{msg}");
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
        let h = Holder {
            node: "n1".into(),
            instance: 18_446_744_073_709_551_615,
        };
        assert_eq!(holder_key("p", &h), "p:holder:n1:18446744073709551615");
        let joined = concat(&["ab", "", "c"]);
        assert_eq!((joined.as_str(), joined.capacity()), ("abc", 3));
    }
}
