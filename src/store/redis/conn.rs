//! The connection under every Redis strategy: one server, a cluster, or the
//! master a Sentinel group names; retries within a bounded budget, rebuilds
//! a connection that stopped answering, and waits for replicas.
//!
//! * **Retries.** A command that meets a failover (`MOVED`/`ASK`,
//!   `CLUSTERDOWN`, `TRYAGAIN`, `READONLY`, `LOADING`, `MASTERDOWN`, a
//!   dropped or refused connection, a timeout) is tried again with a
//!   jittered, doubling backoff (25 ms … 500 ms) until [`RETRY_BUDGET`] has
//!   passed; then it is [`Error::Unavailable`]. Every step of every strategy
//!   is idempotent for the same token, so a retry of a step that did run
//!   finds the caller's own claim.
//! * **Rebuilds.** The redis crate's cluster connection can stay stuck in a
//!   slot refresh after a master was paused and came back (its refresh waits
//!   on connections that never answer, and every request queues behind it:
//!   the sidecars of issue 23 said "beginning slot refresh" for 12 minutes).
//!   So every attempt has its own timeout, and a timeout, a connection error,
//!   `READONLY` or a redirect that reached us replaces the cluster
//!   connection with a new one built from the seed nodes (at most one
//!   rebuild at a time, each bounded by [`REBUILD_TIMEOUT`]). Behind
//!   Sentinel, the same errors ask the Sentinels for the master again. A
//!   sidecar therefore answers again at most [`RETRY_BUDGET`] +
//!   [`REBUILD_TIMEOUT`] after the store is healthy.
//! * **Replica acknowledgement.** With `min_replicas = N > 0`, a deciding
//!   step is sent as one pipeline on one connection to the node that owns
//!   the job: the step, a `SET` of a marker key of the job, then
//!   `WAIT N replica_timeout_ms`. The answer stands only if `WAIT` counted N
//!   replicas; else [`Error::Unavailable`]. The marker is written after the
//!   step, so a resend that only *reads* its own earlier claim also waits
//!   until that claim (which precedes the marker in the replication stream)
//!   is on N replicas.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ::redis::aio::MultiplexedConnection;
use ::redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use ::redis::cluster::ClusterClient;
use ::redis::cluster_async::ClusterConnection;
use ::redis::{
    AsyncConnectionConfig, Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, RedisResult,
    ServerErrorKind, Value,
};

use super::{convert, RedisConfig, ScriptCall};
use crate::error::{Error, Result};

/// How long a command may keep retrying through a failover before it is
/// answered `UNAVAILABLE`.
pub(crate) const RETRY_BUDGET: Duration = Duration::from_secs(4);
/// How long one rebuild of a connection (cluster slots, or the Sentinels'
/// master) may take.
pub(crate) const REBUILD_TIMEOUT: Duration = Duration::from_secs(3);
const CONNECT_TIMEOUT: Duration = Duration::from_millis(1000);
/// How long one command may take, beyond a `WAIT` for replicas.
const RESPONSE_TIMEOUT: Duration = Duration::from_millis(1500);
/// The shortest attempt, even when the budget is nearly spent.
const MIN_ATTEMPT: Duration = Duration::from_millis(250);
const MIN_BACKOFF: Duration = Duration::from_millis(25);
const MAX_BACKOFF: Duration = Duration::from_millis(500);

/// A multiplexed, self-repairing connection. Cloning is cheap; every clone
/// shares the same sockets, so concurrent requests are pipelined.
#[derive(Clone)]
pub(crate) struct Conn {
    inner: Arc<Inner>,
}

struct Inner {
    link: Link,
    /// Replicas that must acknowledge a deciding step (0: no `WAIT`).
    min_replicas: u32,
    replica_timeout_ms: u64,
    /// The timeout of one attempt.
    attempt_timeout: Duration,
}

enum Link {
    Single(ConnectionManager),
    Cluster {
        client: Box<ClusterClient>,
        swap: Swap<ClusterConnection>,
    },
    Sentinel {
        target: SentinelTarget,
        swap: Swap<MultiplexedConnection>,
    },
}

/// The current connection and its generation; a rebuild replaces both.
struct Swap<C> {
    current: std::sync::Mutex<(u64, Option<C>)>,
    rebuilding: tokio::sync::Mutex<()>,
}

impl<C: Clone> Swap<C> {
    fn new(c: Option<C>) -> Swap<C> {
        Swap {
            current: std::sync::Mutex::new((0, c)),
            rebuilding: tokio::sync::Mutex::new(()),
        }
    }

