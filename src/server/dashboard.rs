//! The live dashboard on the admin port: a read-only page (`/`, `/ui`) and
//! its server-sent event stream (`/api/v1/events`).
//!
//! The page's assets are embedded in the binary and hold no data, so they
//! are served to anyone who can reach the admin port; the stream sits behind
//! the application bearer token when one is configured (the page sends it as
//! `Authorization: Bearer` from a `fetch()`).
//!
//! The stream is one `snapshot` event (this runtime, the mesh view, the
//! recent runs, the counters), then:
//!
//! * `peer` events from [`crate::mesh::Mesh::watch_with_snapshot`], the stream behind
//!   `WatchPeers` (JOINED, ALIVE, UNREACHABLE, EXPIRED, RESTARTED, LEFT,
//!   each with the runtime's full view);
//! * `run` events from the Claims service's [`RunFeed`] (won, released,
//!   lease_ended, fenced);
//! * a `stats` event every second: claims by outcome and backend, lease
//!   counters, store health (a `ping` at most every [`STORE_CHECK`], shared by
//!   every stream), and the beat ages of the mesh view;
//! * a `: keepalive` comment every [`KEEPALIVE`], so the page can tell a
//!   dead connection from a quiet one.
//!
//! Nothing waits on a client: each stream has a bounded buffer, and a client
//! that lets it fill (or falls behind the mesh or run broadcasts) is dropped;
//! the page reconnects and starts from a fresh snapshot.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use futures::StreamExt;
use serde_json::{json, Value};
use tokio::sync::{broadcast, mpsc, Semaphore};
use tokio_stream::wrappers::ReceiverStream;

use super::admin::AdminState;
use super::mesh_state::peer_json;
use super::metrics::{Metrics, OutcomeLabels};
use super::runs::RunFeed;
use crate::claim::host_now_ms;
use crate::error::Error;
use crate::proto as pb;
use crate::store::DynStore;

const INDEX_HTML: &str = include_str!("dashboard/index.html");
const APP_JS: &str = include_str!("dashboard/app.js");
const APP_CSS: &str = include_str!("dashboard/app.css");

/// Dashboard streams open at once; more are answered 503.
pub const MAX_STREAMS: usize = 64;
/// Frames a stream may have queued before its client counts as too slow.
const CLIENT_BUFFER: usize = 64;
/// How often the counters and beat ages are sent.
const STATS_EVERY: Duration = Duration::from_secs(1);
/// How often a keepalive comment is sent.
pub const KEEPALIVE: Duration = Duration::from_secs(3);
/// The store is pinged at most this often for the dashboard.
pub const STORE_CHECK: Duration = Duration::from_secs(5);
/// A ping that takes longer counts as the store being down.
const PING_TIMEOUT: Duration = Duration::from_secs(2);

/// The page forbids everything it does not need: no inline script, no
/// other origin, no framing.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
    connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; \
    frame-ancestors 'none'";

/// Shared by every dashboard stream of one sidecar.
pub struct Dashboard {
    pub runs: Arc<RunFeed>,
    heartbeat: Duration,
    expiry: Duration,
    streams: Arc<Semaphore>,
    store: Mutex<StoreHealth>,
}

#[derive(Default)]
struct StoreHealth {
    checked: Option<Instant>,
    up: bool,
    error: String,
    pinging: bool,
}

impl Dashboard {
    pub fn new(runs: Arc<RunFeed>, heartbeat: Duration, expiry: Duration) -> Dashboard {
        Dashboard {
            runs,
            heartbeat,
            expiry,
            streams: Arc::new(Semaphore::new(MAX_STREAMS)),
            store: Mutex::new(StoreHealth::default()),
        }
    }

