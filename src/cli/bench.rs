//! `anarchon bench`: the sidecar path against the store's raw atomic step, in
//! one run on the same machine.
//!
//! * **raw**: N tasks call `Store::claim` directly (the same atomic step the
//!   sidecar runs, without gRPC).
//! * **sidecar**: an in-process `anarchon serve` on a loopback port, N gRPC
//!   clients (one connection each) calling `Claim`.
//!
//! Every claim is for a new slot, so every claim is a write (the expensive
//! path). Prints claims/s and p50/p99/max latency, or one JSON object.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Args;
use hdrhistogram::Histogram;
use serde_json::json;
use tokio::net::TcpListener;
use tonic::transport::Channel;

use crate::claim::*;
use crate::proto as pb;
use crate::server::{self, Listeners};
use crate::store::{self, StoreOptions};
use crate::Config;

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
    /// What to compare the sidecar with.
    #[arg(long, default_value = "raw", value_parser = ["raw", "none"])]
    pub against: String,
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

fn spec_for(run: &str, c: usize, n: u64, base: i64, holder: &Holder) -> Option<ClaimSpec> {
    Some(ClaimSpec {
        job: Job::parse(&format!("bench-{run}-{c}")).ok()?,
        slot_ms: base + n as i64,
        token: Token::generate(),
        holder: holder.clone(),
        lease_ms: 30_000,
        max_late_ms: 60_000,
        overlap: Overlap::Allow,
        max_attempts: 3,
    })
}

/// Measures the raw store step.
pub async fn raw(url: &str, clients: usize, seconds: f64) -> anyhow::Result<PathFigures> {
    let store = store::open(url, &StoreOptions::default()).await?;
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

/// Starts an in-process sidecar on a loopback port; returns its address and a
/// stop handle.
pub async fn start_sidecar(
    url: &str,
    data_dir: &std::path::Path,
) -> anyhow::Result<(std::net::SocketAddr, tokio::sync::oneshot::Sender<()>)> {
    let grpc = TcpListener::bind("127.0.0.1:0").await?;
    let addr = grpc.local_addr()?;
    let cfg = Config {
        backend: url.to_owned(),
        data_dir: data_dir.to_owned(),
        listen: addr,
        ..Config::default()
    };
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let stop = async move {
            let _ = rx.await;
        };
        if let Err(e) = server::run(cfg, Listeners { grpc, admin: None }, stop).await {
            eprintln!("anarchon bench: sidecar failed: {e:#}");
        }
    });
    // Wait until it answers.
    for _ in 0..600 {
        if Channel::from_shared(format!("http://{addr}"))?
            .connect()
            .await
            .is_ok()
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok((addr, tx))
}

/// Measures claims through the sidecar over gRPC.
pub async fn sidecar(
    addr: std::net::SocketAddr,
    clients: usize,
    seconds: f64,
) -> anyhow::Result<PathFigures> {
    let mut conns = Vec::new();
    for _ in 0..clients {
        let ch = Channel::from_shared(format!("http://{addr}"))?
            .connect()
            .await?;
        conns.push(pb::claims_client::ClaimsClient::new(ch));
    }
    let conns = Arc::new(conns);
    let base = host_now_ms();
    let run = format!("{:x}", rand::random::<u32>());
    drive(clients, seconds, move |c, n| {
        let mut cl = conns[c].clone();
        let job = format!("bench-{run}-{c}");
        async move {
            let req = pb::ClaimRequest {
                job,
                slot_ms: base + n as i64,
                ..Default::default()
            };
            matches!(cl.claim(req).await, Ok(r) if r.get_ref().outcome == pb::Outcome::Won as i32)
        }
    })
    .await
}

pub async fn bench(a: BenchArgs) -> ExitCode {
    match bench_inner(&a).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("anarchon bench: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn bench_inner(a: &BenchArgs) -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let url = match &a.backend {
        Some(u) => u.clone(),
        None => format!("sqlite://{}", tmp.path().join("bench.db").display()),
    };
    let clients = a.clients.max(1);
    let raw_fig = if a.against == "raw" {
        Some(raw(&url, clients, a.seconds).await?)
    } else {
        None
    };
    let (addr, stop) = start_sidecar(&url, &tmp.path().join("sidecar")).await?;
    let sc = sidecar(addr, clients, a.seconds).await?;
    let _ = stop.send(());
    let ratio = raw_fig
        .as_ref()
        .map(|r| round(sc.per_s() / r.per_s().max(1e-9)));
    let backend = crate::store::Backend::parse(&url)
        .map(|b| b.name())
        .unwrap_or("unknown");
    if a.json {
        let mut v = json!({
            "backend": backend,
            "clients": clients,
            "seconds": a.seconds,
            "sidecar_claims_per_s": round(sc.per_s()),
            "p50_ms": round(sc.ms(0.5)),
            "p99_ms": round(sc.ms(0.99)),
            "max_ms": round(sc.hist.max() as f64 / 1000.0),
            "sidecar": sc.json(),
        });
        if let Some(r) = &raw_fig {
            v["raw_claims_per_s"] = json!(round(r.per_s()));
            v["ratio"] = json!(ratio);
            v["raw"] = r.json();
            v["overhead_p50_ms"] = json!(round(sc.ms(0.5) - r.ms(0.5)));
            v["overhead_p99_ms"] = json!(round(sc.ms(0.99) - r.ms(0.99)));
        }
        println!("{v}");
    } else {
        println!(
            "backend {backend}, {clients} clients, {}s per path",
            a.seconds
        );
        println!(
            "{:<8} {:>12} {:>9} {:>9} {:>9} {:>7}",
            "path", "claims/s", "p50 ms", "p99 ms", "max ms", "errors"
        );
        let row = |name: &str, f: &PathFigures| {
            println!(
                "{:<8} {:>12.0} {:>9.3} {:>9.3} {:>9.3} {:>7}",
                name,
                f.per_s(),
                f.ms(0.5),
                f.ms(0.99),
                f.hist.max() as f64 / 1000.0,
                f.errors
            )
        };
        if let Some(r) = &raw_fig {
            row("raw", r);
        }
        row("sidecar", &sc);
        if let Some(r) = ratio {
            println!("ratio sidecar/raw: {r:.2}");
        }
    }
    Ok(())
}
