//! `anarchon bench`: the sidecar path against the store's raw atomic step
//! (and optionally etcd), in one run on the same machine.
//!
//! * **raw**: N tasks call `Store::claim` directly (the same atomic step the
//!   sidecar runs, without gRPC). On SQLite and PostgreSQL also **raw
//!   1/commit**: the same with group commit off (`max_batch=1`), one claim
//!   per transaction — the "raw single-claim step".
//! * **sidecar**: a real `anarchon serve` child process on loopback ports
//!   (start-to-ready time, RSS idle and under load), N gRPC clients in this
//!   process, one connection each, calling `Claim`.
//! * **etcd** (`--against etcd`, cargo feature `etcd`): an etcd 3.4 the bench
//!   starts itself, the same exactly-once claim as one create-if-absent Txn.
//! * **aged** (`--age N`): the store is given N finished runs with retention
//!   pruning on, then raw and sidecar are measured again.
//!
//! Every claim is for a new slot, so every claim is a write (the expensive
//! path). Prints claims/s and p50/p99/max latency, or one JSON object.
//!
//! Layout: [`process`] child-process guard and memory readings, [`sidecar`]
//! the sidecar path, `etcd` the etcd path, [`age`] aging a store.

mod age;
#[cfg(feature = "etcd")]
mod etcd;
mod process;
mod sidecar;
pub mod transport;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;
use clap::Args;
use hdrhistogram::Histogram;
use serde_json::json;

use crate::claim::*;
use crate::store::{self, DynStore, StoreOptions};
use process::{mib, ProcFigures};
use transport::Transport;

/// What `--against etcd` says in a build without the `etcd` feature.
pub const NO_ETCD: &str = "this anarchon was built without etcd support; rebuild with `--features etcd` \
(e.g. `cargo build --release --features etcd`; the build needs protoc: apt-get install protobuf-compiler) \
and install etcd (apt-get install etcd-server)";

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Backend URL [default: SQLite in a temporary directory].
    #[arg(long, value_name = "URL")]
    pub backend: Option<String>,
    /// Concurrent clients.
    #[arg(long, default_value_t = 16)]
    pub clients: usize,
    /// Seconds per path.
    #[arg(long, default_value_t = 5.0)]
    pub seconds: f64,
    /// What to compare the sidecar with: the raw store step, the raw step and
    /// etcd (needs the `etcd` cargo feature and an `etcd` binary), or nothing.
    #[arg(long, default_value = "raw", value_parser = ["raw", "etcd", "none"])]
    pub against: String,
    /// How the sidecar runs: a real `anarchon serve` child process, or inside
    /// the bench's own process (no memory figures).
    #[arg(long, default_value = "process", value_parser = ["process", "in-process"])]
    pub sidecar: String,
    /// How the clients reach the sidecar and etcd: loopback TCP, or a Unix
    /// socket (the sidecar's `--listen-unix`, etcd's `unix://` listener).
    #[arg(long, value_enum, default_value_t = Transport::Tcp)]
    pub transport: Transport,
    /// Age the store with N finished runs, then measure raw and sidecar again.
    #[arg(long, value_name = "N")]
    pub age: Option<u64>,
    /// Retention of the pruning that runs while aging and after it (the
    /// shortest a sidecar allows: max-late 60 s + 1 h).
    #[arg(long, value_name = "DURATION", default_value = "61m", value_parser = crate::duration::parse_ms)]
    pub age_retention_ms: u64,
    /// How often that pruning runs (as the sidecar does).
    #[arg(long, value_name = "DURATION", default_value = "60s", value_parser = crate::duration::parse_ms)]
    pub age_prune_every_ms: u64,
    /// Concurrent tasks that create the aged runs.
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub age_tasks: usize,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// The figures of one path.
#[derive(Debug, Clone)]
pub struct PathFigures {
    pub claims: u64,
    pub errors: u64,
    pub seconds: f64,
    pub hist: Histogram<u64>,
}

impl PathFigures {
    pub fn per_s(&self) -> f64 {
        self.claims as f64 / self.seconds
    }
    fn ms(&self, q: f64) -> f64 {
        self.hist.value_at_quantile(q) as f64 / 1000.0
    }
    fn json(&self) -> serde_json::Value {
        json!({
            "claims_per_s": round(self.per_s()),
            "claims": self.claims,
            "errors": self.errors,
            "p50_ms": round(self.ms(0.5)),
            "p99_ms": round(self.ms(0.99)),
            "max_ms": round(self.hist.max() as f64 / 1000.0),
        })
    }
}

