//! The `anarchon.v1.Claims` service.
//!
//! Each RPC validates its request (see [`super::validate`]), asks the store
//! with the current dead-holder set, and answers. One span per RPC carries
//! `job`, `slot` and `outcome` (`debug` for the unary RPCs, `info` for a
//! `Hold` stream: see `rpc_span!`).

use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};
use tracing::{field::Empty, Instrument};

use super::convert;
use super::metrics::{Metrics, OutcomeLabels, RpcLabels};
use super::runs::RunFeed;
use super::validate::{self, ClaimDefaults};
use crate::claim::*;
use crate::error::{Error, FenceReason, Result};
use crate::liveness::{Bound, Guard};
use crate::proto as pb;
use crate::store::DynStore;

/// Everything the Claims service needs.
pub struct ClaimsState {
    pub store: DynStore,
    pub defaults: ClaimDefaults,
    pub holder: Holder,
    pub metrics: Arc<Metrics>,
    /// Who is dead (mesh view, confirmed in the store for claims), and how
    /// long this sidecar may promise a hold (the self-fence).
    pub guard: Arc<Guard>,
    /// Bumped whenever a run is released or a lease ended (here or, through
    /// the mesh, at a peer) or a holder died, to wake waiters.
    pub changed: watch::Sender<u64>,
    /// The mesh, to nudge peers' waiters when a run is released here.
    pub mesh: Option<Arc<crate::mesh::Mesh>>,
    /// How often a waiter re-checks the store without a local notification.
    pub poll: Duration,
    /// Flips to true when the sidecar starts draining.
    pub shutdown: watch::Receiver<bool>,
    /// Open `Hold` streams per client address.
    pub holds: HoldLimiter,
    /// Recent runs and run events, for the dashboard.
    pub runs: Arc<RunFeed>,
}

/// Bounds the open `Hold` streams per client address.
pub struct HoldLimiter {
    max: usize,
    open: std::sync::Mutex<std::collections::HashMap<std::net::IpAddr, usize>>,
}

/// Releases one `Hold` slot when dropped.
pub struct HoldPermit {
    limiter: Arc<ClaimsState>,
    ip: Option<std::net::IpAddr>,
}

impl HoldLimiter {
    pub fn new(max: usize) -> Self {
        HoldLimiter {
            max,
            open: Default::default(),
        }
    }
}

impl ClaimsState {
    fn hold_permit(self: &Arc<Self>, ip: Option<std::net::IpAddr>) -> Result<HoldPermit> {
        if let Some(ip) = ip {
            let mut open = self.holds.open.lock().unwrap_or_else(|p| p.into_inner());
            let n = open.entry(ip).or_default();
            if *n >= self.holds.max {
                return Err(Error::ResourceExhausted(format!(
                    "{} open Hold streams from {ip} (max_holds_per_client)",
                    self.holds.max
                )));
            }
            *n += 1;
        }
        Ok(HoldPermit {
            limiter: self.clone(),
            ip,
        })
    }
}

impl Drop for HoldPermit {
    fn drop(&mut self) {
        if let Some(ip) = self.ip {
            let mut open = self
                .limiter
                .holds
                .open
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if let Some(n) = open.get_mut(&ip) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    open.remove(&ip);
                }
            }
        }
    }
}

impl ClaimsState {
    fn notify(&self, job: &Job, slot_ms: SlotMs) {
        self.changed.send_modify(|n| *n = n.wrapping_add(1));
        if let Some(m) = &self.mesh {
            m.nudge(job.as_str(), slot_ms);
        }
    }

