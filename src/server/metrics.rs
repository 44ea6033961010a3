//! Prometheus metrics, in one registry per sidecar (no global state, so
//! several in-process servers in tests do not mix their figures).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Instant;

use prometheus_client::encoding::text::encode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::mesh_state::link_state;
use crate::mesh::Mesh;
use crate::proto as pb;

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
    pub runtime_workers: Gauge,
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
        let runtime_workers = Gauge::default();
        r.register(
            "runtime_workers",
            "Worker threads of the sidecar's async runtime (worker_threads)",
            runtime_workers.clone(),
        );
        Metrics {
            registry: Mutex::new(r),
            duplicate_node_key,
            runtime_workers,
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

/// The content type of [`Metrics::render`].
pub const OPENMETRICS_CONTENT_TYPE: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The content type of [`Metrics::render_text`].
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Whether an `Accept` header asks for OpenMetrics (Prometheus itself does;
/// `curl`, `promtool` and most client libraries' parsers want text 0.0.4).
pub fn wants_openmetrics(accept: &str) -> bool {
    accept.split(',').any(|part| {
        let mut params = part.split(';').map(str::trim);
        let media = params.next().unwrap_or_default();
        let refused = params.any(|p| {
            p.strip_prefix("q=")
                .and_then(|q| q.parse::<f32>().ok())
                .is_some_and(|q| q <= 0.0)
        });
        media.eq_ignore_ascii_case("application/openmetrics-text") && !refused
    })
}

/// OpenMetrics text → Prometheus text format 0.0.4.
///
/// The two differ where it matters to a 0.0.4 parser: an OpenMetrics counter
/// family `x` has samples `x_total`, while in 0.0.4 the `# HELP`/`# TYPE`
/// lines must name the sample (`x_total`), or parsers see an untyped
/// `x_total` without help beside an empty counter `x`. `# UNIT` and `# EOF`
/// do not exist in 0.0.4.
pub fn openmetrics_to_text(om: &str) -> String {
    let counters: std::collections::HashSet<&str> = om
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(om.len());
    for line in om.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let renamed = ["# HELP ", "# TYPE "].iter().find_map(|p| {
            let rest = line.strip_prefix(p)?;
            let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
            counters
                .contains(name)
                .then(|| format!("{p}{name}_total {tail}"))
        });
        match renamed {
            Some(l) => out.push_str(l.trim_end()),
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// Mesh figures for the metrics.
pub struct MeshCounters {
    pub peers: BTreeMap<&'static str, i64>,
    pub links: BTreeMap<&'static str, i64>,
    pub drops: BTreeMap<&'static str, u64>,
    pub beats: u64,
    /// Another live process runs with our node key.
    pub duplicate_node_key: bool,
}

impl MeshCounters {
    /// The mesh's figures now: runtimes by state, links by state (with the
    /// configured addresses that never answered counted `UNREACHABLE`),
    /// refusals by reason, beats accepted.
    pub fn of(mesh: &Mesh) -> MeshCounters {
        let now = Instant::now();
        let never = mesh.unreachable_peers(now).len() as i64;
        let mut peers: BTreeMap<&'static str, i64> = BTreeMap::new();
        for p in mesh.table_peers(now) {
            let s = pb::PeerState::try_from(p.state)
                .map(|s| s.as_str_name())
                .unwrap_or("PEER_STATE_UNSPECIFIED");
            *peers
                .entry(s.trim_start_matches("PEER_STATE_"))
                .or_default() += 1;
        }
        let expiry = mesh.config().expiry;
        let mut links: BTreeMap<&'static str, i64> = BTreeMap::new();
        for l in mesh.link_status(now) {
            *links.entry(link_state(&l, expiry)).or_default() += 1;
        }
        if never > 0 {
            *links.entry("UNREACHABLE").or_default() += never;
        }
        let stats = mesh.table_stats();
        MeshCounters {
            peers,
            links,
            drops: stats.drops.iter().map(|(r, n)| (r.as_str(), *n)).collect(),
            beats: stats.beats_accepted,
            duplicate_node_key: stats.duplicate_node_key,
        }
    }
}

impl Metrics {
    /// The Prometheus text exposition, format 0.0.4.
    pub fn render_text(&self) -> String {
        openmetrics_to_text(&self.render())
    }

    /// The OpenMetrics text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if let Ok(r) = self.registry.lock() {
            let _ = encode(&mut out, &r);
        }
        out
    }

    /// Brings the mesh figures up to date (called at scrape time).
    pub fn sync_mesh(&self, c: &MeshCounters) {
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
        if matches!(e, crate::Error::Fenced(f) if *f != crate::error::FenceReason::NotHolder) {
            self.fenced.inc();
        }
        self.errors
            .get_or_create(&KindLabels { kind: e.kind() })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_format_names_counters_by_their_samples() {
        let m = Metrics::default();
        m.takeovers.inc();
        m.claims
            .get_or_create(&OutcomeLabels {
                outcome: "WON",
                backend: "sqlite",
            })
            .inc();
        let om = m.render();
        assert!(om.contains("# TYPE anarchon_takeovers counter"), "{om}");
        assert!(om.ends_with("# EOF\n"), "{om}");
        let text = m.render_text();
        assert!(
            text.contains("# HELP anarchon_takeovers_total Runs won"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE anarchon_takeovers_total counter"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE anarchon_claims_total counter"),
            "{text}"
        );
        assert!(text.contains("anarchon_takeovers_total 1"), "{text}");
        assert!(text.contains("# TYPE anarchon_holds_open gauge"), "{text}");
        assert!(!text.contains("# EOF"), "{text}");
    }

    #[test]
    fn accept_header_negotiation() {
        assert!(!wants_openmetrics(""));
        assert!(!wants_openmetrics("*/*"));
        assert!(!wants_openmetrics("text/plain;version=0.0.4"));
        assert!(wants_openmetrics(
            "application/openmetrics-text; version=1.0.0"
        ));
        assert!(wants_openmetrics(
            "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
        ));
        assert!(!wants_openmetrics(
            "application/openmetrics-text;q=0,text/plain"
        ));
    }
}
