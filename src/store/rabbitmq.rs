//! The RabbitMQ store (lapin): a once backend.
//!
//! Why the step is atomic: every (job, slot) has its own gate queue,
//! `<prefix>.<job>.slot.<slot_ms>`, a durable **classic** queue declared with
//! `x-max-length=1` and `x-overflow=reject-publish`. A claim declares the gate
//! (idempotent: same name, same arguments) and publishes one persistent
//! message to it through the default exchange, with `mandatory` and publisher
//! confirms. The queue process takes publishes one at a time: the first
//! message fills it and is confirmed with `ack`; every later one finds it
//! full and is refused with `nack`. Nobody ever consumes a gate, so it stays
//! full. The decision is the queue's, in one step.
//!
//! * `ack` → `WON`; `nack` → `LOST`.
//! * `basic.return` (the gate vanished between declare and publish), a lost
//!   connection or no confirm within `timeout_ms` after the publish was sent
//!   → `LOST` with reason `unknown`: the claim may or may not be stored, so it
//!   is never reported as won. A failure *before* the publish (broker down,
//!   declare refused) is an error: nothing was claimed.
//! * Quorum queues are not used: they can overshoot a length limit of 1.
//! * The gate is declared with `x-expires=slot_ttl_ms`: it (and the claim in
//!   it) is deleted `slot_ttl_ms` after the last claim attempt declared it.
//!   That is how long a claim is remembered; `slot_ttl_ms` must exceed
//!   `max_late_ms` (config validation, and per claim here).
//! * Durable queue + persistent message: the confirm comes after the claim is
//!   on disk, and gates survive a broker restart.
//! * Resends: a queue cannot compare tokens, so a resend of a won claim
//!   answers `LOST` (the gate is full). Clients of this backend must not rely
//!   on resends.
//! * Lateness is judged on this host's wall clock; `LATE` writes nothing.
//! * There is nothing to record at release and no history.
//!
//! Connections: one AMQP connection, re-opened lazily when it is lost, and a
//! pool of confirm-mode channels. A channel that saw any error or timeout is
//! dropped (closed), never reused. Channels are also retired after
//! [`CHANNEL_USES`] claims, because lapin keeps every queue a channel declared
//! in that channel's topology registry.

use std::str::FromStr;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, QueueDeclareOptions};
use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use lapin::publisher_confirm::Confirmation;
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ErrorKind};
use tokio::sync::{Mutex, Semaphore};

use super::backend_url::redact;
use super::broker;
use super::{Backend, Store, StoreInfo};
use crate::claim::*;
use crate::error::{Error, Result};

const BACKEND: &str = "rabbitmq";
/// Claims per channel before it is closed and replaced (see module docs).
pub const CHANNEL_USES: u32 = 1_000;
/// Idle channels kept open.
const MAX_IDLE: usize = 64;
/// Claims in flight at once (each holds a channel); more wait their turn
/// instead of opening channels without bound.
const MAX_IN_FLIGHT: usize = 256;
/// After a failed connect, claims fail at once for this long instead of
/// queueing behind another connect attempt.
const RECONNECT_PAUSE: Duration = Duration::from_millis(250);

/// Parses `amqp[s]://…?prefix=&slot_ttl_ms=&timeout_ms=`.
pub fn parse_url(url: &str) -> Result<Backend> {
    let s = broker::split(
        url,
        &["prefix", "slot_ttl_ms", "timeout_ms"],
        &[
            "heartbeat",
            "connection_timeout",
            "channel_max",
            "frame_max",
            "auth_mechanism",
        ],
    )?;
    lapin::uri::AMQPUri::from_str(&s.client_url()).map_err(|e| {
        Error::invalid(
            "backend",
            format!("{} is not an AMQP URL: {e}", redact(url)),
        )
    })?;
    let prefix = broker::name_prefix(&s)?;
    if prefix == "amq" {
        return Err(Error::invalid(
            "backend",
            "prefix amq is reserved by RabbitMQ (queue names starting with amq.)",
        ));
    }
    Ok(Backend::Amqp {
        url: s.client_url(),
        prefix,
        slot_ttl_ms: s.millis(
            "slot_ttl_ms",
            broker::DEFAULT_MEMORY_MS,
            1_000,
            broker::MAX_MEMORY_MS,
        )?,
        timeout_ms: s.millis("timeout_ms", broker::DEFAULT_TIMEOUT_MS, 100, 600_000)?,
    })
}