    fn get(&self) -> (u64, Option<C>) {
        let g = self.current.lock().unwrap_or_else(|p| p.into_inner());
        (g.0, g.1.clone())
    }

    /// Replaces the connection of generation `seen` with one `build` makes,
    /// unless another task already did.
    async fn rebuild<F, Fut>(&self, seen: u64, what: &str, build: F)
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = RedisResult<C>>,
    {
        let _one = self.rebuilding.lock().await;
        if self.get().0 != seen {
            return;
        }
        let started = Instant::now();
        match tokio::time::timeout(REBUILD_TIMEOUT, build()).await {
            Ok(Ok(c)) => {
                let mut g = self.current.lock().unwrap_or_else(|p| p.into_inner());
                *g = (g.0 + 1, Some(c));
                tracing::info!(
                    generation = g.0,
                    took_ms = started.elapsed().as_millis() as u64,
                    "redis {what} connection rebuilt"
                );
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "redis {what} connection rebuild failed; retrying with backoff");
            }
            Err(_) => {
                tracing::warn!(
                    timeout_ms = REBUILD_TIMEOUT.as_millis() as u64,
                    "redis {what} connection rebuild timed out; retrying with backoff"
                );
            }
        }
    }
}

/// `redis+sentinel://`: where to ask, and for which master.
#[derive(Clone)]
pub(crate) struct SentinelTarget {
    /// `redis://[user:pass@]host:port` of each Sentinel.
    pub sentinels: Vec<String>,
    pub master: String,
    /// `user:pass@` for the master (empty without credentials).
    pub userinfo: String,
}

/// One concrete connection.
#[derive(Clone)]
enum Any {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
    Plain(MultiplexedConnection),
}

impl ConnectionLike for Any {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Any::Single(c) => c.req_packed_command(cmd),
            Any::Cluster(c) => c.req_packed_command(cmd),
            Any::Plain(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Any::Single(c) => c.req_packed_commands(cmd, offset, count),
            Any::Cluster(c) => c.req_packed_commands(cmd, offset, count),
            Any::Plain(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Any::Single(c) => c.get_db(),
            Any::Cluster(c) => c.get_db(),
            Any::Plain(c) => c.get_db(),
        }
    }
}

/// Whether an error is a passing state of a failover: retried, then
/// `UNAVAILABLE`. Every suspect connection is one; a loading, busy or
/// reconfiguring cluster is one too.
pub(crate) fn transient(e: &RedisError) -> bool {
    suspect(e)
        || matches!(
            e.kind(),
            ErrorKind::Server(
                ServerErrorKind::BusyLoading
                    | ServerErrorKind::TryAgain
                    | ServerErrorKind::ClusterDown
            )
        )
}

/// Whether the connection itself is suspect: rebuild it (cluster, Sentinel).
fn suspect(e: &RedisError) -> bool {
    e.is_io_error()
        || e.is_connection_refusal()
        || e.is_connection_dropped()
        || e.is_timeout()
        || matches!(
            e.kind(),
            ErrorKind::Io
                | ErrorKind::ClusterConnectionNotFound
                | ErrorKind::Server(
                    ServerErrorKind::MasterDown
                        | ServerErrorKind::ReadOnly
                        | ServerErrorKind::Moved
                        | ServerErrorKind::Ask
                )
        )
}

/// A server error inside a reply that is a passing state of a failover.
trait Reply {
    fn transient_error(&self) -> Option<RedisError>;
}

fn value_error(v: &Value) -> Option<RedisError> {
    match v {
        Value::ServerError(_) => v.clone().extract_error().err().filter(transient),
        _ => None,
    }
}

impl Reply for Value {
    fn transient_error(&self) -> Option<RedisError> {
        value_error(self)
    }
}

impl Reply for Vec<Value> {
    fn transient_error(&self) -> Option<RedisError> {
        self.iter().find_map(value_error)
    }
}

fn timed_out() -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "no answer in time (a paused or unreachable node)",
    ))
}