    /// The claim with its optional wait, bounded by the client's deadline.
    async fn claim(
        &self,
        valid: &validate::ValidClaim,
        deadline: Option<Instant>,
    ) -> Result<(ClaimAnswer, i64)> {
        let started = Instant::now();
        let wait_end = started + Duration::from_millis(valid.wait_ms as u64);
        // Leave room to answer before the client's deadline.
        let wait_end = match deadline {
            Some(d) => wait_end.min(d.checked_sub(Duration::from_millis(20)).unwrap_or(d)),
            None => wait_end,
        };
        let mut changed = self.changed.subscribe();
        let mut shutdown = self.shutdown.clone();
        loop {
            let bound = self.promise()?;
            let dead = self.guard.dead_for_claims();
            let answer = with_deadline(deadline, self.store.claim(&valid.spec, &dead)).await?;
            let now = Instant::now();
            let valid_for = if answer.outcome == Outcome::Won {
                self.bound_win(&valid.spec, &answer, bound, now).await?
            } else {
                0
            };
            if answer.outcome != Outcome::Running
                || valid.wait_ms == 0
                || !self.store.info().leases
                || now >= wait_end
                || *shutdown.borrow()
            {
                return Ok((answer, valid_for));
            }
            // Wake when something is released here, when the lease lapses
            // (store clock), or at the poll interval for changes elsewhere.
            let lease_left =
                Duration::from_millis((answer.lease_until_ms - answer.now_ms).max(0) as u64 + 1);
            let nap = (wait_end - now).min(lease_left).min(self.poll);
            tokio::select! {
                _ = changed.changed() => {}
                _ = shutdown.changed() => {}
                _ = tokio::time::sleep(nap) => {}
            }
        }
    }

    /// What this sidecar may promise now; on a lease store, nothing at all
    /// while its own liveness is not confirmed (the self-fence).
    fn promise(&self) -> Result<Bound> {
        match self.guard.bound() {
            Bound::Fenced if self.store.info().leases => Err(Error::Unavailable(
                "this sidecar has not confirmed its liveness in the store within the expiry \
                 (or is leaving), so it cannot promise a lease"
                    .into(),
            )),
            b => Ok(b),
        }
    }

    /// Caps a win's lease at what the self-fence allows (`bound` was taken
    /// before the store was asked). A win the fence no longer covers is
    /// handed back at once and answered `UNAVAILABLE`: the claimer must not
    /// act on it.
    async fn bound_win(
        &self,
        spec: &ClaimSpec,
        answer: &ClaimAnswer,
        bound: Bound,
        now: Instant,
    ) -> Result<i64> {
        match bound.cap_ms(now, answer.valid_for_ms()) {
            Some(cap) => Ok(cap),
            None => {
                if let Err(e) = self.end_lease(spec).await {
                    tracing::warn!(job = %spec.job, slot = spec.slot_ms, error = %e, "could not hand back a win the self-fence no longer covers");
                }
                Err(Error::Unavailable(
                    "this sidecar's liveness confirmation ran out during the claim; the win was handed back"
                        .into(),
                ))
            }
        }
    }

    /// Ends the lease held with `spec.token` at once (its holder stopped),
    /// so the next claimer takes the run over; wakes waiters and tells the
    /// dashboard when a lease did end. `false` when there was none to end
    /// (released, taken over, or a store without leases).
    async fn end_lease(&self, spec: &ClaimSpec) -> Result<bool> {
        let Some(leases) = self.store.leases() else {
            return Ok(false);
        };
        let ended = leases
            .end_lease(&spec.job, spec.slot_ms, &spec.token)
            .await?;
        if ended {
            self.notify(&spec.job, spec.slot_ms);
            self.runs.lease_ended(spec.job.as_str(), spec.slot_ms);
        }
        Ok(ended)
    }

    fn observe(&self, rpc: &'static str, started: Instant) {
        self.metrics
            .rpc_seconds
            .get_or_create(&RpcLabels { rpc })
            .observe(started.elapsed().as_secs_f64());
    }

