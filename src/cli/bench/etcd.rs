//! The etcd path (`--against etcd`, cargo feature `etcd`): the harness starts
//! its own etcd 3.4 (Debian's `etcd-server`) on free loopback ports with a
//! fresh data dir, and N clients do the same exactly-once claim as anarchon:
//! one create-if-absent transaction per claim,
//!
//! ```text
//! Txn(If: create_revision(key) == 0,
//!     Then: Put(key, holder+token, lease),
//!     Else: Get(key))
//! ```
//!
//! won when the `If` held. Each client grants one lease at the start (etcd's
//! own session pattern, one round trip fewer per claim than a lease per
//! claim) and attaches it to every key it creates.
//!
//! Each client is one plain tonic channel ([`Target::channel`], as the
//! sidecar's clients), handed to `etcd-client` with `from_channel`, rather
//! than `etcd-client`'s own balanced channel, which costs etcd's side more
//! client CPU per claim. With `--transport unix` etcd listens on a Unix
//! socket (`unix://localhost:PORT`, a socket file of that name in its
//! directory) and the clients dial it there.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::Context;
use etcd_client::{Client, Compare, CompareOp, ConnectOptions, PutOptions, Txn, TxnOp};

use super::process::{
    cpu_seconds, cpu_us_per_claim, free_port, ready_figures, retry_taken_ports, status_kib,
    Guarded, ProcFigures, RssSampler,
};
use super::transport::{Target, Transport};
use super::{drive, PathFigures};

/// An etcd server started by the bench; killed when dropped.
pub struct EtcdServer {
    pub target: Target,
    pub figures: ProcFigures,
    child: Guarded,
}

/// The etcd binary: `$ANARCHON_ETCD`, else `etcd` on `PATH`.
fn etcd_binary() -> String {
    std::env::var("ANARCHON_ETCD").unwrap_or_else(|_| "etcd".into())
}

async fn connect(target: &Target) -> anyhow::Result<Client> {
    let opts = ConnectOptions::new().with_timeout(Duration::from_secs(10));
    let ch = tokio::time::timeout(Duration::from_secs(2), target.channel())
        .await
        .with_context(|| format!("etcd at {target}: connect timed out"))??;
    Ok(Client::from_channel(etcd_client::Channel::Tonic(ch), Some(opts)).await?)
}

/// Starts etcd on free loopback ports (never the system's 2379) with a
/// fresh data dir under `dir`; ready once it answers `Status`. etcd takes its
/// ports as numbers, chosen here and bound there a moment later, so it is
/// started again on new ports if one was taken in between
/// ([`retry_taken_ports`]).
pub async fn start(dir: &Path, transport: Transport) -> anyhow::Result<EtcdServer> {
    retry_taken_ports("etcd", || start_once(dir, transport)).await
}

async fn start_once(dir: &Path, transport: Transport) -> anyhow::Result<EtcdServer> {
    let data = dir.join("etcd-data");
    let _ = std::fs::remove_dir_all(&data);
    let (client_port, peer_port) = (free_port()?, free_port()?);
    let (client_url, target) = match transport {
        Transport::Tcp => (
            format!("http://127.0.0.1:{client_port}"),
            Target::Tcp(([127, 0, 0, 1], client_port).into()),
        ),
        // etcd names the socket file after the URL's host:port, in its
        // working directory.
        Transport::Unix => (
            format!("unix://localhost:{client_port}"),
            Target::Unix(dir.join(format!("localhost:{client_port}"))),
        ),
    };
    let peer_url = format!("http://127.0.0.1:{peer_port}");
    let bin = etcd_binary();
    let mut cmd = Command::new(&bin);
    cmd.arg("--name")
        .arg("bench")
        .arg("--data-dir")
        .arg(&data)
        .arg("--listen-client-urls")
        .arg(&client_url)
        .arg("--advertise-client-urls")
        .arg(&client_url)
        .arg("--listen-peer-urls")
        .arg(&peer_url)
        .arg("--initial-advertise-peer-urls")
        .arg(&peer_url)
        .arg("--initial-cluster")
        .arg(format!("bench={peer_url}"))
        .arg("--initial-cluster-state")
        .arg("new")
        .arg("--log-level")
        .arg("warn");
    // The system service's settings must not leak into ours.
    for (k, _) in std::env::vars() {
        if k.starts_with("ETCD_") {
            cmd.env_remove(k);
        }
    }
    cmd.current_dir(dir);
    let started = Instant::now();
    let mut child = Guarded::spawn("etcd", cmd, &dir.join("etcd.log")).with_context(|| {
        format!("is etcd installed? (Debian: apt-get install etcd-server; or set ANARCHON_ETCD to its path; tried {bin:?})")
    })?;
    let figures = ready_figures(&mut child, started, || {
        let target = target.clone();
        async move {
            match connect(&target).await {
                Ok(mut c) => c.status().await.is_ok(),
                Err(_) => false,
            }
        }
    })
    .await?;
    Ok(EtcdServer {
        target,
        figures,
        child,
    })
}

impl EtcdServer {
    /// Drives the claim transaction from `clients` connections for `seconds`.
    pub async fn measure(&mut self, clients: usize, seconds: f64) -> anyhow::Result<PathFigures> {
        // A lease that outlives the run, granted once per client.
        let ttl = (seconds * 2.0) as i64 + 60;
        let mut conns = Vec::new();
        for _ in 0..clients {
            let mut c = connect(&self.target).await?;
            let lease = c.lease_grant(ttl, None).await?.id();
            conns.push((c, lease));
        }
        let conns = std::sync::Arc::new(conns);
        let base = crate::claim::host_now_ms();
        let run = format!("{:x}", rand::random::<u32>());
        let sampler = RssSampler::start(self.child.pid());
        let pid = self.child.pid().to_string();
        let (server0, clients0) = (cpu_seconds(&pid), cpu_seconds("self"));
        let fig = drive(clients, seconds, move |c, n| {
            let (mut cl, lease) = conns[c].clone();
            let key = format!("/anarchon-bench/{run}/bench-{c}/{}", base + n as i64);
            async move {
                let value = format!("bench/{c}/{lease}");
                let txn = Txn::new()
                    .when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
                    .and_then([TxnOp::put(
                        key.clone(),
                        value,
                        Some(PutOptions::new().with_lease(lease)),
                    )])
                    .or_else([TxnOp::get(key, None)]);
                matches!(cl.txn(txn).await, Ok(r) if r.succeeded())
            }
        })
        .await;
        let claims = fig.as_ref().map_or(0, |f| f.claims);
        self.figures.clients_cpu_us = cpu_us_per_claim(clients0, cpu_seconds("self"), claims);
        self.figures.server_cpu_us = cpu_us_per_claim(server0, cpu_seconds(&pid), claims);
        self.figures.rss_load_kib = Some(sampler.finish().await);
        self.child.check_running()?;
        self.figures.hwm_kib = status_kib(self.child.pid(), "VmHWM");
        fig
    }
}
