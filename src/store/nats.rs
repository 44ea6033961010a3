//! The NATS JetStream store (async-nats): a once backend.
//!
//! Why the step is atomic: a claim is published to `<prefix>.claims.<job>`
//! with the header `Nats-Msg-Id: <job>:<slot_ms>`. The stream stores a
//! message only if no message with the same id was stored within its
//! `duplicate_window`; the server checks and stores in one step, under the
//! stream's lock, and answers `duplicate: false` to the one publish it stored
//! and `duplicate: true` (with the *stored* message's sequence) to every
//! other. So:
//!
//! * `duplicate: false` → `WON`;
//! * `duplicate: true` → the stored claim is read back by that sequence and
//!   its token compared: ours (a resend) → `WON` again, same fencing;
//!   another → `LOST`.
//! * No ack within `timeout_ms`, a broken connection or no stream answering →
//!   `UNAVAILABLE`, never a guess: resending the same token later gets the
//!   true answer from the de-duplication.
//!
//! The stream `<PREFIX>` (the prefix in upper case) takes
//! `<prefix>.claims.>` and `<prefix>.results.>`. A job may contain dots, so
//! it is the *last* part of the subject, under `>`; a job whose dots would
//! make an empty subject token (`.a`, `a..b`, `a.`) is written as `~<hex>`.
//! The stream is created when missing, with file storage,
//! `duplicate_window = duplicate_window_ms` and a max age of twice that
//! (never shorter than the window: a claim must outlive its de-duplication,
//! and the server rebuilds de-duplication from stored messages after a
//! restart). An existing stream that would forget sooner is refused.
//!
//! What it remembers: a claim decides its slot for `duplicate_window_ms`
//! after it was stored; `duplicate_window_ms` must exceed `max_late_ms`.
//! Lateness is judged on this host's wall clock (the broker has no clock a
//! claim can read); `LATE` writes nothing. Fencing is the claim's stream
//! sequence: unique, and increasing in the order claims were stored.
//!
//! Release publishes the result to `<prefix>.results.<job>` (id
//! `<job>:<slot_ms>:result`, so a repeated release is stored once), after
//! checking the caller's token against the stored claim. History reads
//! claims and results of the job back with a bounded ephemeral consumer.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::time::Duration;

use async_nats::jetstream::{self, consumer, context::Publish, stream};
use async_trait::async_trait;
use futures::StreamExt;
use serde::{Deserialize, Serialize};

use super::backend_url::redact;
use super::broker;
use super::{Backend, Store, StoreInfo};
use crate::claim::*;
use crate::error::{Error, FenceReason, Result};

const BACKEND: &str = "nats";
/// The most messages one history read (or slow release lookup) scans.
pub const MAX_SCAN: usize = 20_000;

/// Parses `nats://[user:pass@]host:port[,host:port…]?prefix=&duplicate_window_ms=&timeout_ms=`.
pub fn parse_url(url: &str) -> Result<Backend> {
    let s = broker::split(url, &["prefix", "duplicate_window_ms", "timeout_ms"], &[])?;
    servers(&s.client_url())?;
    Ok(Backend::Nats {
        url: s.client_url(),
        prefix: broker::name_prefix(&s)?,
        duplicate_window_ms: s.millis(
            "duplicate_window_ms",
            broker::DEFAULT_MEMORY_MS,
            1_000,
            broker::MAX_MEMORY_MS,
        )?,
        timeout_ms: s.millis("timeout_ms", broker::DEFAULT_TIMEOUT_MS, 100, 600_000)?,
    })
}

/// The server addresses of a `nats://a:4222,b:4222` URL.
fn servers(url: &str) -> Result<Vec<async_nats::ServerAddr>> {
    let rest = url.strip_prefix("nats://").unwrap_or(url);
    rest.split(',')
        .filter(|s| !s.is_empty())
        .map(|s| {
            let s = if s.contains("://") {
                s.to_owned()
            } else {
                format!("nats://{s}")
            };
            s.parse::<async_nats::ServerAddr>().map_err(|e| {
                Error::invalid(
                    "backend",
                    format!("{} is not a NATS server address: {e}", redact(&s)),
                )
            })
        })
        .collect::<Result<Vec<_>>>()
        .and_then(|v| {
            if v.is_empty() {
                Err(Error::invalid("backend", "nats:// needs a server address"))
            } else {
                Ok(v)
            }
        })
}

