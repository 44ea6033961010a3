//! The sidecar path: a real `anarchon serve` child process (or, with
//! `--sidecar in-process`, the server inside the bench's own process) on a
//! loopback port or, with `--transport unix`, its `--listen-unix` socket,
//! and N gRPC clients, one connection each, calling `Claim`.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::TcpListener;

use super::process::{
    cpu_seconds, cpu_seconds_of, cpu_us_per_claim, ready_figures, status_kib, store_process,
    wait_ready, Guarded, ProcFigures, RssSampler,
};
use super::transport::{Target, Transport};
use super::{drive, PathFigures};
use crate::claim::host_now_ms;
use crate::proto as pb;
use crate::server::{self, Listeners};
use crate::Config;

/// A running sidecar; stopped when dropped.
pub struct Sidecar {
    pub target: Target,
    /// The local store's server processes, by name ([`store_process`]).
    store: Option<&'static str>,
    pub figures: ProcFigures,
    child: Option<Guarded>,
    _stop: Option<tokio::sync::oneshot::Sender<()>>,
}

/// One `Claim` answered (any outcome) on a fresh connection.
async fn answers(target: &Target) -> bool {
    let Ok(Ok(ch)) = tokio::time::timeout(Duration::from_secs(1), target.channel()).await else {
        return false;
    };
    let req = pb::ClaimRequest {
        job: "bench-ready".into(),
        slot_ms: host_now_ms(),
        ..Default::default()
    };
    let mut cl = pb::claims_client::ClaimsClient::new(ch);
    matches!(
        tokio::time::timeout(Duration::from_secs(2), cl.claim(req)).await,
        Ok(Ok(_))
    )
}

/// Spawns `anarchon serve` (this very executable) on loopback ports the
/// kernel picks (port 0, learnt from `--ready-file`: no port is chosen here
/// and bound there later, so none can be taken in between) with its own
/// data dir (and, for `--transport unix`, a socket in it); ready once it
/// answers a `Claim`.
pub async fn spawn(url: &str, data_dir: &Path, transport: Transport) -> anyhow::Result<Sidecar> {
    std::fs::create_dir_all(data_dir)?;
    let exe = std::env::current_exe()?;
    let ready_file = data_dir.join("ready");
    let _ = std::fs::remove_file(&ready_file);
    let mut cmd = Command::new(exe);
    cmd.arg("serve")
        .arg("--listen")
        .arg("127.0.0.1:0")
        .arg("--admin-listen")
        .arg("127.0.0.1:0")
        .arg("--ready-file")
        .arg(&ready_file)
        .arg("--data-dir")
        .arg(data_dir)
        .arg("--backend")
        .arg(url)
        // The sidecar as deployed: its own defaults (log filter `info`, so
        // every RPC's span is built), unless the bench's environment says
        // otherwise (`RUST_LOG`, `ANARCHON_*` keys pass through).
        .env_remove("ANARCHON_CONFIG");
    let socket = data_dir.join("anarchon.sock");
    if transport == Transport::Unix {
        cmd.arg("--listen-unix").arg(&socket);
    }
    let started = Instant::now();
    let mut child = Guarded::spawn("anarchon serve", cmd, &data_dir.join("serve.log"))?;
    let addr = grpc_addr(&mut child, started, &ready_file).await?;
    let target = match transport {
        Transport::Tcp => Target::Tcp(addr),
        Transport::Unix => Target::Unix(socket),
    };
    let figures = ready_figures(&mut child, started, || answers(&target)).await?;
    Ok(Sidecar {
        target,
        store: store_process(url),
        figures,
        child: Some(child),
        _stop: None,
    })
}

/// The `grpc=ADDR` line of the child's ready file, once it is written.
async fn grpc_addr(
    child: &mut Guarded,
    started: Instant,
    ready_file: &Path,
) -> anyhow::Result<SocketAddr> {
    let mut addr = None;
    wait_ready(child, started, Duration::from_secs(60), || {
        addr = std::fs::read_to_string(ready_file).ok().and_then(|text| {
            text.lines()
                .find_map(|l| l.strip_prefix("grpc="))
                .and_then(|a| a.trim().parse().ok())
        });
        std::future::ready(addr.is_some())
    })
    .await?;
    addr.ok_or_else(|| anyhow::anyhow!("{} has no grpc= line", ready_file.display()))
}

/// Starts the server inside this process (the bench's earlier mode: client
/// and server share one runtime, so no memory figures).
pub async fn in_process(
    url: &str,
    data_dir: &Path,
    transport: Transport,
) -> anyhow::Result<Sidecar> {
    let started = Instant::now();
    let grpc = TcpListener::bind("127.0.0.1:0").await?;
    let addr = grpc.local_addr()?;
    std::fs::create_dir_all(data_dir)?;
    let (unix, target) = match transport {
        Transport::Tcp => (None, Target::Tcp(addr)),
        Transport::Unix => {
            let path = data_dir.join("anarchon.sock");
            let socket = server::UnixSocket::bind(&path, false)?;
            (Some(socket), Target::Unix(path))
        }
    };
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
        let listeners = Listeners {
            grpc,
            admin: None,
            unix,
        };
        if let Err(e) = server::run(cfg, listeners, stop).await {
            eprintln!("anarchon bench: sidecar failed: {e:#}");
        }
    });
    loop {
        if answers(&target).await {
            break;
        }
        if started.elapsed() > Duration::from_secs(60) {
            anyhow::bail!("the in-process sidecar did not answer within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(Sidecar {
        target,
        store: store_process(url),
        figures: ProcFigures {
            ready: started.elapsed(),
            ..ProcFigures::default()
        },
        child: None,
        _stop: Some(tx),
    })
}

impl Sidecar {
    /// Drives `Claim` over gRPC from `clients` connections for `seconds`,
    /// sampling the child's memory meanwhile.
    pub async fn measure(&mut self, clients: usize, seconds: f64) -> anyhow::Result<PathFigures> {
        let mut conns = Vec::new();
        for _ in 0..clients {
            let ch = self.target.channel().await?;
            conns.push(pb::claims_client::ClaimsClient::new(ch));
        }
        let conns = Arc::new(conns);
        let base = host_now_ms();
        let run = format!("{:x}", rand::random::<u32>());
        let sampler = self.child.as_ref().map(|c| RssSampler::start(c.pid()));
        let pid = self.child.as_ref().map(|c| c.pid().to_string());
        let server0 = pid.as_deref().and_then(cpu_seconds);
        let clients0 = cpu_seconds("self");
        let store = self.store;
        let store0 = store.and_then(cpu_seconds_of);
        let fig = drive(clients, seconds, move |c, n| {
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
        .await;
        let claims = fig.as_ref().map_or(0, |f| f.claims);
        self.figures.clients_cpu_us = cpu_us_per_claim(clients0, cpu_seconds("self"), claims);
        self.figures.store_cpu_us =
            cpu_us_per_claim(store0, store.and_then(cpu_seconds_of), claims);
        self.figures.server_cpu_us =
            cpu_us_per_claim(server0, pid.as_deref().and_then(cpu_seconds), claims);
        if let Some(s) = sampler {
            let peak = s.finish().await;
            self.figures.rss_load_kib = Some(peak.max(self.figures.rss_load_kib.unwrap_or(0)));
        }
        if let Some(c) = self.child.as_mut() {
            c.check_running()?;
            self.figures.hwm_kib = status_kib(c.pid(), "VmHWM");
        }
        fig
    }
}