/// A confirm-mode channel and how many claims it served.
struct Pooled {
    ch: Channel,
    uses: u32,
}

pub struct RabbitStore {
    url: String,
    prefix: String,
    slot_ttl_ms: i64,
    timeout: Duration,
    gate_args: FieldTable,
    conn: Mutex<Option<Arc<Connection>>>,
    last_connect_failure: StdMutex<Option<Instant>>,
    idle: StdMutex<Vec<Pooled>>,
    in_flight: Semaphore,
    info: StoreInfo,
}

/// The arguments of every gate queue. Declaring an existing queue with other
/// arguments fails (406), so every sidecar on a broker must agree on them.
pub fn gate_arguments(slot_ttl_ms: u64) -> FieldTable {
    let mut args = FieldTable::default();
    args.insert(
        "x-queue-type".into(),
        AMQPValue::LongString("classic".into()),
    );
    args.insert("x-max-length".into(), AMQPValue::LongLongInt(1));
    args.insert(
        "x-overflow".into(),
        AMQPValue::LongString("reject-publish".into()),
    );
    args.insert(
        "x-expires".into(),
        AMQPValue::LongLongInt(slot_ttl_ms as i64),
    );
    args
}

/// `durable`: the gate and its claim survive a broker restart.
pub fn gate_options() -> QueueDeclareOptions {
    QueueDeclareOptions {
        passive: false,
        durable: true,
        exclusive: false,
        auto_delete: false,
        nowait: false,
    }
}

/// The gate queue of (job, slot).
pub fn gate_name(prefix: &str, job: &Job, slot_ms: SlotMs) -> String {
    format!("{prefix}.{job}.slot.{slot_ms}")
}

fn lock<T>(m: &StdMutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Declares of a gate that RabbitMQ answers `NOT_FOUND` (see
/// [`RabbitStore::declared`]), at most.
const DECLARE_TRIES: u64 = 4;

/// A `NOT_FOUND` channel error.
fn is_not_found(e: &lapin::Error) -> bool {
    matches!(e.kind(), ErrorKind::ProtocolError(amqp)
        if matches!(amqp.kind(), AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND)))
}

/// A refused declare: nothing was published.
fn declare_error(queue: &str, e: lapin::Error) -> Error {
    if let ErrorKind::ProtocolError(amqp) = e.kind() {
        return match amqp.kind() {
            AMQPErrorKind::Soft(AMQPSoftError::PRECONDITIONFAILED) => Error::Store(format!(
                "gate queue {queue} exists with other arguments ({}); every sidecar on this \
                 broker and prefix must use the same slot_ttl_ms, and gates must be classic queues",
                amqp.get_message()
            )),
            // A durable queue whose home node is down (cluster).
            AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND) => Error::Unavailable(format!(
                "gate queue {queue} is not available: {}",
                amqp.get_message()
            )),
            // A connection-level error (CONNECTION_FORCED at a broker
            // shutdown, …): the connection is gone, the broker may be back.
            AMQPErrorKind::Hard(_) => {
                Error::Unavailable(format!("rabbitmq: declaring gate queue {queue}: {e}"))
            }
            _ => Error::Store(format!("declaring gate queue {queue}: {e}")),
        };
    }
    Error::Unavailable(format!("rabbitmq: declaring gate queue {queue}: {e}"))
}