impl Conn {
    pub(crate) async fn connect(cfg: &RedisConfig) -> Result<Conn> {
        let replica_timeout = Duration::from_millis(cfg.replica_timeout_ms);
        let response_timeout = RESPONSE_TIMEOUT + replica_timeout;
        let link = if let Some(master) = &cfg.sentinel {
            let target = SentinelTarget {
                sentinels: cfg.nodes.clone(),
                master: master.clone(),
                userinfo: cfg.master_userinfo.clone(),
            };
            let conn = sentinel_master(&target, response_timeout)
                .await
                .map_err(convert)?;
            Link::Sentinel {
                target,
                swap: Swap::new(Some(conn)),
            }
        } else if cfg.cluster {
            let client = ClusterClient::builder(cfg.nodes.clone())
                .connection_timeout(CONNECT_TIMEOUT)
                .response_timeout(response_timeout)
                .retries(2)
                .min_retry_wait(25)
                .max_retry_wait(250)
                .build()
                .map_err(convert)?;
            let conn = tokio::time::timeout(REBUILD_TIMEOUT, client.get_async_connection())
                .await
                .map_err(|_| convert(timed_out()))?
                .map_err(convert)?;
            Link::Cluster {
                client: Box::new(client),
                swap: Swap::new(Some(conn)),
            }
        } else {
            let url = cfg.nodes.first().map(String::as_str).unwrap_or_default();
            let client = ::redis::Client::open(url).map_err(convert)?;
            let config = ConnectionManagerConfig::new()
                .set_connection_timeout(Some(CONNECT_TIMEOUT))
                .set_response_timeout(Some(response_timeout))
                .set_number_of_retries(2)
                .set_min_delay(Duration::from_millis(50))
                .set_max_delay(Duration::from_millis(500));
            let conn = ConnectionManager::new_with_config(client, config)
                .await
                .map_err(convert)?;
            Link::Single(conn)
        };
        let conn = Conn {
            inner: Arc::new(Inner {
                link,
                min_replicas: 0,
                replica_timeout_ms: cfg.replica_timeout_ms,
                attempt_timeout: response_timeout + Duration::from_millis(500),
            }),
        };
        let min_replicas = match cfg.min_replicas {
            Some(n) => n,
            None if cfg.cluster || cfg.sentinel.is_some() => {
                let replicas = conn.fewest_replicas().await?;
                if replicas == 0 {
                    tracing::warn!(
                        "redis: a master has no replica, so min_replicas defaults to 0: a failover or a restart without persistence can lose acknowledged claims"
                    );
                    0
                } else {
                    1
                }
            }
            None => 0,
        };
        tracing::info!(
            min_replicas,
            replica_timeout_ms = cfg.replica_timeout_ms,
            "redis replica acknowledgement"
        );
        let inner = Arc::try_unwrap(conn.inner).map_err(|_| {
            Error::Store("redis: the connection was shared before it was set up".into())
        })?;
        Ok(Conn {
            inner: Arc::new(Inner {
                min_replicas,
                ..inner
            }),
        })
    }

    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self.inner.link, Link::Cluster { .. })
    }

    /// The smallest number of connected replicas of a master this
    /// connection writes to (`INFO replication`, every master on a cluster).
    async fn fewest_replicas(&self) -> Result<u32> {
        let v: Value = self.query(::redis::cmd("INFO").arg("replication")).await?;
        let mut infos = Vec::new();
        super::collect_strings(&v, &mut infos);
        Ok(infos
            .iter()
            .filter_map(|i| {
                i.lines()
                    .find_map(|l| l.trim().strip_prefix("connected_slaves:"))
                    .and_then(|n| n.trim().parse::<u32>().ok())
            })
            .min()
            .unwrap_or(0))
    }

    /// The connection to use now, with its generation.
    fn current(&self) -> (u64, Option<Any>) {
        match &self.inner.link {
            Link::Single(c) => (0, Some(Any::Single(c.clone()))),
            Link::Cluster { swap, .. } => {
                let (g, c) = swap.get();
                (g, c.map(Any::Cluster))
            }
            Link::Sentinel { swap, .. } => {
                let (g, c) = swap.get();
                (g, c.map(Any::Plain))
            }
        }
    }

    async fn rebuild(&self, seen: u64) {
        match &self.inner.link {
            Link::Single(_) => {}
            Link::Cluster { client, swap } => {
                swap.rebuild(seen, "cluster", || client.get_async_connection())
                    .await
            }
            Link::Sentinel { target, swap } => {
                let timeout = self.inner.attempt_timeout;
                swap.rebuild(seen, "sentinel", || sentinel_master(target, timeout))
                    .await
            }
        }
    }

    /// Runs `op` on the current connection; on a transient failure, repairs
    /// the connection when it is suspect and tries again with backoff, until
    /// [`RETRY_BUDGET`] has passed.
    async fn retrying<T, F, Fut>(&self, mut op: F) -> RedisResult<T>
    where
        T: Reply,
        F: FnMut(Any) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        let deadline = Instant::now() + RETRY_BUDGET;
        let mut backoff = MIN_BACKOFF;
        loop {
            let (generation, conn) = self.current();
            // An attempt never runs far past the budget (a paused node
            // accepts connections and never answers).
            let left = deadline
                .saturating_duration_since(Instant::now())
                .max(MIN_ATTEMPT);
            let (err, last) = match conn {
                None => (timed_out(), None),
                Some(c) => {
                    match tokio::time::timeout(self.inner.attempt_timeout.min(left), op(c)).await {
                        Ok(Ok(v)) => match v.transient_error() {
                            None => return Ok(v),
                            Some(e) => (e, Some(Ok(v))),
                        },
                        Ok(Err(e)) if transient(&e) => (e, None),
                        Ok(Err(e)) => return Err(e),
                        Err(_) => (timed_out(), None),
                    }
                }
            };
            if suspect(&err) {
                self.rebuild(generation).await;
            }
            let now = Instant::now();
            if now + backoff >= deadline {
                tracing::debug!(error = %err, "redis: retry budget spent");
                return last.unwrap_or(Err(err));
            }
            tracing::debug!(error = %err, backoff_ms = backoff.as_millis() as u64, "redis: retrying");
            tokio::time::sleep(jitter(backoff)).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// Runs a script by `EVALSHA` (the call reloads it on `NOSCRIPT`:
    /// [`ScriptCall::invoke_async`]).
    pub(crate) async fn invoke(&self, call: &ScriptCall<'_>) -> Result<Value> {
        call.invoke_async(&mut self.clone()).await.map_err(convert)
    }

    /// [`invoke`](Self::invoke) for a deciding step: with `min_replicas > 0`
    /// the step is followed on the same connection by a write of `marker`
    /// (a key in the job's hash slot) and `WAIT`, and the answer stands only
    /// when enough replicas acknowledged. The marker is built only then: with
    /// `min_replicas = 0` (the common case) a claim does not pay for it.
    pub(crate) async fn invoke_acked(
        &self,
        call: &ScriptCall<'_>,
        marker: impl FnOnce() -> String,
    ) -> Result<Value> {
        if self.inner.min_replicas == 0 {
            return self.invoke(call).await;
        }
        // The script's load is sent without `WAIT`; the shortfall is the
        // last step's.
        let mut acked = self.acked_owned(marker());
        let v = call.invoke_async(&mut acked).await.map_err(convert)?;
        acked.shortfall()?;
        Ok(v)
    }

    /// Runs one command.
    pub(crate) async fn query<T: ::redis::FromRedisValue>(&self, cmd: &Cmd) -> Result<T> {
        let mut c = self.clone();
        cmd.query_async(&mut c).await.map_err(convert)
    }

    /// [`query`](Self::query) followed by the replica acknowledgement of
    /// [`invoke_acked`](Self::invoke_acked).
    pub(crate) async fn query_acked<T: ::redis::FromRedisValue>(
        &self,
        cmd: &Cmd,
        marker: &str,
    ) -> Result<T> {
        let mut acked = self.acked(marker);
        let v = cmd.query_async(&mut acked).await.map_err(convert)?;
        acked.shortfall()?;
        Ok(v)
    }

    /// A connection that sends every command as `[command, SET marker, WAIT]`.
    pub(crate) fn acked(&self, marker: &str) -> Acked {
        self.acked_owned(marker.to_owned())
    }

    fn acked_owned(&self, marker: String) -> Acked {
        Acked {
            conn: self.clone(),
            marker,
            short: None,
        }
    }

    /// `INFO server` of every node this connection reaches (one per master
    /// on a cluster).
    pub(crate) async fn server_infos(&self) -> Result<Vec<String>> {
        let v: Value = self.query(::redis::cmd("INFO").arg("server")).await?;
        let mut out = Vec::new();
        super::collect_strings(&v, &mut out);
        Ok(out)
    }
}