/// The job as the last part of a subject. Dots stay subject token
/// separators; a job that would make an empty token is hex-encoded behind a
/// `~` (not a job character, so it cannot collide with a plain job).
pub fn job_subject(job: &Job) -> Cow<'_, str> {
    let s = job.as_str();
    if s.split('.').all(|t| !t.is_empty()) {
        Cow::Borrowed(s)
    } else {
        Cow::Owned(format!("~{}", hex::encode(s)))
    }
}

/// The JetStream stream of `prefix`.
pub fn stream_name(prefix: &str) -> String {
    prefix.to_ascii_uppercase()
}

/// What a claim message carries.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct ClaimBody {
    token: String,
    node: String,
    instance: u64,
    slot_ms: i64,
    claimed_at_ms: i64,
}

/// What a result message carries.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct ResultBody {
    token: String,
    node: String,
    instance: u64,
    slot_ms: i64,
    result: String,
    finished_at_ms: i64,
}

/// A stored claim and the stream sequence it got.
#[derive(Debug, Clone)]
struct Stored {
    seq: u64,
    body: ClaimBody,
}

impl Stored {
    fn holder(&self) -> Holder {
        Holder {
            node: self.body.node.clone(),
            instance: self.body.instance,
        }
    }
}

/// Claims and results of one job, by slot.
#[derive(Default)]
struct Scan {
    slots: BTreeMap<i64, (Option<Stored>, Option<ResultBody>)>,
    truncated: bool,
}

pub struct NatsStore {
    js: jetstream::Context,
    stream: stream::Stream,
    stream_name: String,
    prefix: String,
    window_ms: i64,
    /// The stream's max_age (0 = unlimited), for History's note.
    max_age: Duration,
    info: StoreInfo,
}

fn unavailable(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Unavailable(format!("nats: {what}: {e}"))
}

/// The stream configuration this store creates.
pub fn stream_config(prefix: &str, duplicate_window_ms: u64) -> stream::Config {
    let window = Duration::from_millis(duplicate_window_ms);
    stream::Config {
        name: stream_name(prefix),
        subjects: vec![format!("{prefix}.claims.>"), format!("{prefix}.results.>")],
        storage: stream::StorageType::File,
        retention: stream::RetentionPolicy::Limits,
        discard: stream::DiscardPolicy::Old,
        duplicate_window: window,
        max_age: window * 2,
        max_messages: -1,
        max_bytes: -1,
        max_messages_per_subject: -1,
        num_replicas: 1,
        description: Some("anarchon claims and results".into()),
        ..Default::default()
    }
}

/// Refuses an existing stream that would forget claims before
/// `duplicate_window_ms`, or would not hold them at all.
fn check_stream(cfg: &stream::Config, prefix: &str, duplicate_window_ms: u64) -> Result<()> {
    let window = Duration::from_millis(duplicate_window_ms);
    let name = &cfg.name;
    let fail = |m: String| {
        Err(Error::Store(format!(
            "JetStream stream {name} cannot hold anarchon claims: {m}"
        )))
    };
    let covers = |s: &str| {
        cfg.subjects
            .iter()
            .any(|x| x == s || x == &format!("{prefix}.>") || x == ">")
    };
    for s in [format!("{prefix}.claims.>"), format!("{prefix}.results.>")] {
        if !covers(&s) {
            return fail(format!(
                "its subjects {:?} do not include {s}",
                cfg.subjects
            ));
        }
    }
    if cfg.storage != stream::StorageType::File {
        return fail("it is not file-backed, so a restart forgets every claim".into());
    }
    if cfg.retention != stream::RetentionPolicy::Limits {
        return fail("its retention is not `limits`: claims would be removed early".into());
    }
    if cfg.duplicate_window < window {
        return fail(format!(
            "its duplicate_window {:?} is shorter than duplicate_window_ms ({window:?})",
            cfg.duplicate_window
        ));
    }
    if !cfg.max_age.is_zero() && cfg.max_age < cfg.duplicate_window {
        return fail(format!(
            "its max_age {:?} is shorter than its duplicate_window {:?}",
            cfg.max_age, cfg.duplicate_window
        ));
    }
    if cfg.max_messages > 0 || cfg.max_bytes > 0 || cfg.max_messages_per_subject > 0 {
        return fail("it has message or size limits that could drop claims early".into());
    }
    if cfg.no_ack {
        return fail("it does not acknowledge publishes (no_ack)".into());
    }
    Ok(())
}

