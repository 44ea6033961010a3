//! Prometheus metrics, in one registry per sidecar (no global state, so
//! several in-process servers in tests do not mix their figures).

use std::sync::Mutex;

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub outcome: &'static str,
    pub backend: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RpcLabels {
    pub rpc: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    pub state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: &'static str,
}

pub struct Metrics {
    registry: Mutex<Registry>,
    pub claims: Family<OutcomeLabels, Counter>,
    pub rpc_seconds: Family<RpcLabels, Histogram>,
    pub renewals: Counter,
    pub takeovers: Counter,
    pub fenced: Counter,
    pub errors: Family<KindLabels, Counter>,
    pub holds_open: Gauge,
    pub store_up: Gauge,
    pub peers: Family<StateLabels, Gauge>,
    pub links: Family<StateLabels, Gauge>,
    pub beats: Counter,
    pub refused: Family<ReasonLabels, Counter>,
    pub duplicate_node_key: Gauge,
}

fn latency_histogram() -> Histogram {
    // 50 µs .. ~3.3 s
    Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
        0.000_05, 2.0, 17,
    ))
}

impl Default for Metrics {
    fn default() -> Self {
        let mut r = Registry::with_prefix("anarchon");
        let claims = Family::<OutcomeLabels, Counter>::default();
        r.register(
            "claims",
            "Claims answered, by outcome and backend",
            claims.clone(),
        );
        let rpc_seconds = Family::<RpcLabels, Histogram>::new_with_constructor(
            latency_histogram as fn() -> Histogram,
        );
        r.register("rpc_duration_seconds", "RPC latency", rpc_seconds.clone());
        let renewals = Counter::default();
        r.register("renewals", "Leases renewed", renewals.clone());
        let takeovers = Counter::default();
        r.register("takeovers", "Runs won with attempt > 1", takeovers.clone());
        let fenced = Counter::default();
        r.register("fenced", "Renew/Release refused as fenced", fenced.clone());
        let errors = Family::<KindLabels, Counter>::default();
        r.register("errors", "RPC errors by kind", errors.clone());
        let holds_open = Gauge::default();
        r.register("holds_open", "Open Hold streams", holds_open.clone());
        let store_up = Gauge::default();
        r.register(
            "store_up",
            "1 when the last store check succeeded",
            store_up.clone(),
        );
        let peers = Family::<StateLabels, Gauge>::default();
        r.register("peers", "Known runtimes by state", peers.clone());
        let links = Family::<StateLabels, Gauge>::default();
        r.register("links", "Sync links by state", links.clone());
        let beats = Counter::default();
        r.register(
            "beats_received",
            "Newer marks accepted from peers",
            beats.clone(),
        );
        let refused = Family::<ReasonLabels, Counter>::default();
        r.register(
            "mesh_refused",
            "Marks, frames and hellos refused, by reason",
            refused.clone(),
        );
        let duplicate_node_key = Gauge::default();
        r.register(
            "mesh_duplicate_node_key",
            "1 when another live process runs with this sidecar's node key",
            duplicate_node_key.clone(),
        );
        Metrics {
            registry: Mutex::new(r),
            duplicate_node_key,
            peers,
            links,
            beats,
            refused,
            claims,
            rpc_seconds,
            renewals,
            takeovers,
            fenced,
            errors,
            holds_open,
            store_up,
        }
    }
}

impl Metrics {
    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if let Ok(r) = self.registry.lock() {
            let _ = encode(&mut out, &r);
        }
        out
    }

    /// Brings the mesh figures up to date (called at scrape time).
    pub fn sync_mesh(&self, c: &crate::mesh::node::MeshCounters) {
        for state in ["ALIVE", "UNREACHABLE", "EXPIRED", "LEFT"] {
            let n = c.peers.get(state).copied().unwrap_or(0);
            self.peers.get_or_create(&StateLabels { state }).set(n);
        }
        for state in ["CONNECTED", "UNREACHABLE"] {
            let n = c.links.get(state).copied().unwrap_or(0);
            self.links.get_or_create(&StateLabels { state }).set(n);
        }
        self.beats.inc_by(c.beats.saturating_sub(self.beats.get()));
        self.duplicate_node_key.set(i64::from(c.duplicate_node_key));
        for (reason, n) in &c.drops {
            let ctr = self.refused.get_or_create(&ReasonLabels { reason });
            ctr.inc_by(n.saturating_sub(ctr.get()));
        }
    }

    pub fn record_error(&self, e: &crate::Error) {
        if matches!(e, crate::Error::Fenced(_)) {
            self.fenced.inc();
        }
        self.errors
            .get_or_create(&KindLabels { kind: e.kind() })
            .inc();
    }
}
