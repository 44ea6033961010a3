//! The `anarchon.v1.Claims` service.
//!
//! Each RPC validates its request (see [`super::validate`]), asks the store
//! with the current dead-holder set, and answers. One span per RPC carries
//! `job`, `slot` and `outcome`.

use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};
use tracing::{field::Empty, Instrument};

use super::metrics::{Metrics, OutcomeLabels, RpcLabels};
use super::runs::RunFeed;
use super::validate::{self, ClaimDefaults};
use crate::claim::*;
use crate::error::{Error, FenceReason, Result};
use crate::proto as pb;
use crate::store::DynStore;

/// Who is dead right now, as the store's atomic step needs it.
pub trait Liveness: Send + Sync + 'static {
    fn dead_holders(&self) -> DeadHolders;
}

/// Everything the Claims service needs.
pub struct ClaimsState {
    pub store: DynStore,
    pub defaults: ClaimDefaults,
    pub holder: Holder,
    pub metrics: Arc<Metrics>,
    pub liveness: Arc<dyn Liveness>,
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
        v: &validate::ValidClaim,
        deadline: Option<Instant>,
    ) -> Result<ClaimAnswer> {
        let started = Instant::now();
        let wait_end = started + Duration::from_millis(v.wait_ms as u64);
        // Leave room to answer before the client's deadline.
        let wait_end = match deadline {
            Some(d) => wait_end.min(d.checked_sub(Duration::from_millis(20)).unwrap_or(d)),
            None => wait_end,
        };
        let mut changed = self.changed.subscribe();
        let mut shutdown = self.shutdown.clone();
        loop {
            let dead = self.liveness.dead_holders();
            let a = with_deadline(deadline, self.store.claim(&v.spec, &dead)).await?;
            let now = Instant::now();
            if a.outcome != Outcome::Running
                || v.wait_ms == 0
                || !self.store.info().leases
                || now >= wait_end
                || *shutdown.borrow()
            {
                return Ok(a);
            }
            // Wake when something is released here, when the lease lapses
            // (store clock), or at the poll interval for changes elsewhere.
            let lease_left = Duration::from_millis((a.lease_until_ms - a.now_ms).max(0) as u64 + 1);
            let nap = (wait_end - now).min(lease_left).min(self.poll);
            tokio::select! {
                _ = changed.changed() => {}
                _ = shutdown.changed() => {}
                _ = tokio::time::sleep(nap) => {}
            }
        }
    }

    fn observe(&self, rpc: &'static str, started: Instant) {
        self.metrics
            .rpc_seconds
            .get_or_create(&RpcLabels { rpc })
            .observe(started.elapsed().as_secs_f64());
    }

    /// Counts an answer; a win also goes to the dashboard's run feed.
    fn count(&self, op: &'static str, spec: &ClaimSpec, a: &ClaimAnswer) {
        if a.outcome == Outcome::Won {
            self.runs.won(op, spec, a);
        }
        self.metrics
            .claims
            .get_or_create(&OutcomeLabels {
                outcome: a.outcome.as_str(),
                backend: self.store.info().backend,
            })
            .inc();
        if a.outcome == Outcome::Won && a.attempt > 1 {
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
        self.metrics.record_error(&e);
        if matches!(e, Error::Unavailable(_) | Error::Store(_)) {
            tracing::warn!(error = %e, "store error");
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

/// The client's deadline, from the `grpc-timeout` header.
fn deadline<T>(req: &Request<T>) -> Option<Instant> {
    let v = req.metadata().get("grpc-timeout")?.to_str().ok()?;
    let (num, unit) = v.split_at(v.len().checked_sub(1)?);
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

#[tonic::async_trait]
impl pb::claims_server::Claims for ClaimsService {
    async fn claim(
        &self,
        request: Request<pb::ClaimRequest>,
    ) -> Result<Response<pb::ClaimResponse>, Status> {
        let s = &self.0;
        let started = Instant::now();
        let deadline = deadline(&request);
        let req = request.into_inner();
        let span =
            tracing::info_span!("claim", job = %req.job, slot = req.slot_ms, outcome = Empty);
        async move {
            let res = match validate::claim(&req, &s.defaults, &s.holder) {
                Ok(v) => s.claim(&v, deadline).await.map(|a| (v, a)),
                Err(e) => Err(e),
            };
            s.observe("claim", started);
            match res {
                Ok((v, a)) => {
                    tracing::Span::current().record("outcome", a.outcome.as_str());
                    s.count("claim", &v.spec, &a);
                    tracing::debug!(attempt = a.attempt, "claim answered");
                    Ok(Response::new(validate::answer_pb(
                        &a,
                        s.store.info().backend,
                    )))
                }
                Err(e) => {
                    tracing::Span::current().record("outcome", e.kind());
                    Err(s.fail(e))
                }
            }
        }
        .instrument(span)
        .await
    }

    async fn renew(
        &self,
        request: Request<pb::RenewRequest>,
    ) -> Result<Response<pb::RenewResponse>, Status> {
        let s = &self.0;
        let started = Instant::now();
        let deadline = deadline(&request);
        let req = request.into_inner();
        let span =
            tracing::info_span!("renew", job = %req.job, slot = req.slot_ms, outcome = Empty);
        async move {
            let res = async {
                let spec = validate::renew(&req, &s.defaults)?;
                if !s.store.info().leases {
                    return Err(Error::NoLeases(s.store.info().backend));
                }
                let dead = s.liveness.dead_holders();
                with_deadline(deadline, s.store.renew(&spec, &dead)).await
            }
            .await;
            s.observe("renew", started);
            match res {
                Ok(r) => {
                    tracing::Span::current().record("outcome", "renewed");
                    s.metrics.renewals.inc();
                    Ok(Response::new(pb::RenewResponse {
                        lease_until_ms: r.lease_until_ms,
                        attempt: r.attempt,
                        valid_for_ms: (r.lease_until_ms - r.now_ms).max(0),
                        fencing: r.fencing,
                    }))
                }
                Err(e) => {
                    tracing::Span::current().record("outcome", e.kind());
                    s.note_fenced("renew", &req.job, req.slot_ms, &e);
                    Err(s.fail(e))
                }
            }
        }
        .instrument(span)
        .await
    }

    async fn release(
        &self,
        request: Request<pb::ReleaseRequest>,
    ) -> Result<Response<pb::ReleaseResponse>, Status> {
        let s = &self.0;
        let started = Instant::now();
        let deadline = deadline(&request);
        let req = request.into_inner();
        let span =
            tracing::info_span!("release", job = %req.job, slot = req.slot_ms, outcome = Empty);
        async move {
            let res = async {
                let spec = validate::release(&req)?;
                let dead = s.liveness.dead_holders();
                with_deadline(deadline, s.store.release(&spec, &dead)).await?;
                Ok::<_, Error>(spec)
            }
            .await;
            s.observe("release", started);
            match res {
                Ok(spec) => {
                    tracing::Span::current().record("outcome", "released");
                    s.notify(&spec.job, spec.slot_ms);
                    s.runs
                        .released(spec.job.as_str(), spec.slot_ms, spec.result);
                    Ok(Response::new(pb::ReleaseResponse {}))
                }
                Err(e) => {
                    tracing::Span::current().record("outcome", e.kind());
                    s.note_fenced("release", &req.job, req.slot_ms, &e);
                    Err(s.fail(e))
                }
            }
        }
        .instrument(span)
        .await
    }

    type HoldStream = HoldStream;

    async fn hold(
        &self,
        request: Request<pb::ClaimRequest>,
    ) -> Result<Response<HoldStream>, Status> {
        let s = self.0.clone();
        let started = Instant::now();
        let deadline = deadline(&request);
        let permit = s
            .hold_permit(request.remote_addr().map(|a| a.ip()))
            .map_err(|e| s.fail(e))?;
        let req = request.into_inner();
        let span = tracing::info_span!("hold", job = %req.job, slot = req.slot_ms, outcome = Empty);
        let (v, answer) = async {
            let res = match validate::claim(&req, &s.defaults, &s.holder) {
                Ok(v) => s.claim(&v, deadline).await.map(|a| (v, a)),
                Err(e) => Err(e),
            };
            s.observe("hold", started);
            match res {
                Ok((v, a)) => {
                    tracing::Span::current().record("outcome", a.outcome.as_str());
                    s.count("hold", &v.spec, &a);
                    Ok((v, a))
                }
                Err(e) => {
                    tracing::Span::current().record("outcome", e.kind());
                    Err(s.fail(e))
                }
            }
        }
        .instrument(span.clone())
        .await?;

        let (tx, rx) = mpsc::channel(8);
        let first = pb::HoldEvent {
            kind: pb::HoldEventKind::Claimed as i32,
            claim: Some(validate::answer_pb(&answer, s.store.info().backend)),
            ..Default::default()
        };
        // The channel is fresh and has room: this cannot block.
        let _ = tx.try_send(Ok(first));
        if answer.outcome == Outcome::Won && s.store.info().leases {
            tokio::spawn(
                async move {
                    keep_renewing(s, v.spec, answer.lease_until_ms, tx).await;
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
        Ok(Response::new(
            Box::pin(ReceiverStream::new(rx)) as HoldStream
        ))
    }

    async fn history(
        &self,
        request: Request<pb::HistoryRequest>,
    ) -> Result<Response<pb::HistoryResponse>, Status> {
        let s = &self.0;
        let started = Instant::now();
        let deadline = deadline(&request);
        let req = request.into_inner();
        let span = tracing::info_span!("history", job = %req.job, slot = Empty, outcome = Empty);
        async move {
            let res = async {
                let (job, limit, before) = validate::history(&req)?;
                with_deadline(deadline, s.store.history(&job, limit, before)).await
            }
            .await;
            s.observe("history", started);
            match res {
                Ok(page) => {
                    tracing::Span::current().record("outcome", "ok");
                    let info = s.store.info();
                    Ok(Response::new(pb::HistoryResponse {
                        runs: page.runs.iter().map(validate::run_pb).collect(),
                        backend: info.backend.to_owned(),
                        retention: info.retention.clone(),
                        complete: page.complete,
                        note: page.note.unwrap_or_default(),
                    }))
                }
                Err(e) => {
                    tracing::Span::current().record("outcome", e.kind());
                    Err(s.fail(e))
                }
            }
        }
        .instrument(span)
        .await
    }
}

/// The `Hold` renewal loop: renews every lease/3 while the client listens.
/// A client that goes away without releasing ends the lease at once.
async fn keep_renewing(
    s: Arc<ClaimsState>,
    spec: ClaimSpec,
    mut lease_until_ms: i64,
    tx: mpsc::Sender<Result<pb::HoldEvent, Status>>,
) {
    s.metrics.holds_open.inc();
    let every = Duration::from_millis((spec.lease_ms / 3).max(1) as u64);
    let renew = RenewSpec {
        job: spec.job.clone(),
        slot_ms: spec.slot_ms,
        token: spec.token.clone(),
        lease_ms: spec.lease_ms,
    };
    let mut shutdown = s.shutdown.clone();
    let lost = |reason: &str| pb::HoldEvent {
        kind: pb::HoldEventKind::LostLease as i32,
        reason: reason.to_owned(),
        ..Default::default()
    };
    let mut client_gone = false;
    loop {
        tokio::select! {
            _ = tx.closed() => { client_gone = true; break; }
            _ = shutdown.changed() => break,
            _ = tokio::time::sleep(every) => {}
        }
        let dead = s.liveness.dead_holders();
        match s.store.renew(&renew, &dead).await {
            Ok(r) => {
                s.metrics.renewals.inc();
                lease_until_ms = r.lease_until_ms;
                let ev = pb::HoldEvent {
                    kind: pb::HoldEventKind::Renewed as i32,
                    lease_until_ms: r.lease_until_ms,
                    valid_for_ms: (r.lease_until_ms - r.now_ms).max(0),
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
                s.note_fenced("hold", spec.job.as_str(), spec.slot_ms, &e);
                s.metrics.record_error(&e);
                tracing::info!(reason = e.kind(), "hold lost its lease");
                let _ = tx.send(Ok(lost("fenced"))).await;
                break;
            }
            Err(e) => {
                // Store trouble: keep trying while the lease may still be ours.
                s.metrics.record_error(&e);
                tracing::warn!(error = %e, "hold could not renew");
                if host_now_ms() >= lease_until_ms {
                    let _ = tx.send(Ok(lost("unavailable"))).await;
                    break;
                }
            }
        }
    }
    if client_gone {
        // The worker died without releasing: end the lease now so the next
        // claimer takes the run over. A no-op if it was released.
        match s
            .store
            .end_lease(&spec.job, spec.slot_ms, &spec.token)
            .await
        {
            Ok(true) => {
                tracing::info!("hold stream broke without release; lease ended");
                s.notify(&spec.job, spec.slot_ms);
                s.runs.lease_ended(spec.job.as_str(), spec.slot_ms);
            }
            Ok(false) => {}
            Err(e) => tracing::warn!(error = %e, "could not end the lease of a broken hold"),
        }
    }
    s.metrics.holds_open.dec();
}