    /// Counts an answer; a win also goes to the dashboard's run feed.
    fn count(&self, op: &'static str, spec: &ClaimSpec, answer: &ClaimAnswer) {
        if answer.outcome == Outcome::Won {
            self.runs.won(op, spec, answer);
        }
        self.metrics
            .claims
            .get_or_create(&OutcomeLabels {
                outcome: answer.outcome.as_str(),
                backend: self.store.info().backend,
            })
            .inc();
        if answer.outcome == Outcome::Won && answer.attempt > 1 {
            self.metrics.takeovers.inc();
        }
    }

    /// Tells the dashboard about a renewal or release refused as fenced.
    fn note_fenced(&self, op: &'static str, job: &str, slot_ms: SlotMs, e: &Error) {
        if let Error::Fenced(reason) = e {
            self.runs.fenced(op, job, slot_ms, reason.as_str());
        }
    }

    fn fail(&self, e: Error) -> Status {
        self.fail_at(e, None, None)
    }

    /// [`Self::fail`] for an RPC of `job` (and `slot`): the warning names
    /// them itself, since a unary RPC's span is off at the default `info`.
    /// A `None` field is left out of the line.
    fn fail_at(&self, e: Error, job: Option<&str>, slot: Option<i64>) -> Status {
        self.metrics.record_error(&e);
        if matches!(e, Error::Unavailable(_) | Error::Store(_)) {
            tracing::warn!(job, slot, error = %e, "store error");
        }
        e.into()
    }
}

async fn with_deadline<T>(
    deadline: Option<Instant>,
    fut: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    match deadline {
        None => fut.await,
        Some(d) => tokio::time::timeout_at(d.into(), fut)
            .await
            .map_err(|_| Error::DeadlineExceeded)?,
    }
}

/// The client a request came from, for the per-client limit of Hold
/// streams: its IP, or for the Unix socket (`listen_unix`) the loopback
/// address, so that local clients share one count however they connect.
fn client_ip<T>(req: &Request<T>) -> Option<std::net::IpAddr> {
    req.remote_addr().map(|a| a.ip()).or_else(|| {
        req.extensions()
            .get::<tonic::transport::server::UdsConnectInfo>()
            .map(|_| std::net::IpAddr::from(std::net::Ipv4Addr::LOCALHOST))
    })
}

/// The client's deadline, from the `grpc-timeout` header.
fn deadline<T>(req: &Request<T>) -> Option<Instant> {
    let header = req.metadata().get("grpc-timeout")?.to_str().ok()?;
    let (num, unit) = header.split_at(header.len().checked_sub(1)?);
    let n: u64 = num.parse().ok()?;
    let d = match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    };
    Instant::now().checked_add(d)
}

#[derive(Clone)]
pub struct ClaimsService(pub Arc<ClaimsState>);

type HoldStream = Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::HoldEvent, Status>> + Send>>;