    fn health(&self) -> std::sync::MutexGuard<'_, StoreHealth> {
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The last store check; starts a new one in the background when the
    /// last is older than [`STORE_CHECK`]. Never waits for the store.
    fn store_health(self: &Arc<Self>, store: &DynStore, metrics: &Arc<Metrics>) -> Value {
        let mut h = self.health();
        let stale = h.checked.is_none_or(|t| t.elapsed() >= STORE_CHECK);
        if stale && !h.pinging {
            h.pinging = true;
            let (me, store, metrics) = (self.clone(), store.clone(), metrics.clone());
            tokio::spawn(async move {
                let res = match tokio::time::timeout(PING_TIMEOUT, store.ping()).await {
                    Ok(r) => r.map_err(|e| e.to_string()),
                    Err(_) => Err(format!("no answer within {PING_TIMEOUT:?}")),
                };
                metrics.store_up.set(i64::from(res.is_ok()));
                let mut h = me.health();
                h.checked = Some(Instant::now());
                h.up = res.is_ok();
                h.error = res.err().unwrap_or_default();
                h.pinging = false;
            });
        }
        match h.checked {
            None => json!({ "up": null, "checked_ms_ago": null, "error": "" }),
            Some(t) => json!({
                "up": h.up,
                "checked_ms_ago": t.elapsed().as_millis() as u64,
                "error": h.error,
            }),
        }
    }
}

pub fn routes() -> Router<AdminState> {
    Router::new()
        .route("/", get(index))
        .route("/ui", get(index))
        .route("/ui/app.js", get(app_js))
        .route("/ui/app.css", get(app_css))
        .route("/api/v1/events", get(events))
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
            (header::CONTENT_SECURITY_POLICY, CSP),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::REFERRER_POLICY, "no-referrer"),
            (header::X_FRAME_OPTIONS, "DENY"),
        ],
        body,
    )
        .into_response()
}

async fn index() -> Response {
    asset("text/html; charset=utf-8", INDEX_HTML)
}

async fn app_js() -> Response {
    asset("text/javascript; charset=utf-8", APP_JS)
}

async fn app_css() -> Response {
    asset("text/css; charset=utf-8", APP_CSS)
}

/// One server-sent event; `data` is compact JSON (no newlines).
fn frame(event: &str, data: &str) -> String {
    format!("event: {event}\ndata: {data}\n\n")
}

fn kind_name(kind: i32) -> &'static str {
    pb::PeerEventKind::try_from(kind)
        .map(|k| k.as_str_name().trim_start_matches("PEER_EVENT_KIND_"))
        .unwrap_or("?")
}

const OUTCOMES: [&str; 6] = ["WON", "LOST", "RUNNING", "DONE", "LATE", "OVERLAP"];

/// The counters, the store health and the beat ages of the mesh view.
fn stats(s: &AdminState) -> Value {
    let backend = s.store.info().backend;
    let claims: Vec<Value> = OUTCOMES
        .iter()
        .map(|&outcome| {
            let n = s
                .metrics
                .claims
                .get(&OutcomeLabels { outcome, backend })
                .map(|c| c.get())
                .unwrap_or(0);
            json!({ "outcome": outcome, "backend": backend, "n": n })
        })
        .collect();
    let list = s.mesh.list();
    let beats: Vec<Value> = list
        .self_
        .iter()
        .chain(list.peers.iter())
        .map(|p| json!([p.node, p.beat, p.beat_age_ms]))
        .collect();
    json!({
        "now_ms": host_now_ms(),
        "claims": claims,
        "takeovers": s.metrics.takeovers.get(),
        "fenced": s.metrics.fenced.get(),
        "renewals": s.metrics.renewals.get(),
        "holds_open": s.metrics.holds_open.get(),
        "store": s.dashboard.store_health(&s.store, &s.metrics),
        "beats": beats,
        // Mesh misconfigurations: a twin of this runtime, peers on another store.
        "store_identity": list.store_identity,
        "duplicate_node_key": list.duplicate_node_key,
        "duplicate_instance": list.duplicate_instance,
        "refused": list.refused.iter().map(|r| json!({
            "node": r.node, "address": r.address, "reason": r.reason,
            "store_identity": r.store_identity,
        })).collect::<Vec<_>>(),
    })
}