impl RabbitStore {
    pub async fn open(backend: &Backend) -> Result<RabbitStore> {
        let Backend::Amqp {
            url,
            prefix,
            slot_ttl_ms,
            timeout_ms,
        } = backend
        else {
            return Err(Error::invalid("backend", "not an amqp:// backend"));
        };
        let store = RabbitStore {
            url: url.clone(),
            prefix: prefix.clone(),
            slot_ttl_ms: *slot_ttl_ms as i64,
            timeout: Duration::from_millis(*timeout_ms),
            gate_args: gate_arguments(*slot_ttl_ms),
            conn: Mutex::new(None),
            last_connect_failure: StdMutex::new(None),
            idle: StdMutex::new(Vec::new()),
            in_flight: Semaphore::new(MAX_IN_FLIGHT),
            info: StoreInfo {
                backend: BACKEND,
                leases: false,
                full_history: false,
                retention: format!(
                    "a claimed slot is remembered for slot_ttl_ms ({}) after the last claim of it \
                     (its gate queue expires); no run history is kept",
                    crate::duration::human(Duration::from_millis(*slot_ttl_ms))
                ),
                identity: super::address_identity("amqp", &[url], prefix),
            },
        };
        // Fail at start when the broker cannot be reached or refuses us.
        let ch = store.channel().await?;
        store.put_back(ch);
        Ok(store)
    }

    /// The gate queue of (job, slot).
    pub fn gate(&self, job: &Job, slot_ms: SlotMs) -> String {
        gate_name(&self.prefix, job, slot_ms)
    }

    /// The live connection, connecting when there is none.
    async fn connection(&self) -> Result<Arc<Connection>> {
        let mut guard = self.conn.lock().await;
        if let Some(c) = guard.as_ref() {
            if c.status().connected() {
                return Ok(c.clone());
            }
        }
        *guard = None;
        if let Some(at) = *lock(&self.last_connect_failure) {
            if at.elapsed() < RECONNECT_PAUSE {
                return Err(Error::Unavailable(
                    "rabbitmq: not connected (the last connect attempt just failed)".into(),
                ));
            }
        }
        let props = ConnectionProperties::default().with_connection_name("anarchon".into());
        let res = tokio::time::timeout(self.timeout, Connection::connect(&self.url, props)).await;
        let conn = match res {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => {
                *lock(&self.last_connect_failure) = Some(Instant::now());
                return Err(Error::Unavailable(format!(
                    "rabbitmq: cannot connect to {}: {e}",
                    redact(&self.url)
                )));
            }
            Err(_) => {
                *lock(&self.last_connect_failure) = Some(Instant::now());
                return Err(Error::Unavailable(format!(
                    "rabbitmq: no connection to {} within {:?}",
                    redact(&self.url),
                    self.timeout
                )));
            }
        };
        *lock(&self.last_connect_failure) = None;
        tracing::info!(url = %redact(&self.url), "connected to rabbitmq");
        let conn = Arc::new(conn);
        *guard = Some(conn.clone());
        Ok(conn)
    }

    /// Forgets `conn` if it is still the current connection (it timed out),
    /// and closes it in the background.
    async fn forget(&self, conn: &Arc<Connection>) {
        let mut guard = self.conn.lock().await;
        if guard.as_ref().is_some_and(|c| Arc::ptr_eq(c, conn)) {
            *guard = None;
            let (conn, timeout) = (conn.clone(), self.timeout);
            tokio::spawn(async move {
                let _ =
                    tokio::time::timeout(timeout, conn.close(320, "anarchon: reconnecting")).await;
            });
        }
    }

    /// An idle channel, or a new confirm-mode channel.
    async fn channel(&self) -> Result<Pooled> {
        loop {
            let popped = lock(&self.idle).pop();
            match popped {
                Some(p) if p.ch.status().connected() => return Ok(p),
                Some(_) => continue,
                None => break,
            }
        }
        let conn = self.connection().await?;
        let ch = match tokio::time::timeout(self.timeout, conn.create_channel()).await {
            Ok(Ok(ch)) => ch,
            Ok(Err(e)) => {
                if !conn.status().connected() {
                    self.forget(&conn).await;
                }
                return Err(Error::Unavailable(format!(
                    "rabbitmq: cannot open a channel: {e}"
                )));
            }
            Err(_) => {
                self.forget(&conn).await;
                return Err(Error::Unavailable(
                    "rabbitmq: no channel within the timeout".into(),
                ));
            }
        };
        match tokio::time::timeout(
            self.timeout,
            ch.confirm_select(ConfirmSelectOptions::default()),
        )
        .await
        {
            Ok(Ok(())) => Ok(Pooled { ch, uses: 0 }),
            Ok(Err(e)) => Err(Error::Unavailable(format!(
                "rabbitmq: cannot enable publisher confirms: {e}"
            ))),
            Err(_) => {
                self.forget(&conn).await;
                Err(Error::Unavailable(
                    "rabbitmq: no answer to confirm.select within the timeout".into(),
                ))
            }
        }
    }