impl NatsStore {
    pub async fn open(backend: &Backend) -> Result<NatsStore> {
        let Backend::Nats {
            url,
            prefix,
            duplicate_window_ms,
            timeout_ms,
        } = backend
        else {
            return Err(Error::invalid("backend", "not a nats:// backend"));
        };
        let timeout = Duration::from_millis(*timeout_ms);
        // async-nats bounds the TCP connect only: a listener that accepts and
        // never sends the NATS greeting would hold the start forever. The
        // whole handshake gets `timeout_ms`.
        let connect = async_nats::ConnectOptions::new()
            .name("anarchon")
            .connection_timeout(timeout)
            .connect(servers(url)?);
        let client = tokio::time::timeout(timeout, connect)
            .await
            .map_err(|_| {
                unavailable(
                    &format!("cannot connect to {}", redact(url)),
                    format!(
                        "no NATS greeting within {} (timeout_ms); is it a NATS server?",
                        crate::duration::human(timeout)
                    ),
                )
            })?
            .map_err(|e| unavailable(&format!("cannot connect to {}", redact(url)), e))?;
        let mut js = jetstream::new(client);
        js.set_timeout(timeout);
        let name = stream_name(prefix);
        let want = stream_config(prefix, *duplicate_window_ms);
        let stream = match js.get_stream(&name).await {
            Ok(s) => s,
            Err(e) if is_not_found(&e) => match js.create_stream(want).await {
                Ok(s) => s,
                // Another sidecar may have created it first: read it back.
                Err(create) => js
                    .get_stream(&name)
                    .await
                    .map_err(|_| unavailable(&format!("cannot create stream {name}"), create))?,
            },
            Err(e) => return Err(unavailable(&format!("cannot read stream {name}"), e)),
        };
        check_stream(&stream.cached_info().config, prefix, *duplicate_window_ms)?;
        let max_age = stream.cached_info().config.max_age;
        Ok(NatsStore {
            max_age,
            js,
            stream,
            stream_name: name,
            prefix: prefix.clone(),
            window_ms: *duplicate_window_ms as i64,
            info: StoreInfo {
                backend: BACKEND,
                leases: false,
                full_history: false,
                retention: format!(
                    "a claimed slot is remembered for duplicate_window_ms ({}) after its claim \
                     was stored; claims and results stay readable in History for the stream's \
                     max_age",
                    crate::duration::human(Duration::from_millis(*duplicate_window_ms))
                ),
                identity: super::address_identity("nats", &[url], prefix),
            },
        })
    }

    fn claims_subject(&self, job: &Job) -> String {
        format!("{}.claims.{}", self.prefix, job_subject(job))
    }

    fn results_subject(&self, job: &Job) -> String {
        format!("{}.results.{}", self.prefix, job_subject(job))
    }

    /// Publishes and waits for the stream's ack.
    async fn publish(
        &self,
        subject: String,
        msg_id: &str,
        payload: Vec<u8>,
    ) -> Result<jetstream::publish::PublishAck> {
        let publish = Publish::build()
            .payload(payload.into())
            .message_id(msg_id)
            .expected_stream(&self.stream_name);
        let fut = self
            .js
            .send_publish(subject, publish)
            .await
            .map_err(|e| unavailable("cannot publish", e))?;
        let ack = fut.await.map_err(|e| {
            use jetstream::context::PublishErrorKind as K;
            match e.kind() {
                K::Other => Error::Store(format!("nats: publish refused: {e}")),
                K::StreamNotFound => {
                    unavailable(&format!("no stream answered for {}", self.stream_name), e)
                }
                _ => unavailable("no acknowledgement", e),
            }
        })?;
        if ack.stream != self.stream_name {
            return Err(Error::Store(format!(
                "nats: the claim was stored in stream {}, not {}",
                ack.stream, self.stream_name
            )));
        }
        Ok(ack)
    }

