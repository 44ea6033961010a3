//! The Mesh service from a test: a client, the peer list, and waiting for a
//! mesh to link or for any condition, polled with a deadline.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anarchon::proto as pb;
use anarchon::proto::mesh_client::MeshClient;
use tonic::transport::Channel;

/// A Mesh client on the plaintext gRPC port at `addr`.
pub async fn client(addr: SocketAddr) -> MeshClient<Channel> {
    MeshClient::new(
        Channel::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect()
            .await
            .unwrap(),
    )
}

/// `ListPeers` of the sidecar at `addr`.
pub async fn list(addr: SocketAddr) -> pb::ListPeersResponse {
    client(addr)
        .await
        .list_peers(pb::ListPeersRequest {})
        .await
        .unwrap()
        .into_inner()
}

/// One of a sidecar's own beats, read from its `ListPeers` self view.
#[derive(Debug, Clone, Copy)]
pub struct OwnBeat {
    pub beat: u64,
    /// It rose no earlier than this (on the test's clock, which is the
    /// sidecar's: one machine).
    pub rose_after: Instant,
}

/// Waits until half a heartbeat after one of the sidecar's own beats rose,
/// and returns that beat: a fault (SIGKILL, a cut) made right after lands
/// between two beats, about half a heartbeat before the next one is due.
///
/// A test that bounds detection from below by `fault + expiry − 1
/// heartbeat` needs this. Made at a random moment, the fault sometimes
/// lands as a beat is due: whether that beat rose before the SIGKILL then
/// depends on how late the sidecar's timer fired (a few ms on a loaded
/// machine), and when it did not, the sidecar's last beat is a heartbeat
/// *and* those ms old. Its peers then rightly expire it one expiry after
/// that beat, which is a few ms under the bound. (CI saw `mesh_scale`
/// fail so.) Timed here, the bound is exact: every peer must hold `beat`
/// as the last one and expire the sidecar no earlier than `rose_after +
/// expiry`.
pub async fn mid_beat(addr: SocketAddr, heartbeat: Duration) -> OwnBeat {
    let mut c = client(addr).await;
    let end = Instant::now() + heartbeat * 50;
    loop {
        let sent = Instant::now();
        let l = c
            .list_peers(pb::ListPeersRequest {})
            .await
            .unwrap()
            .into_inner();
        let got = Instant::now();
        let me = l.self_.unwrap();
        let age = Duration::from_millis(me.beat_age_ms.max(0) as u64);
        // It rose in [sent − age − 1 ms, got − age] (the age is whole ms).
        if got - sent <= heartbeat / 10 && age <= heartbeat / 4 {
            tokio::time::sleep_until((got - age + heartbeat / 2).into()).await;
            return OwnBeat {
                beat: me.beat,
                rose_after: sent - age - Duration::from_millis(1),
            };
        }
        assert!(
            Instant::now() < end,
            "no fresh own beat read from {addr} in 50 heartbeats"
        );
        tokio::time::sleep(heartbeat / 8).await;
    }
}

/// How many peers a list shows ALIVE.
pub fn alive(l: &pb::ListPeersResponse) -> usize {
    l.peers
        .iter()
        .filter(|p| p.state == pb::PeerState::Alive as i32)
        .count()
}

/// Polls until `f` holds or `within` passes; returns when it first held.
pub async fn until<F, Fut>(within: Duration, mut f: F) -> Option<Instant>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let end = Instant::now() + within;
    while Instant::now() < end {
        if f().await {
            return Some(Instant::now());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    None
}

/// Waits until every sidecar sees every other one ALIVE (a sidecar that
/// does not answer yet counts as seeing none).
pub async fn linked(addrs: &[SocketAddr]) {
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let mut ok = true;
        for a in addrs {
            let seen = match MeshClient::connect(format!("http://{a}")).await {
                Ok(mut m) => m
                    .list_peers(pb::ListPeersRequest {})
                    .await
                    .map(|l| alive(&l.into_inner()))
                    .unwrap_or(0),
                Err(_) => 0,
            };
            ok &= seen >= addrs.len() - 1;
        }
        if ok {
            return;
        }
        assert!(Instant::now() < end, "the mesh of {addrs:?} did not link");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// [`linked`] from a test without a runtime of its own.
pub fn linked_blocking(addrs: &[SocketAddr]) {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(linked(addrs));
}

/// `--peer ADDR` for every address of `addrs` but the `i`th.
pub fn peer_flags(addrs: &[SocketAddr], i: usize) -> Vec<String> {
    addrs
        .iter()
        .enumerate()
        .filter(|(j, _)| *j != i)
        .flat_map(|(_, a)| ["--peer".to_string(), a.to_string()])
        .collect()
}

/// Starts sidecar `i` of a full mesh on `addrs` (from `free_addr`: every
/// peer must know them before it starts) in `dir`, with `flags` and a
/// `--peer` for every other one.
pub fn start_in_mesh(
    dir: &std::path::Path,
    addrs: &[SocketAddr],
    i: usize,
    mut flags: Vec<String>,
) -> super::process::Sidecar {
    flags.extend(peer_flags(addrs, i));
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    super::process::Sidecar::start_at(dir, addrs[i], &flags)
}

/// Flags shared by the sidecars of a mesh test: timing, one SQLite store in
/// `root`, and a config file holding `config` (the keys that have no flag).
pub fn mesh_flags(root: &std::path::Path, hb_ms: u64, expiry_ms: u64, config: &str) -> Vec<String> {
    let file = root.join("anarchon.toml");
    std::fs::write(&file, config).unwrap();
    vec![
        "--heartbeat-ms".into(),
        hb_ms.to_string(),
        "--expiry-ms".into(),
        expiry_ms.to_string(),
        "--backend".into(),
        format!("sqlite://{}", root.join("shared.db").display()),
        "--config".into(),
        file.display().to_string(),
    ]
}

/// The `&str` view of owned flags, for `Sidecar::start`.
pub fn refs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// One `WatchPeers` event as a client received it, on the client's clock.
#[derive(Debug, Clone)]
pub struct Seen {
    pub at: Instant,
    pub kind: pb::PeerEventKind,
    pub peer: pb::Peer,
}

/// Everything a watcher received, in order.
pub type Events = std::sync::Arc<std::sync::Mutex<Vec<Seen>>>;
/// How the watch stream failed, if it did.
pub type WatchFailure = std::sync::Arc<std::sync::Mutex<Option<tonic::Status>>>;

/// Records every `WatchPeers` event of the sidecar at `addr` with
/// client-side times, until the stream ends (and how it failed, if it did).
pub async fn record(addr: SocketAddr, include_expired: bool) -> (Events, WatchFailure) {
    let ev: Events = Default::default();
    let failed: WatchFailure = Default::default();
    let mut stream = client(addr)
        .await
        .watch_peers(pb::WatchPeersRequest { include_expired })
        .await
        .unwrap()
        .into_inner();
    let (out, fail) = (ev.clone(), failed.clone());
    tokio::spawn(async move {
        loop {
            match stream.message().await {
                Ok(Some(e)) => out.lock().unwrap().push(Seen {
                    at: Instant::now(),
                    kind: pb::PeerEventKind::try_from(e.kind).unwrap(),
                    peer: e.peer.unwrap_or_default(),
                }),
                Ok(None) => return,
                Err(st) => {
                    *fail.lock().unwrap() = Some(st);
                    return;
                }
            }
        }
    });
    (ev, failed)
}