impl ClaimsState {
    /// Runs one RPC's body inside `span` (which carries `job`, `slot` and
    /// an empty `outcome`): times it, records the outcome the body names
    /// (or the error's kind), counts errors and maps them to a status. Every
    /// `Claims` RPC goes through here.
    async fn rpc<T>(
        &self,
        rpc: &'static str,
        (span, job, slot): (tracing::Span, &str, Option<i64>),
        body: impl std::future::Future<Output = Result<(T, &'static str)>>,
    ) -> Result<T, Status> {
        let started = Instant::now();
        let answer = body.instrument(span.clone()).await;
        self.observe(rpc, started);
        match answer {
            Ok((reply, outcome)) => {
                span.record("outcome", outcome);
                Ok(reply)
            }
            Err(e) => {
                span.record("outcome", e.kind());
                let _in = span.enter();
                Err(self.fail_at(e, Some(job), slot))
            }
        }
    }

    /// The claim of `Claim` and `Hold`: validated, decided (with its wait),
    /// counted. Returns the valid request, the answer and its `valid_for_ms`.
    async fn claim_counted(
        &self,
        op: &'static str,
        req: &pb::ClaimRequest,
        deadline: Option<Instant>,
    ) -> Result<((validate::ValidClaim, ClaimAnswer, i64), &'static str)> {
        let valid = validate::claim(req, &self.defaults, &self.holder)?;
        let (answer, valid_for_ms) = self.claim(&valid, deadline).await?;
        self.count(op, &valid.spec, &answer);
        tracing::debug!(attempt = answer.attempt, "{op} answered");
        let outcome = answer.outcome.as_str();
        Ok(((valid, answer, valid_for_ms), outcome))
    }

    /// A `ClaimResponse` for `answer`, with the self-fence's `valid_for_ms`.
    fn claim_pb(&self, answer: &ClaimAnswer, valid_for_ms: i64) -> pb::ClaimResponse {
        pb::ClaimResponse {
            valid_for_ms,
            ..convert::answer_pb(answer, self.store.info().backend)
        }
    }
}

/// The span of a `Claims` RPC: its job and slot, and the outcome to come;
/// with the span, the job and slot that [`ClaimsState::rpc`] names in its
/// error warning.
///
/// A unary RPC's span is at `debug` (`RUST_LOG=anarchon=debug` shows it):
/// at `info` building it, entering it at every poll and formatting its
/// fields cost 8–11 % of the sidecar's CPU per claim (docs/BENCHMARKS.md,
/// round 5), while no `info` line is written inside a claim that goes well;
/// the warnings that can be (a store error, a win handed back) name the job
/// and slot themselves. A `Hold` stream's span stays at `info`: its events
/// (LOST_LEASE, a broken stream) are written at `info` and need the context,
/// and a stream builds it once.
macro_rules! rpc_span {
    ($level:ident, $name:literal, $job:expr, $slot:expr) => {
        (
            tracing::span!(tracing::Level::$level, $name, job = %$job, slot = $slot, outcome = Empty),
            $job.as_str(),
            Some($slot),
        )
    };
}

#[tonic::async_trait]
impl pb::claims_server::Claims for ClaimsService {
    async fn claim(
        &self,
        request: Request<pb::ClaimRequest>,
    ) -> Result<Response<pb::ClaimResponse>, Status> {
        let state = &self.0;
        let deadline = deadline(&request);
        let req = request.into_inner();
        let span = rpc_span!(DEBUG, "claim", req.job, req.slot_ms);
        let (_, answer, valid_for_ms) = state
            .rpc("claim", span, state.claim_counted("claim", &req, deadline))
            .await?;
        Ok(Response::new(state.claim_pb(&answer, valid_for_ms)))
    }

    async fn renew(
        &self,
        request: Request<pb::RenewRequest>,
    ) -> Result<Response<pb::RenewResponse>, Status> {
        let state = &self.0;
        let deadline = deadline(&request);
        let req = request.into_inner();
        let span = rpc_span!(DEBUG, "renew", req.job, req.slot_ms);
        let body = async {
            let spec = validate::renew(&req, &state.defaults)?;
            let Some(leases) = state.store.leases() else {
                return Err(Error::NoLeases(state.store.info().backend));
            };
            let bound = state.promise()?;
            let dead = state.guard.dead_holders();
            let renewed = with_deadline(deadline, leases.renew(&spec, &dead)).await?;
            let valid_for_ms = bound
                .cap_ms(
                    Instant::now(),
                    (renewed.lease_until_ms - renewed.now_ms).max(0),
                )
                .ok_or_else(|| {
                    Error::Unavailable(
                        "this sidecar's liveness confirmation ran out during the renewal".into(),
                    )
                })?;
            state.metrics.renewals.inc();
            let reply = pb::RenewResponse {
                lease_until_ms: renewed.lease_until_ms,
                attempt: renewed.attempt,
                valid_for_ms,
                fencing: renewed.fencing,
            };
            Ok((reply, "renewed"))
        };
        let body = async {
            body.await
                .inspect_err(|e| state.note_fenced("renew", &req.job, req.slot_ms, e))
        };
        Ok(Response::new(state.rpc("renew", span, body).await?))
    }