fn jitter(d: Duration) -> Duration {
    // ±25 %, from the clock's low bits (no RNG needed for a backoff).
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|t| t.subsec_nanos())
        .unwrap_or(0);
    let pct = 75 + u64::from(nanos % 51);
    Duration::from_millis((d.as_millis() as u64).saturating_mul(pct) / 100)
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        let this = self.clone();
        Box::pin(async move {
            this.retrying(|mut c| async move { c.req_packed_command(cmd).await })
                .await
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        let this = self.clone();
        Box::pin(async move {
            this.retrying(|mut c| async move { c.req_packed_commands(cmd, offset, count).await })
                .await
        })
    }

    fn get_db(&self) -> i64 {
        match self.current().1 {
            Some(c) => c.get_db(),
            None => 0,
        }
    }
}

/// See [`Conn::acked`].
pub(crate) struct Acked {
    conn: Conn,
    marker: String,
    /// Replicas that acknowledged, when fewer than required.
    short: Option<i64>,
}

impl Acked {
    /// `UNAVAILABLE` when the last step was acknowledged by too few replicas.
    pub(crate) fn shortfall(&self) -> Result<()> {
        match self.short {
            None => Ok(()),
            Some(got) => Err(Error::Unavailable(format!(
                "redis: only {got} of {} replicas acknowledged within {} ms (min_replicas); the step may or may not survive a failover: resend with the same token",
                self.conn.inner.min_replicas, self.conn.inner.replica_timeout_ms
            ))),
        }
    }
}