    /// The claim stored at `seq`, if it is still there.
    async fn claim_at(&self, seq: u64) -> Result<Option<Stored>> {
        match self.stream.get_raw_message(seq).await {
            Ok(m) => Ok(serde_json::from_slice::<ClaimBody>(&m.payload)
                .ok()
                .map(|body| Stored { seq, body })),
            Err(e) if matches!(e.kind(), stream::LastRawMessageErrorKind::NoMessageFound) => {
                Ok(None)
            }
            Err(e) => Err(unavailable("cannot read the stored claim", e)),
        }
    }

    /// Reads every claim and result of `job` still in the stream, up to
    /// [`MAX_SCAN`] messages of each. Claims and results are read by two
    /// consumers: before NATS 2.10 a consumer filters on one subject only.
    async fn scan(&self, job: &Job) -> Result<Scan> {
        let mut scan = Scan::default();
        for subject in [self.claims_subject(job), self.results_subject(job)] {
            self.scan_subject(subject, &mut scan).await?;
        }
        Ok(scan)
    }

    async fn scan_subject(&self, subject: String, scan: &mut Scan) -> Result<()> {
        let is_claims = subject.starts_with(&format!("{}.claims.", self.prefix));
        let consumer = self
            .stream
            .create_consumer(consumer::pull::Config {
                deliver_policy: consumer::DeliverPolicy::All,
                ack_policy: consumer::AckPolicy::None,
                filter_subject: subject,
                inactive_threshold: Duration::from_secs(30),
                num_replicas: 1,
                ..Default::default()
            })
            .await
            .map_err(|e| unavailable("cannot read the job's claims", e))?;
        let name = consumer.cached_info().name.clone();
        let mut left = consumer.cached_info().num_pending as usize;
        let mut seen = 0usize;
        let res: Result<()> = async {
            while left > 0 {
                if seen >= MAX_SCAN {
                    scan.truncated = true;
                    break;
                }
                let want = left.min(500).min(MAX_SCAN - seen);
                let mut batch = consumer
                    .fetch()
                    .max_messages(want)
                    .messages()
                    .await
                    .map_err(|e| unavailable("cannot read the job's claims", e))?;
                let mut got = 0usize;
                while let Some(m) = batch.next().await {
                    let m = m.map_err(|e| unavailable("cannot read the job's claims", e))?;
                    got += 1;
                    let (seq, pending) = match m.info() {
                        Ok(i) => (i.stream_sequence, i.pending as usize),
                        Err(_) => (0, left.saturating_sub(got)),
                    };
                    if is_claims {
                        if let Ok(body) = serde_json::from_slice::<ClaimBody>(&m.payload) {
                            let e = scan.slots.entry(body.slot_ms).or_default();
                            // The first stored claim decided the slot.
                            if e.0.is_none() {
                                e.0 = Some(Stored { seq, body });
                            }
                        }
                    } else if let Ok(body) = serde_json::from_slice::<ResultBody>(&m.payload) {
                        let e = scan.slots.entry(body.slot_ms).or_default();
                        if e.1.is_none() {
                            e.1 = Some(body);
                        }
                    }
                    left = pending;
                }
                seen += got;
                if got == 0 {
                    break;
                }
            }
            Ok(())
        }
        .await;
        // Best effort: the consumer also goes away on its own when idle.
        let _ = self.stream.delete_consumer(&name).await;
        res
    }

    /// The stored claim of (job, slot): the job's newest claim is looked at
    /// first (a release usually follows its claim), then the job is scanned.
    async fn find_claim(&self, job: &Job, slot_ms: SlotMs) -> Result<Option<Stored>> {
        let subject = self.claims_subject(job);
        match self.stream.get_last_raw_message_by_subject(&subject).await {
            Ok(m) => {
                if let Ok(body) = serde_json::from_slice::<ClaimBody>(&m.payload) {
                    if body.slot_ms == slot_ms {
                        return Ok(Some(Stored {
                            seq: m.sequence,
                            body,
                        }));
                    }
                }
            }
            Err(e) if matches!(e.kind(), stream::LastRawMessageErrorKind::NoMessageFound) => {
                return Ok(None)
            }
            Err(e) => return Err(unavailable("cannot read the job's claims", e)),
        }
        let mut scan = self.scan(job).await?;
        Ok(scan.slots.remove(&slot_ms).and_then(|(c, _)| c))
    }
}