    async fn release(
        &self,
        request: Request<pb::ReleaseRequest>,
    ) -> Result<Response<pb::ReleaseResponse>, Status> {
        let state = &self.0;
        let deadline = deadline(&request);
        let req = request.into_inner();
        let span = rpc_span!(DEBUG, "release", req.job, req.slot_ms);
        let body = async {
            let spec = validate::release(&req)?;
            let dead = state.guard.dead_holders();
            with_deadline(deadline, state.store.release(&spec, &dead)).await?;
            state.notify(&spec.job, spec.slot_ms);
            state
                .runs
                .released(spec.job.as_str(), spec.slot_ms, spec.result);
            Ok((pb::ReleaseResponse {}, "released"))
        };
        let body = async {
            body.await
                .inspect_err(|e| state.note_fenced("release", &req.job, req.slot_ms, e))
        };
        Ok(Response::new(state.rpc("release", span, body).await?))
    }

    type HoldStream = HoldStream;

    async fn hold(
        &self,
        request: Request<pb::ClaimRequest>,
    ) -> Result<Response<HoldStream>, Status> {
        let state = self.0.clone();
        let received = Instant::now();
        let deadline = deadline(&request);
        let permit = state
            .hold_permit(client_ip(&request))
            .map_err(|e| state.fail(e))?;
        let req = request.into_inner();
        let at = rpc_span!(INFO, "hold", req.job, req.slot_ms);
        let span = at.0.clone();
        let (valid, answer, valid_for_ms) = state
            .rpc("hold", at, state.claim_counted("hold", &req, deadline))
            .await?;

        let (tx, rx) = mpsc::channel(8);
        // The win's local deadline: the claim's answer (capped by the
        // self-fence) counted from now, which is after the store decided.
        let valid_until = Instant::now() + Duration::from_millis(valid_for_ms.max(0) as u64);
        let first = pb::HoldEvent {
            kind: pb::HoldEventKind::Claimed as i32,
            claim: Some(state.claim_pb(&answer, valid_for_ms)),
            hold_valid_for_ms: if answer.outcome == Outcome::Won {
                since(received, valid_until)
            } else {
                0
            },
            ..Default::default()
        };
        // The channel is fresh and has room: this cannot block.
        let _ = tx.try_send(Ok(first));
        let (sent_all, delivered) = tokio::sync::oneshot::channel::<()>();
        if answer.outcome == Outcome::Won && state.store.leases().is_some() {
            let hold = HeldRun {
                spec: valid.spec,
                received,
                valid_until,
            };
            tokio::spawn(
                async move {
                    keep_renewing(state, hold, tx, delivered).await;
                    drop(permit);
                }
                .instrument(span),
            );
        } else if answer.outcome == Outcome::Won {
            // Once backends have nothing to renew: the stream stays open
            // until the client closes it.
            tokio::spawn(async move {
                tx.closed().await;
                drop(permit);
            });
        }
        Ok(Response::new(Box::pin(Delivered {
            events: ReceiverStream::new(rx),
            _sent_all: sent_all,
        }) as HoldStream))
    }

    async fn history(
        &self,
        request: Request<pb::HistoryRequest>,
    ) -> Result<Response<pb::HistoryResponse>, Status> {
        let state = &self.0;
        let deadline = deadline(&request);
        let req = request.into_inner();
        let span = (
            tracing::debug_span!("history", job = %req.job, slot = Empty, outcome = Empty),
            req.job.as_str(),
            None,
        );
        let body = async {
            let (job, limit, before) = validate::history(&req)?;
            let page = with_deadline(deadline, state.store.history(&job, limit, before)).await?;
            let info = state.store.info();
            let reply = pb::HistoryResponse {
                runs: page.runs.iter().map(convert::run_pb).collect(),
                backend: info.backend.to_owned(),
                retention: info.retention.clone(),
                complete: page.complete,
                note: page.note.unwrap_or_default(),
            };
            Ok((reply, "ok"))
        };
        Ok(Response::new(state.rpc("history", span, body).await?))
    }
}

/// A `Hold` stream's events; dropped by the server once it has written the
/// last of them (and the trailers) to the connection, which tells the
/// renewal task that its last word is on its way.
struct Delivered {
    events: ReceiverStream<Result<pb::HoldEvent, Status>>,
    _sent_all: tokio::sync::oneshot::Sender<()>,
}

impl tokio_stream::Stream for Delivered {
    type Item = Result<pb::HoldEvent, Status>;