    /// A channel on which the gate `queue` is declared.
    ///
    /// A declare that races another declare of the same new gate (sidecars
    /// claiming one slot at once) can find the queue's record before its
    /// process is up: RabbitMQ answers `NOT_FOUND` ("home node … of durable
    /// queue … is down or inaccessible") and closes the channel. Nothing was
    /// published, so the declare is sent again on a new channel, up to
    /// [`DECLARE_TRIES`] times with a pause of 10, 20, 30 ms. A gate whose
    /// node really is down (a cluster) keeps answering so, and the claim is
    /// `UNAVAILABLE` as before.
    async fn declared(&self, queue: &str) -> Result<Pooled> {
        let mut tries = 1;
        loop {
            let p = self.channel().await?;
            let declared = tokio::time::timeout(
                self.timeout,
                p.ch.queue_declare(queue, gate_options(), self.gate_args.clone()),
            )
            .await;
            match declared {
                Ok(Ok(_)) => return Ok(p),
                Ok(Err(e)) if tries < DECLARE_TRIES && is_not_found(&e) => {
                    tracing::debug!(queue, error = %e, "gate not up yet; declaring it again");
                    tokio::time::sleep(Duration::from_millis(10 * tries)).await;
                    tries += 1;
                }
                Ok(Err(e)) => return Err(declare_error(queue, e)),
                Err(_) => {
                    return Err(Error::Unavailable(format!(
                        "rabbitmq: declaring {queue} got no answer within {:?}",
                        self.timeout
                    )))
                }
            }
        }
    }

    /// Returns a channel that answered cleanly to the pool.
    fn put_back(&self, mut p: Pooled) {
        p.uses += 1;
        if p.uses >= CHANNEL_USES || !p.ch.status().connected() {
            return; // dropped: lapin closes it
        }
        let mut idle = lock(&self.idle);
        if idle.len() < MAX_IDLE {
            idle.push(p);
        }
    }
}

#[async_trait]
impl Store for RabbitStore {
    fn info(&self) -> &StoreInfo {
        &self.info
    }

    async fn claim(&self, spec: &ClaimSpec, _dead: &DeadHolders) -> Result<ClaimAnswer> {
        let now = host_now_ms();
        if let Some(late) =
            broker::check_within_memory(BACKEND, "slot_ttl_ms", self.slot_ttl_ms, spec, now)?
        {
            return Ok(late);
        }
        let queue = self.gate(&spec.job, spec.slot_ms);
        let _turn = self
            .in_flight
            .acquire()
            .await
            .map_err(|_| Error::Unavailable("rabbitmq: the store is closing".into()))?;
        // 1. Declare the gate. Any failure here: nothing was published.
        let p = self.declared(&queue).await?;
        if !p.ch.status().connected() {
            return Err(Error::Unavailable(
                "rabbitmq: the channel closed before the claim was published".into(),
            ));
        }

        // 2. Publish the claim. From here on a failure means "maybe stored".
        let body = serde_json::json!({
            "token": spec.token.as_str(),
            "node": spec.holder.node,
            "instance": spec.holder.instance,
            "slot_ms": spec.slot_ms,
            "claimed_at_ms": now,
        })
        .to_string();
        let props = BasicProperties::default()
            .with_delivery_mode(2)
            .with_content_type("application/json".into())
            .with_timestamp((now.max(0) / 1000) as u64);
        let publish = async {
            p.ch.basic_publish(
                "",
                &queue,
                BasicPublishOptions {
                    mandatory: true,
                    immediate: false,
                },
                body.as_bytes(),
                props,
            )
            .await?
            .await
        };
        let unknown = ClaimAnswer::bare(Outcome::Lost, now, Some("unknown"));
        let answer = match tokio::time::timeout(self.timeout, publish).await {
            Ok(Ok(Confirmation::Ack(None))) => ClaimAnswer {
                outcome: Outcome::Won,
                token: Some(spec.token.clone()),
                attempt: 1,
                // A gate is won once and never handed over: there is no
                // later attempt to fence off.
                fencing: 1,
                lease_until_ms: 0,
                now_ms: now,
                holder: Some(spec.holder.clone()),
                reason: None,
            },
            Ok(Ok(Confirmation::Nack(_))) => ClaimAnswer::bare(Outcome::Lost, now, None),
            Ok(Ok(Confirmation::Ack(Some(_)))) => {
                tracing::warn!(queue, "claim returned unroutable (the gate vanished)");
                unknown
            }
            Ok(Ok(Confirmation::NotRequested)) => {
                tracing::warn!(queue, "channel was not in confirm mode");
                return Ok(unknown);
            }
            Ok(Err(e)) => {
                tracing::warn!(queue, error = %e, "claim published but not confirmed");
                return Ok(unknown);
            }
            Err(_) => {
                tracing::warn!(
                    queue,
                    "claim published but not confirmed within the timeout"
                );
                return Ok(unknown);
            }
        };
        self.put_back(p);
        Ok(answer)
    }