fn is_not_found(e: &jetstream::context::GetStreamError) -> bool {
    matches!(
        e.kind(),
        jetstream::context::GetStreamErrorKind::JetStream(j)
            if j.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND
    )
}

#[async_trait]
impl Store for NatsStore {
    fn info(&self) -> &StoreInfo {
        &self.info
    }

    async fn claim(&self, spec: &ClaimSpec, _dead: &DeadHolders) -> Result<ClaimAnswer> {
        let now = host_now_ms();
        if let Some(late) =
            broker::check_within_memory(BACKEND, "duplicate_window_ms", self.window_ms, spec, now)?
        {
            return Ok(late);
        }
        let body = ClaimBody {
            token: spec.token.as_str().to_owned(),
            node: spec.holder.node.clone(),
            instance: spec.holder.instance,
            slot_ms: spec.slot_ms,
            claimed_at_ms: now,
        };
        let payload = serde_json::to_vec(&body)
            .map_err(|e| Error::Store(format!("cannot encode a claim: {e}")))?;
        let msg_id = format!("{}:{}", spec.job, spec.slot_ms);
        let ack = self
            .publish(self.claims_subject(&spec.job), &msg_id, payload)
            .await?;
        let won = |holder: Holder| ClaimAnswer {
            outcome: Outcome::Won,
            token: Some(spec.token.clone()),
            attempt: 1,
            fencing: ack.sequence,
            lease_until_ms: 0,
            now_ms: now,
            holder: Some(holder),
            reason: None,
        };
        if !ack.duplicate {
            return Ok(won(spec.holder.clone()));
        }
        match self.claim_at(ack.sequence).await? {
            Some(stored) if stored.body.token == spec.token.as_str() => Ok(won(stored.holder())),
            Some(stored) => Ok(ClaimAnswer {
                holder: Some(stored.holder()),
                ..ClaimAnswer::bare(Outcome::Lost, now, None)
            }),
            // De-duplicated against a claim that is gone already.
            None => Ok(ClaimAnswer::bare(Outcome::Lost, now, Some("unknown"))),
        }
    }

    async fn release(&self, spec: &ReleaseSpec, dead: &DeadHolders) -> Result<()> {
        let claim = self
            .find_claim(&spec.job, spec.slot_ms)
            .await?
            .ok_or_else(|| {
                Error::NotFound(format!(
                    "no claim of {} slot {} is remembered",
                    spec.job, spec.slot_ms
                ))
            })?;
        if claim.body.token != spec.token.as_str() {
            // No takeovers on a once backend: the token never held the slot.
            return Err(Error::Fenced(FenceReason::NotHolder));
        }
        let result_id = format!("{}:{}:result", spec.job, spec.slot_ms);
        if dead.is_dead(&claim.holder()) {
            // Only a release already recorded is still fine (idempotent).
            let scan = self.scan(&spec.job).await?;
            let done = scan
                .slots
                .get(&spec.slot_ms)
                .is_some_and(|(_, r)| r.as_ref().is_some_and(|r| r.token == claim.body.token));
            return if done {
                Ok(())
            } else {
                Err(Error::Fenced(FenceReason::HolderDead))
            };
        }
        let body = ResultBody {
            token: claim.body.token.clone(),
            node: claim.body.node.clone(),
            instance: claim.body.instance,
            slot_ms: spec.slot_ms,
            result: spec.result.state().as_str().to_owned(),
            finished_at_ms: host_now_ms(),
        };
        let payload = serde_json::to_vec(&body)
            .map_err(|e| Error::Store(format!("cannot encode a result: {e}")))?;
        // A repeated release is de-duplicated by its id: recorded once.
        self.publish(self.results_subject(&spec.job), &result_id, payload)
            .await?;
        Ok(())
    }

