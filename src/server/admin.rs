//! The admin HTTP server: `/healthz`, `/readyz`, `/metrics`,
//! `/api/v1/mesh/state`, and the dashboard (`/`, `/ui`, `/api/v1/events`;
//! see [`super::dashboard`]).

use std::sync::Arc;

use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use super::auth::Auth;
use super::dashboard::{self, Dashboard};
use super::metrics::Metrics;
use crate::error::Error;
use crate::mesh::Mesh;
use crate::store::DynStore;

#[derive(Clone)]
pub struct AdminState {
    pub store: DynStore,
    pub metrics: Arc<Metrics>,
    pub mesh: Arc<Mesh>,
    /// `/api/*` sits behind the application bearer token when one is set.
    pub auth: Auth,
    pub dashboard: Arc<Dashboard>,
}

pub fn router(state: AdminState) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/api/v1/mesh/state", get(mesh_state))
        .merge(dashboard::routes())
        .with_state(state)
}

/// How long `/readyz` waits for the store's answer before it says why not.
const READY_PING_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

/// `ready`, or `not ready: <why>` (the store's error, or that it did not
/// answer within 3 s) with status 503 ([`Error::Unavailable`]).
async fn readyz(State(s): State<AdminState>) -> Response {
    let backend = s.store.info().backend;
    match tokio::time::timeout(READY_PING_TIMEOUT, s.store.ping()).await {
        Ok(Ok(())) => {
            s.metrics.store_up.set(1);
            // Linked to a runtime on another store: the mesh is split, and
            // claims through one can be won again through the other.
            let refused = s.mesh.refused_peers(std::time::Instant::now());
            if refused.is_empty() {
                return "ready\n".into_response();
            }
            let mut text = String::from("not ready:\n");
            for r in refused {
                text.push_str(&format!(
                    "{}: peer {} at {} claims in store {}, this sidecar in store {}\n",
                    r.reason,
                    r.node,
                    r.address,
                    r.store_identity,
                    s.mesh.store_identity()
                ));
            }
            Error::Unavailable("peers claim in another store".into()).http_response(text)
        }
        Ok(Err(e)) => {
            s.metrics.store_up.set(0);
            let text = format!("not ready: {backend}: {e}\n");
            Error::Unavailable(e.to_string()).http_response(text)
        }
        Err(_) => {
            s.metrics.store_up.set(0);
            let text = format!(
                "not ready: {backend}: the store did not answer a ping within {}s\n",
                READY_PING_TIMEOUT.as_secs()
            );
            Error::Unavailable(text.clone()).http_response(text)
        }
    }
}

async fn mesh_state(
    State(s): State<AdminState>,
    headers: axum::http::HeaderMap,
) -> axum::response::Response {
    let md = tonic::metadata::MetadataMap::from_headers(headers);
    if s.auth.check(&md).is_err() {
        return Error::Unauthenticated.http_response("unauthenticated\n");
    }
    axum::Json(super::mesh_state::state_json(&s.mesh)).into_response()
}

/// Prometheus text format 0.0.4 by default; OpenMetrics when the `Accept`
/// header asks for it (as Prometheus does).
async fn metrics(State(s): State<AdminState>, headers: axum::http::HeaderMap) -> impl IntoResponse {
    s.metrics
        .sync_mesh(&super::metrics::MeshCounters::of(&s.mesh));
    let accept = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    if super::metrics::wants_openmetrics(accept) {
        (
            [(
                header::CONTENT_TYPE,
                super::metrics::OPENMETRICS_CONTENT_TYPE,
            )],
            s.metrics.render(),
        )
    } else {
        (
            [(header::CONTENT_TYPE, super::metrics::TEXT_CONTENT_TYPE)],
            s.metrics.render_text(),
        )
    }
}