    fn poll_next(
        self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        Pin::new(&mut self.get_mut().events).poll_next(cx)
    }
}

/// A run won through a `Hold` stream.
struct HeldRun {
    spec: ClaimSpec,
    /// When the Hold request arrived (after the client sent it).
    received: Instant,
    /// Until when the client may act on the run, on this sidecar's clock.
    valid_until: Instant,
}

/// Milliseconds from `from` to `to` (0 when `to` is earlier).
fn since(from: Instant, to: Instant) -> i64 {
    to.saturating_duration_since(from).as_millis() as i64
}

/// The `Hold` renewal loop: renews every lease/3 (every expiry/3 when the
/// self-fence bounds holds) while the client listens. Every RENEWED event
/// carries the new deadline counted from the Hold request
/// (`hold_valid_for_ms`). The stream ends with `LOST_LEASE` when the run is
/// fenced, when no renewal succeeds before the deadline, and when the
/// sidecar leaves. A client that goes away without releasing (its stream
/// broke, or it stopped answering HTTP/2 keepalive pings) ends the lease at
/// once.
async fn keep_renewing(
    state: Arc<ClaimsState>,
    mut hold: HeldRun,
    tx: mpsc::Sender<Result<pb::HoldEvent, Status>>,
    delivered: tokio::sync::oneshot::Receiver<()>,
) {
    state.metrics.holds_open.inc();
    let spec = &hold.spec;
    let every = state.guard.renew_every(spec.lease_ms);
    let renew = RenewSpec {
        job: spec.job.clone(),
        slot_ms: spec.slot_ms,
        token: spec.token.clone(),
        lease_ms: spec.lease_ms,
    };
    let mut shutdown = state.shutdown.clone();
    let lost = |reason: &str| pb::HoldEvent {
        kind: pb::HoldEventKind::LostLease as i32,
        reason: reason.to_owned(),
        ..Default::default()
    };
    let mut client_gone = false;
    let mut last_error: Option<Error> = None;
    loop {
        let until = tokio::time::Instant::from_std(hold.valid_until);
        tokio::select! {
            // In this order: after a pause (SIGSTOP) every branch is ready at
            // once, and a deadline that passed must win over a renewal.
            biased;
            _ = tx.closed() => { client_gone = true; break; }
            _ = async { let _ = shutdown.wait_for(|v| *v).await; } => {
                tracing::info!("sidecar leaving: hold told LOST_LEASE");
                tell_last(&tx, lost("sidecar_leaving")).await;
                break;
            }
            _ = tokio::time::sleep_until(until) => {
                let reason = hand_back(&state, spec, last_error.is_some()).await;
                tracing::warn!(reason, "hold reached its deadline without a renewal");
                tell_last(&tx, lost(reason)).await;
                break;
            }
            _ = tokio::time::sleep(every) => {}
        }
        let sent = Instant::now();
        if sent >= hold.valid_until {
            // Woken late (a pause): the client has already stopped.
            let reason = hand_back(&state, spec, last_error.is_some()).await;
            tell_last(&tx, lost(reason)).await;
            break;
        }
        let bound = match state.promise() {
            Ok(b) => b,
            Err(e) => {
                // Not confirmed: renewing would promise what we cannot
                // keep. The deadline ends the hold if this lasts.
                last_error = Some(e);
                continue;
            }
        };
        let dead = state.guard.dead_holders();
        let Some(leases) = state.store.leases() else {
            break;
        };
        match leases.renew(&renew, &dead).await {
            Ok(r) => {
                state.metrics.renewals.inc();
                let lease_ms = (r.lease_until_ms - r.now_ms).max(0);
                let Some(valid) = bound.cap_ms(Instant::now(), lease_ms) else {
                    last_error = None;
                    continue;
                };
                // Counted from the send of the renewal: the store decided
                // after it, so this deadline is never late.
                let lease_end = sent + Duration::from_millis(lease_ms as u64);
                let fence_end = Instant::now() + Duration::from_millis(valid as u64);
                hold.valid_until = lease_end.min(fence_end);
                last_error = None;
                let ev = pb::HoldEvent {
                    kind: pb::HoldEventKind::Renewed as i32,
                    lease_until_ms: r.lease_until_ms,
                    valid_for_ms: since(Instant::now(), hold.valid_until),
                    hold_valid_for_ms: since(hold.received, hold.valid_until),
                    ..Default::default()
                };
                if tx.send(Ok(ev)).await.is_err() {
                    client_gone = true;
                    break;
                }
            }
            Err(Error::Fenced(FenceReason::Released)) => {
                let _ = tx
                    .send(Ok(pb::HoldEvent {
                        kind: pb::HoldEventKind::Released as i32,
                        ..Default::default()
                    }))
                    .await;
                break;
            }
            Err(e @ (Error::Fenced(_) | Error::NotFound(_))) => {
                state.note_fenced("hold", spec.job.as_str(), spec.slot_ms, &e);
                state.metrics.record_error(&e);
                tracing::info!(reason = e.kind(), "hold lost its lease");
                tell_last(&tx, lost("fenced")).await;
                break;
            }
            Err(e) => {
                // Store trouble: keep trying until the deadline.
                state.metrics.record_error(&e);
                tracing::warn!(error = %e, "hold could not renew");
                last_error = Some(e);
            }
        }
    }
    if client_gone {
        // The worker died without releasing: end the lease now so the next
        // claimer takes the run over. A no-op if it was released.
        match state.end_lease(spec).await {
            Ok(true) => tracing::info!("hold stream broke without release; lease ended"),
            Ok(false) => {}
            Err(e) => tracing::warn!(error = %e, "could not end the lease of a broken hold"),
        }
    }
    // End the stream and wait (briefly) until the server has written its
    // last event: a leaving sidecar tells its peers only after that.
    drop(tx);
    let _ = tokio::time::timeout(Duration::from_millis(500), delivered).await;
    state.metrics.holds_open.dec();
}

/// A hold whose deadline passed without a renewal: its client has stopped,
/// so the run is handed back at once (the next claimer need not wait for
/// the lease to lapse), and the answer names why it was lost: `fenced` when
/// the run is no longer ours (taken over meanwhile), `expired` when it was
/// (a pause, a slow store), `unavailable` or `liveness_unconfirmed` when the
/// store cannot be reached (renewals failed, or this sidecar's own record).
async fn hand_back(state: &ClaimsState, spec: &ClaimSpec, renew_failed: bool) -> &'static str {
    if state.store.leases().is_none() {
        return "expired";
    }
    match tokio::time::timeout(Duration::from_millis(200), state.end_lease(spec)).await {
        Ok(Ok(true)) => "expired",
        Ok(Ok(false)) => "fenced",
        _ if renew_failed => "unavailable",
        _ => "liveness_unconfirmed",
    }
}

/// Sends the last event of a stream (the renewal task then ends the stream
/// and waits for its delivery).
async fn tell_last(tx: &mpsc::Sender<Result<pb::HoldEvent, Status>>, ev: pb::HoldEvent) {
    let _ = tx.send(Ok(ev)).await;
}
