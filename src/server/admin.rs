//! The admin HTTP server: `/healthz`, `/readyz`, `/metrics`,
//! `/api/v1/mesh/state`, and the dashboard (`/`, `/ui`, `/api/v1/events`;
//! see [`super::dashboard`]).

use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;

use super::auth::Auth;
use super::dashboard::{self, Dashboard};
use super::metrics::Metrics;
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

async fn readyz(State(s): State<AdminState>) -> impl IntoResponse {
    match s.store.ping().await {
        Ok(()) => {
            s.metrics.store_up.set(1);
            // Linked to a runtime on another store: the mesh is split, and
            // claims through one can be won again through the other.
            let refused = s.mesh.refused_peers(std::time::Instant::now());
            if refused.is_empty() {
                return (StatusCode::OK, "ready\n".to_string());
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
            (StatusCode::SERVICE_UNAVAILABLE, text)
        }
        Err(e) => {
            s.metrics.store_up.set(0);
            (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {e}\n"))
        }
    }
}

async fn mesh_state(
    State(s): State<AdminState>,
    headers: axum::http::HeaderMap,
) -> axum::response::Response {
    let md = tonic::metadata::MetadataMap::from_headers(headers);
    if s.auth.check(&md).is_err() {
        return (StatusCode::UNAUTHORIZED, "unauthenticated\n").into_response();
    }
    axum::Json(s.mesh.state_json()).into_response()
}

async fn metrics(State(s): State<AdminState>) -> impl IntoResponse {
    s.metrics.sync_mesh(&s.mesh.counters());
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        s.metrics.render(),
    )
}