fn unauthorized() -> Response {
    let mut resp = Error::Unauthenticated.http_response("unauthenticated\n");
    resp.headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    resp
}

async fn events(State(s): State<AdminState>, headers: HeaderMap) -> Response {
    let md = tonic::metadata::MetadataMap::from_headers(headers);
    if s.auth.check(&md).is_err() {
        return unauthorized();
    }
    let Ok(permit) = s.dashboard.streams.clone().try_acquire_owned() else {
        let text = format!("{MAX_STREAMS} dashboard streams are open already");
        return Error::ResourceExhausted(text.clone()).http_response(text + "\n");
    };
    let (tx, rx) = mpsc::channel::<String>(CLIENT_BUFFER);
    let (peers, watch) = s.mesh.watch_with_snapshot(true);
    let (runs, run_rx) = s.dashboard.runs.subscribe();
    let snapshot = json!({
        "node": s.mesh.node(),
        "backend": s.store.info().backend,
        "heartbeat_ms": s.dashboard.heartbeat.as_millis() as u64,
        "expiry_ms": s.dashboard.expiry.as_millis() as u64,
        "keepalive_ms": KEEPALIVE.as_millis() as u64,
        "self": peer_json(&s.mesh.self_peer(Instant::now())),
        "peers": peers.iter().map(peer_json).collect::<Vec<_>>(),
        "runs": runs,
        "stats": stats(&s),
    });
    // The channel is fresh: the snapshot always fits.
    let _ = tx.try_send(frame("snapshot", &snapshot.to_string()));
    tokio::spawn(async move {
        pump(&s, watch, run_rx, &tx).await;
        drop(permit);
    });
    let body = Body::from_stream(ReceiverStream::new(rx).map(Ok::<_, Infallible>));
    let mut resp = Response::new(body);
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    resp
}