    /// A gate records only that a slot was claimed: there is nothing to
    /// mark finished, and no token to compare. Always succeeds.
    async fn release(&self, _spec: &ReleaseSpec, _dead: &DeadHolders) -> Result<()> {
        Ok(())
    }

    async fn history(
        &self,
        _job: &Job,
        _limit: u32,
        _before_slot_ms: Option<i64>,
    ) -> Result<HistoryPage> {
        Ok(HistoryPage {
            runs: Vec::new(),
            complete: false,
            note: Some(format!(
                "the rabbitmq backend keeps no history: a gate queue only remembers that a slot \
                 was claimed, for slot_ttl_ms ({} ms), and releases record nothing",
                self.slot_ttl_ms
            )),
        })
    }

    async fn ping(&self) -> Result<()> {
        self.connection().await.map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let b = Backend::parse("amqp://guest:guest@127.0.0.1:5672/%2f?heartbeat=10").unwrap();
        assert_eq!(
            b,
            Backend::Amqp {
                url: "amqp://guest:guest@127.0.0.1:5672/%2f?heartbeat=10".into(),
                prefix: "anarchon".into(),
                slot_ttl_ms: broker::DEFAULT_MEMORY_MS,
                timeout_ms: broker::DEFAULT_TIMEOUT_MS,
            }
        );
        assert_eq!(b.name(), "rabbitmq");
        assert_eq!(
            b.memory_ms(),
            Some(("slot_ttl_ms", broker::DEFAULT_MEMORY_MS))
        );
        let b = Backend::parse("amqps://h/v?prefix=p1&slot_ttl_ms=90000&timeout_ms=700").unwrap();
        assert!(matches!(
            b,
            Backend::Amqp { ref prefix, slot_ttl_ms: 90_000, timeout_ms: 700, .. } if prefix == "p1"
        ));
        for bad in [
            "amqp://h?prefix=amq",
            "amqp://h?prefix=a.b",
            "amqp://h?slot_ttl_ms=0",
            "amqp://h?slot_ttl_ms=x",
            "amqp://h?slot_tll_ms=90000",
            "amqp://h:notaport/",
        ] {
            assert!(
                matches!(
                    Backend::parse(bad),
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
    fn gate_names_fit_amqp_limits() {
        let job = Job::parse(&"j".repeat(MAX_JOB_LEN)).unwrap();
        let name = gate_name(&"p".repeat(broker::MAX_PREFIX_LEN), &job, i64::MAX);
        assert!(name.len() <= 255, "{}", name.len());
        assert_eq!(
            gate_name("anarchon", &Job::parse("a.b").unwrap(), 5),
            "anarchon.a.b.slot.5"
        );
    }
}