impl ConnectionLike for Acked {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let n = self.conn.inner.min_replicas;
            let is_script_load = cmd.args_iter().next().is_some_and(
                |a| matches!(a, ::redis::Arg::Simple(b) if b.eq_ignore_ascii_case(b"SCRIPT")),
            );
            if n == 0 || is_script_load {
                return self.conn.req_packed_command(cmd).await;
            }
            let mut pipe = ::redis::pipe();
            pipe.add_command(cmd.clone())
                .cmd("SET")
                .arg(&self.marker)
                .arg(1)
                .arg("PX")
                .arg(60_000)
                .cmd("WAIT")
                .arg(n)
                .arg(self.conn.inner.replica_timeout_ms);
            let mut vals = self.conn.req_packed_commands(&pipe, 0, 3).await?;
            if vals.len() != 3 {
                return Err(RedisError::from((
                    ErrorKind::Client,
                    "redis: a step with WAIT did not get three replies",
                )));
            }
            let waited = vals.pop();
            vals.pop();
            let step = vals.pop().unwrap_or(Value::Nil);
            if !matches!(step, Value::ServerError(_)) {
                match waited {
                    Some(Value::Int(got)) if got >= i64::from(n) => self.short = None,
                    Some(Value::Int(got)) => self.short = Some(got),
                    _ => self.short = Some(0),
                }
            }
            Ok(step)
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        self.conn.req_packed_commands(cmd, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.conn.get_db()
    }
}

/// Asks each Sentinel in turn for the master's address, connects to it and
/// checks that it is a master (a Sentinel may still name a demoted one for a
/// moment after a failover).
async fn sentinel_master(
    t: &SentinelTarget,
    response_timeout: Duration,
) -> RedisResult<MultiplexedConnection> {
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(CONNECT_TIMEOUT))
        .set_response_timeout(Some(response_timeout));
    let mut last: RedisError =
        RedisError::from((ErrorKind::Io, "redis+sentinel: no sentinel answered"));
    for s in &t.sentinels {
        let asked = async {
            let client = ::redis::Client::open(s.as_str())?;
            let mut sc = client
                .get_multiplexed_async_connection_with_config(&config)
                .await?;
            let addr: Option<(String, u16)> = ::redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(&t.master)
                .query_async(&mut sc)
                .await?;
            let Some((host, port)) = addr else {
                return Err(RedisError::from((
                    ErrorKind::Client,
                    "redis+sentinel: the sentinel does not know the master name",
                )));
            };
            let url = format!("redis://{}{host}:{port}/0", t.userinfo);
            let client = ::redis::Client::open(url.as_str())?;
            let mut mc = client
                .get_multiplexed_async_connection_with_config(&config)
                .await?;
            let role: Vec<Value> = ::redis::cmd("ROLE").query_async(&mut mc).await?;
            match role.first() {
                Some(Value::BulkString(b)) if b == b"master" => Ok(mc),
                Some(Value::SimpleString(s)) if s == "master" => Ok(mc),
                _ => Err(RedisError::from((
                    ErrorKind::Server(ServerErrorKind::ReadOnly),
                    "redis+sentinel: the named master is not a master (yet)",
                ))),
            }
        };
        match asked.await {
            Ok(c) => return Ok(c),
            Err(e) => last = e,
        }
    }
    Err(last)
}