    async fn history(
        &self,
        job: &Job,
        limit: u32,
        before_slot_ms: Option<i64>,
    ) -> Result<HistoryPage> {
        let scan = self.scan(job).await?;
        let before = before_slot_ms.unwrap_or(i64::MAX);
        let mut runs = Vec::new();
        for (&slot, (claim, result)) in scan.slots.range(..before).rev() {
            if runs.len() >= limit as usize {
                break;
            }
            let (token, holder, fencing, claimed_at) = match (claim, result) {
                (Some(c), _) => (
                    c.body.token.as_str(),
                    c.holder(),
                    c.seq,
                    c.body.claimed_at_ms,
                ),
                (None, Some(r)) => (
                    r.token.as_str(),
                    Holder {
                        node: r.node.clone(),
                        instance: r.instance,
                    },
                    0,
                    0,
                ),
                (None, None) => continue,
            };
            let Ok(token) = Token::parse(token) else {
                continue;
            };
            let (state, finished_at_ms) = match result {
                Some(r) => (
                    RunState::parse(&r.result).unwrap_or(RunState::Claimed),
                    r.finished_at_ms,
                ),
                None => (RunState::Claimed, 0),
            };
            runs.push(RunRow {
                slot_ms: slot,
                state,
                attempt: 1,
                fencing,
                token,
                holder,
                lease_until_ms: 0,
                claimed_at_ms: claimed_at,
                finished_at_ms,
            });
        }
        let kept = if self.max_age.is_zero() {
            "until they are deleted".to_owned()
        } else {
            format!(
                "for the stream's max_age ({})",
                crate::duration::human(self.max_age)
            )
        };
        let mut note = format!(
            "the nats backend keeps claims and results {kept}; a claim without a result is CLAIMED"
        );
        if scan.truncated {
            note.push_str(&format!("; only the first {MAX_SCAN} messages were read"));
        }
        Ok(HistoryPage {
            runs,
            complete: false,
            note: Some(note),
        })
    }

    async fn ping(&self) -> Result<()> {
        self.stream
            .get_info()
            .await
            .map(|_| ())
            .map_err(|e| unavailable("stream info", e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let b = Backend::parse("nats://127.0.0.1:4222").unwrap();
        assert_eq!(
            b,
            Backend::Nats {
                url: "nats://127.0.0.1:4222".into(),
                prefix: "anarchon".into(),
                duplicate_window_ms: broker::DEFAULT_MEMORY_MS,
                timeout_ms: broker::DEFAULT_TIMEOUT_MS,
            }
        );
        assert_eq!(b.name(), "nats");
        assert_eq!(
            b.memory_ms(),
            Some(("duplicate_window_ms", broker::DEFAULT_MEMORY_MS))
        );
        assert!(Backend::parse("nats://a:4222,b:4223?prefix=x&duplicate_window_ms=120000").is_ok());
        assert_eq!(servers("nats://a:4222,nats://b:4223").unwrap().len(), 2);
        for bad in [
            "nats://",
            "nats://h?prefix=a.b",
            "nats://h?duplicate_window_ms=10",
            "nats://h?window=1",
        ] {
            assert!(Backend::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn job_subjects() {
        let j = |s: &str| Job::parse(s).unwrap();
        assert_eq!(job_subject(&j("a.b.c")), "a.b.c");
        assert_eq!(job_subject(&j("a:b/c-d_e")), "a:b/c-d_e");
        for odd in [".a", "a.", "a..b", "."] {
            let job = j(odd);
            let s = job_subject(&job);
            assert!(s.starts_with('~') && !s.contains('.'), "{odd} -> {s}");
        }
        assert_ne!(job_subject(&j(".a")), job_subject(&j("a.")));
    }

    #[test]
    fn created_streams_pass_their_own_check() {
        let c = stream_config("anarchon", 600_000);
        assert_eq!(c.name, "ANARCHON");
        assert!(c.max_age >= c.duplicate_window);
        check_stream(&c, "anarchon", 600_000).unwrap();
        assert!(check_stream(&c, "anarchon", 600_001).is_err());
        let mem = stream::Config {
            storage: stream::StorageType::Memory,
            ..c.clone()
        };
        assert!(check_stream(&mem, "anarchon", 600_000).is_err());
        let short = stream::Config {
            max_age: Duration::from_secs(60),
            ..c
        };
        assert!(check_stream(&short, "anarchon", 600_000).is_err());
    }
}