fn round(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// An empty latency histogram: microseconds, up to 60 s, 3 significant digits.
fn new_hist() -> anyhow::Result<Histogram<u64>> {
    Ok(Histogram::new_with_bounds(1, 60_000_000, 3)?)
}

/// Runs `clients` copies of `one` for `seconds`; `one(client, n)` does one claim.
async fn drive<F, Fut>(clients: usize, seconds: f64, one: F) -> anyhow::Result<PathFigures>
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = bool> + Send,
{
    let one = Arc::new(one);
    let empty = new_hist()?;
    let end = Instant::now() + Duration::from_secs_f64(seconds);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..clients {
        let one = one.clone();
        let mut h = empty.clone();
        tasks.push(tokio::spawn(async move {
            let (mut ok, mut err) = (0u64, 0u64);
            let mut n = 0u64;
            while Instant::now() < end {
                let t = Instant::now();
                if one(c, n).await {
                    ok += 1;
                    let _ = h.record(t.elapsed().as_micros().max(1) as u64);
                } else {
                    err += 1;
                }
                n += 1;
            }
            (ok, err, h)
        }));
    }
    let mut fig = PathFigures {
        claims: 0,
        errors: 0,
        seconds: 0.0,
        hist: empty,
    };
    for t in tasks {
        if let Ok((ok, err, h)) = t.await {
            fig.claims += ok;
            fig.errors += err;
            let _ = fig.hist.add(h);
        }
    }
    fig.seconds = started.elapsed().as_secs_f64();
    Ok(fig)
}

/// A bench claim: the sidecar's default lease, lateness and attempts.
fn bench_spec(job: Job, slot_ms: i64, holder: &Holder) -> ClaimSpec {
    ClaimSpec {
        job,
        slot_ms,
        token: Token::generate(),
        holder: holder.clone(),
        lease_ms: 30_000,
        max_late_ms: 60_000,
        overlap: Overlap::Allow,
        max_attempts: 3,
    }
}

fn spec_for(run: &str, c: usize, n: u64, base: i64, holder: &Holder) -> Option<ClaimSpec> {
    let job = Job::parse(&format!("bench-{run}-{c}")).ok()?;
    Some(bench_spec(job, base + n as i64, holder))
}

/// Measures the raw store step on an open store.
pub async fn raw(store: &DynStore, clients: usize, seconds: f64) -> anyhow::Result<PathFigures> {
    let store = store.clone();
    let base = host_now_ms();
    let run = format!("{:x}", rand::random::<u32>());
    let holder = Holder {
        node: "bench".into(),
        instance: 1,
    };
    drive(clients, seconds, move |c, n| {
        let (store, run, holder) = (store.clone(), run.clone(), holder.clone());
        async move {
            match spec_for(&run, c, n, base, &holder) {
                Some(s) => matches!(
                    store.claim(&s, &DeadHolders::none()).await,
                    Ok(a) if a.outcome == Outcome::Won
                ),
                None => false,
            }
        }
    })
    .await
}

/// The URL of the same store with its group commit off, for the raw
/// single-claim step (one claim per transaction, as many at once as the
/// store allows): `max_batch=1`, and for PostgreSQL every pool connection
/// in use. `None` for a store without group commit, or a URL that sets
/// `max_batch` itself.
pub fn single_claim_url(url: &str) -> Option<String> {
    if url.contains("max_batch=") {
        return None;
    }
    let sep = if url.contains('?') { '&' } else { '?' };
    match store::Backend::parse(url).ok()? {
        store::Backend::Sqlite { .. } => Some(format!("{url}{sep}max_batch=1")),
        store::Backend::Postgres(t) => Some(format!(
            "{url}{sep}max_batch=1&batches_in_flight={}",
            t.max_connections
        )),
        _ => None,
    }
}

/// The 1-minute load average, as a record of how busy the machine was.
fn loadavg() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The etcd path: start a server, measure, stop it.
#[cfg(feature = "etcd")]
async fn measure_etcd(
    dir: &std::path::Path,
    transport: Transport,
    clients: usize,
    seconds: f64,
) -> anyhow::Result<(PathFigures, ProcFigures)> {
    let mut server = etcd::start(dir, transport).await?;
    let fig = server.measure(clients, seconds).await?;
    Ok((fig, server.figures.clone()))
}

#[cfg(not(feature = "etcd"))]
async fn measure_etcd(
    _dir: &std::path::Path,
    _transport: Transport,
    _clients: usize,
    _seconds: f64,
) -> anyhow::Result<(PathFigures, ProcFigures)> {
    bail!(NO_ETCD)
}

/// Everything one run measured.
struct Report {
    backend: &'static str,
    clients: usize,
    seconds: f64,
    mode: String,
    transport: Transport,
    raw: Option<PathFigures>,
    /// The raw step with one claim per transaction (SQLite, PostgreSQL).
    raw_single: Option<PathFigures>,
    sidecar: PathFigures,
    proc: ProcFigures,
    etcd: Option<(PathFigures, ProcFigures)>,
    aged: Option<AgedReport>,
    load: (Option<f64>, Option<f64>),
}

struct AgedReport {
    aged: age::Aged,
    raw: PathFigures,
    sidecar: PathFigures,
}

/// Resolves on Ctrl-C; never, if the handler cannot be installed.
async fn interrupted() {
    if tokio::signal::ctrl_c().await.is_err() {
        std::future::pending::<()>().await;
    }
}

pub async fn bench(a: BenchArgs) -> ExitCode {
    // Ctrl-C drops the run, and with it every child process it started.
    let r = tokio::select! {
        r = bench_inner(&a) => r,
        _ = interrupted() => Err(anyhow::anyhow!("interrupted")),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("anarchon bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn bench_inner(a: &BenchArgs) -> anyhow::Result<()> {
    if a.against == "etcd" && !cfg!(feature = "etcd") {
        bail!(NO_ETCD);
    }
    if !(a.seconds > 0.0 && a.seconds.is_finite()) {
        bail!("--seconds must be a positive number");
    }
    let tmp = tempfile::tempdir()?;
    let url = match &a.backend {
        Some(u) => u.clone(),
        None => format!("sqlite://{}", tmp.path().join("bench.db").display()),
    };
    let backend = store::Backend::parse(&url)?.name();
    let clients = a.clients.max(1);
    let transport = a.transport;
    let load_start = loadavg();

    let mut store = if a.against != "none" || a.age.is_some() {
        Some(store::open(&url, &StoreOptions::default()).await?)
    } else {
        None
    };
    let raw_fig = match (&store, a.against.as_str()) {
        (Some(s), "raw" | "etcd") => Some(raw(s, clients, a.seconds).await?),
        _ => None,
    };
    // The same step with one claim per transaction (no group commit), on
    // the stores that have one: what the sidecar's ratio to "the raw
    // single-claim step" is measured against.
    let single_fig = match (single_claim_url(&url), a.against.as_str()) {
        (Some(u), "raw" | "etcd") => {
            let single = store::open(&u, &StoreOptions::default()).await?;
            Some(raw(&single, clients, a.seconds).await?)
        }
        _ => None,
    };
    if a.age.is_none() {
        store = None;
    }

    let dir = tmp.path().join("sidecar");
    let mut sc = if a.sidecar == "process" {
        sidecar::spawn(&url, &dir, transport).await?
    } else {
        sidecar::in_process(&url, &dir, transport).await?
    };
    let sc_fig = sc.measure(clients, a.seconds).await?;
    let fresh_cpu = (
        sc.figures.server_cpu_us,
        sc.figures.clients_cpu_us,
        sc.figures.store_cpu_us,
    );

    let aged = match (a.age, &store) {
        (Some(n), Some(s)) => {
            let retention = Duration::from_millis(a.age_retention_ms);
            let every = Duration::from_millis(a.age_prune_every_ms.max(1));
            let _pruner = age::Pruner::start(s.clone(), retention, every);
            let (runs, errors, secs) = age::age(s, n, a.age_tasks, false).await?;
            let raw = raw(s, clients, a.seconds).await?;
            let sidecar = sc.measure(clients, a.seconds).await?;
            Some(AgedReport {
                aged: age::Aged {
                    runs,
                    errors,
                    seconds: secs,
                    retention_ms: a.age_retention_ms,
                    prune_every_ms: a.age_prune_every_ms,
                },
                raw,
                sidecar,
            })
        }
        _ => None,
    };
    let mut proc = sc.figures.clone();
    (proc.server_cpu_us, proc.clients_cpu_us, proc.store_cpu_us) = fresh_cpu;
    drop(sc);
    drop(store);

    let etcd = if a.against == "etcd" {
        Some(measure_etcd(tmp.path(), transport, clients, a.seconds).await?)
    } else {
        None
    };
    let report = Report {
        backend,
        clients,
        seconds: a.seconds,
        mode: a.sidecar.clone(),
        transport,
        raw: raw_fig,
        raw_single: single_fig,
        sidecar: sc_fig,
        proc,
        etcd,
        aged,
        load: (load_start, loadavg()),
    };
    if a.json {
        println!("{}", report.json());
    } else {
        report.print();
    }
    Ok(())
}

fn opt_mib(kib: Option<u64>) -> serde_json::Value {
    json!(kib.map(|k| round(mib(k))))
}

fn cpu_json(c: Option<(f64, f64)>) -> serde_json::Value {
    json!(c.map(|(u, s)| json!({"user": round(u), "system": round(s)})))
}

fn proc_json(p: &ProcFigures) -> serde_json::Value {
    json!({
        "ready_ms": round(p.ready_ms()),
        "rss_idle_mib": opt_mib(p.rss_idle_kib),
        "rss_load_mib": opt_mib(p.rss_load_kib),
        "rss_hwm_mib": opt_mib(p.hwm_kib),
        "server_cpu_us_per_claim": cpu_json(p.server_cpu_us),
        "clients_cpu_us_per_claim": cpu_json(p.clients_cpu_us),
        "store_cpu_us_per_claim": cpu_json(p.store_cpu_us),
    })
}

fn ratio(a: &PathFigures, b: &PathFigures) -> f64 {
    round(a.per_s() / b.per_s().max(1e-9))
}

impl Report {
    fn json(&self) -> serde_json::Value {
        let sc = &self.sidecar;
        let mut v = json!({
            "backend": self.backend,
            "clients": self.clients,
            "seconds": self.seconds,
            "sidecar_mode": self.mode,
            "transport": self.transport.as_str(),
            "sidecar_claims_per_s": round(sc.per_s()),
            "p50_ms": round(sc.ms(0.5)),
            "p99_ms": round(sc.ms(0.99)),
            "max_ms": round(sc.hist.max() as f64 / 1000.0),
            "sidecar": sc.json(),
            "ready_ms": round(self.proc.ready_ms()),
            "rss_idle_mib": opt_mib(self.proc.rss_idle_kib),
            "rss_load_mib": opt_mib(self.proc.rss_load_kib),
            "rss_hwm_mib": opt_mib(self.proc.hwm_kib),
            "process": proc_json(&self.proc),
            "loadavg_start": self.load.0,
            "loadavg_end": self.load.1,
        });
        if let Some(r) = &self.raw {
            v["raw_claims_per_s"] = json!(round(r.per_s()));
            v["ratio"] = json!(ratio(sc, r));
            v["raw"] = r.json();
            v["overhead_p50_ms"] = json!(round(sc.ms(0.5) - r.ms(0.5)));
            v["overhead_p99_ms"] = json!(round(sc.ms(0.99) - r.ms(0.99)));
        }
        if let Some(r) = &self.raw_single {
            v["raw_single_claims_per_s"] = json!(round(r.per_s()));
            v["ratio_vs_single"] = json!(ratio(sc, r));
            v["raw_single"] = r.json();
        }
        if let Some((e, p)) = &self.etcd {
            v["etcd_claims_per_s"] = json!(round(e.per_s()));
            v["etcd_p50_ms"] = json!(round(e.ms(0.5)));
            v["etcd_p99_ms"] = json!(round(e.ms(0.99)));
            v["sidecar_vs_etcd"] = json!(ratio(sc, e));
            let mut ej = e.json();
            ej["process"] = proc_json(p);
            v["etcd"] = ej;
        }
        if let Some(ag) = &self.aged {
            let mut j = ag.aged.json();
            j["sidecar_claims_per_s"] = json!(round(ag.sidecar.per_s()));
            j["sidecar_aged_vs_fresh"] = json!(ratio(&ag.sidecar, sc));
            j["sidecar"] = ag.sidecar.json();
            j["raw_claims_per_s"] = json!(round(ag.raw.per_s()));
            if let Some(r) = &self.raw {
                j["raw_aged_vs_fresh"] = json!(ratio(&ag.raw, r));
            }
            j["raw"] = ag.raw.json();
            v["aged"] = j;
        }
        v
    }

    fn print(&self) {
        println!(
            "backend {}, {} clients, {}s per path, sidecar {} over {}",
            self.backend,
            self.clients,
            self.seconds,
            self.mode,
            self.transport.as_str()
        );
        println!(
            "{:<14} {:>12} {:>9} {:>9} {:>9} {:>7}",
            "path", "claims/s", "p50 ms", "p99 ms", "max ms", "errors"
        );
        let row = |name: &str, f: &PathFigures| {
            println!(
                "{:<14} {:>12.0} {:>9.3} {:>9.3} {:>9.3} {:>7}",
                name,
                f.per_s(),
                f.ms(0.5),
                f.ms(0.99),
                f.hist.max() as f64 / 1000.0,
                f.errors
            )
        };
        if let Some(r) = &self.raw {
            row("raw", r);
        }
        if let Some(r) = &self.raw_single {
            row("raw 1/commit", r);
        }
        row("sidecar", &self.sidecar);
        if let Some((e, _)) = &self.etcd {
            row("etcd", e);
        }
        if let Some(ag) = &self.aged {
            row("raw aged", &ag.raw);
            row("sidecar aged", &ag.sidecar);
        }
        if let Some(r) = &self.raw {
            println!("ratio sidecar/raw: {:.2}", ratio(&self.sidecar, r));
        }
        if let Some(r) = &self.raw_single {
            println!(
                "ratio sidecar/raw single-claim step: {:.2}",
                ratio(&self.sidecar, r)
            );
        }
        if let Some((e, _)) = &self.etcd {
            println!("ratio sidecar/etcd: {:.2}", ratio(&self.sidecar, e));
        }
        let m = |k: Option<u64>| k.map_or("-".to_owned(), |k| format!("{:.1}", mib(k)));
        let p = &self.proc;
        println!(
            "sidecar: ready in {:.0} ms, RSS idle {} MiB, under load {} MiB (peak {} MiB)",
            p.ready_ms(),
            m(p.rss_idle_kib),
            m(p.rss_load_kib),
            m(p.hwm_kib)
        );
        let cpu = |c: Option<(f64, f64)>| {
            c.map_or("-".to_owned(), |(u, s)| {
                format!("{u:.0} user + {s:.0} system")
            })
        };
        println!(
            "sidecar: CPU µs per claim: server {}, load clients {}, store {}",
            cpu(p.server_cpu_us),
            cpu(p.clients_cpu_us),
            cpu(p.store_cpu_us)
        );
        if let Some((_, p)) = &self.etcd {
            println!(
                "etcd:    CPU µs per claim: server {}, load clients {}",
                cpu(p.server_cpu_us),
                cpu(p.clients_cpu_us)
            );
            println!(
                "etcd:    ready in {:.0} ms, RSS idle {} MiB, under load {} MiB (peak {} MiB)",
                p.ready_ms(),
                m(p.rss_idle_kib),
                m(p.rss_load_kib),
                m(p.hwm_kib)
            );
        }
        if let Some(ag) = &self.aged {
            let g = &ag.aged;
            println!(
                "aged: {} finished runs ({} errors) in {:.0} s, pruning every {} ms with retention {} ms",
                g.runs, g.errors, g.seconds, g.prune_every_ms, g.retention_ms
            );
            if let Some(r) = &self.raw {
                println!("ratio raw aged/fresh: {:.2}", ratio(&ag.raw, r));
            }
            println!(
                "ratio sidecar aged/fresh: {:.2}",
                ratio(&ag.sidecar, &self.sidecar)
            );
        }
        if let (Some(s), Some(e)) = self.load {
            println!("load average: {s:.2} at the start, {e:.2} at the end");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::single_claim_url;

    #[test]
    fn the_single_claim_step_turns_group_commit_off() {
        assert_eq!(
            single_claim_url("sqlite:///tmp/b.db").as_deref(),
            Some("sqlite:///tmp/b.db?max_batch=1")
        );
        assert_eq!(
            single_claim_url("postgres://u@h:5432/db?table=t&max_connections=8").as_deref(),
            Some(
                "postgres://u@h:5432/db?table=t&max_connections=8&max_batch=1&batches_in_flight=8"
            )
        );
        // Both parse: the step is measured on the store the URL names.
        for u in ["sqlite:///tmp/b.db", "postgres://u@h:5432/db?table=t"] {
            let single = single_claim_url(u).unwrap();
            assert!(crate::store::Backend::parse(&single).is_ok(), "{single}");
        }
        // No group commit to turn off, or the URL chose its own batch.
        assert_eq!(
            single_claim_url("redis://127.0.0.1:6379/0?strategy=lease"),
            None
        );
        assert_eq!(single_claim_url("sqlite:///tmp/b.db?max_batch=8"), None);
    }
}