/// Feeds one client until it goes away, falls behind, or the mesh stops.
async fn pump(
    s: &AdminState,
    watch: impl tokio_stream::Stream<Item = Result<pb::PeerEvent, tonic::Status>>,
    mut runs: broadcast::Receiver<Arc<str>>,
    tx: &mpsc::Sender<String>,
) {
    let mut watch = std::pin::pin!(watch);
    let start = tokio::time::Instant::now();
    let mut stats_every = tokio::time::interval_at(start + STATS_EVERY, STATS_EVERY);
    let mut keepalive = tokio::time::interval_at(start + KEEPALIVE, KEEPALIVE);
    for t in [&mut stats_every, &mut keepalive] {
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    }
    loop {
        let out = tokio::select! {
            ev = watch.next() => match ev {
                Some(Ok(ev)) => {
                    let peer = ev.peer.as_ref().map(peer_json);
                    let data = json!({ "kind": kind_name(ev.kind), "peer": peer });
                    frame("peer", &data.to_string())
                }
                // Fell behind the mesh, or the mesh stopped.
                Some(Err(_)) | None => return,
            },
            ev = runs.recv() => match ev {
                Ok(json) => frame("run", &json),
                Err(_) => return,
            },
            _ = stats_every.tick() => frame("stats", &stats(s).to_string()),
            _ = keepalive.tick() => ": keepalive\n\n".to_owned(),
            _ = tx.closed() => return,
        };
        if tx.try_send(out).is_err() {
            tracing::debug!("dropped a dashboard stream: the client is gone or too slow");
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::claim::*;
    use crate::mesh::{Identity, Mesh, MeshConfig};
    use crate::server::auth::Auth;
    use crate::store::{self, StoreOptions};
    use axum::http::StatusCode;

    async fn state(dir: &std::path::Path) -> (AdminState, tokio::sync::watch::Sender<bool>) {
        let id = Arc::new(Identity::load_or_create(dir).unwrap());
        let (stop_tx, stop) = tokio::sync::watch::channel(false);
        let (changed, _) = tokio::sync::watch::channel(0u64);
        let mesh = Mesh::start(
            id,
            MeshConfig {
                heartbeat: Duration::from_millis(100),
                expiry: Duration::from_millis(1000),
                advertise: "127.0.0.1:1".into(),
                labels: Default::default(),
                secret: None,
                data_dir: dir.to_owned(),
                peers: vec![],
                peer_dns: vec![],
                max_runtimes: 16,
                max_frame_bytes: 1 << 20,
                watch_buffer: 16,
                max_links_per_peer: 4,
                max_links: 8,
                forget: Duration::from_secs(300),
                tls: None,
                bind_ip: None,
                store_identity: String::new(),
            },
            stop,
            changed,
        );
        let url = format!("sqlite://{}", dir.join("a.db").display());
        let store = store::open(&url, &StoreOptions::default()).await.unwrap();
        let runs = Arc::new(RunFeed::default());
        let s = AdminState {
            store,
            metrics: Arc::new(Metrics::default()),
            mesh,
            auth: Auth::default(),
            dashboard: Arc::new(Dashboard::new(
                runs,
                Duration::from_millis(100),
                Duration::from_millis(1000),
            )),
        };
        (s, stop_tx)
    }

    fn won(feed: &RunFeed, slot_ms: i64) {
        let spec = ClaimSpec {
            job: Job::parse("busy").unwrap(),
            slot_ms,
            token: Token::generate(),
            holder: Holder {
                node: "n".into(),
                instance: 1,
            },
            lease_ms: 1000,
            max_late_ms: 1000,
            overlap: Overlap::Allow,
            max_attempts: 3,
        };
        let a = ClaimAnswer {
            attempt: 1,
            fencing: 1,
            ..ClaimAnswer::bare(Outcome::Won, 1, None)
        };
        feed.won("claim", &spec, &a);
    }

    #[tokio::test]
    async fn a_client_that_does_not_read_is_dropped_and_never_holds_anyone_up() {
        let dir = tempfile::tempdir().unwrap();
        let (s, _stop) = state(dir.path()).await;
        // Open a stream and never read its body.
        let resp = events(State(s.clone()), HeaderMap::new()).await;
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(s.dashboard.streams.available_permits(), MAX_STREAMS - 1);
        // Claims keep flowing without waiting for it...
        let started = Instant::now();
        for slot in 0..(CLIENT_BUFFER as i64 * 2) {
            won(&s.dashboard.runs, slot);
            tokio::task::yield_now().await;
        }
        assert!(started.elapsed() < Duration::from_secs(2));
        // ...and once its buffer is full it is dropped, freeing its slot.
        let end = Instant::now() + Duration::from_secs(5);
        while s.dashboard.streams.available_permits() < MAX_STREAMS {
            assert!(Instant::now() < end, "the slow client was never dropped");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        drop(resp);
    }

    #[tokio::test]
    async fn streams_are_bounded_and_need_the_token() {
        let dir = tempfile::tempdir().unwrap();
        let (mut s, _stop) = state(dir.path()).await;
        s.auth = Auth::new(Some("t0ken".into()));
        let mut headers = HeaderMap::new();
        let resp = events(State(s.clone()), headers.clone()).await;
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
        headers.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer t0ken"),
        );
        let mut open = Vec::new();
        for _ in 0..MAX_STREAMS {
            let resp = events(State(s.clone()), headers.clone()).await;
            assert_eq!(resp.status(), StatusCode::OK);
            open.push(resp);
        }
        let resp = events(State(s.clone()), headers.clone()).await;
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        // A client that goes away frees its slot.
        open.pop();
        let end = Instant::now() + Duration::from_secs(5);
        while s.dashboard.streams.available_permits() == 0 {
            assert!(Instant::now() < end, "a closed stream kept its slot");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}
