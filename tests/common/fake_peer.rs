//! An in-process runtime that speaks the real mesh protocol to a sidecar:
//! its own TCP connection and `Sync` stream, a hello with proof of key,
//! then a signed beat every heartbeat (the crate's own `sign_hello` and
//! `sign_mark`), and the sidecar's hello checked with `verify_hello`. It
//! never accepts links: the sidecar learns of it only through the stream it
//! opens. It ends by dropping the stream and the connection without a
//! `LEFT` mark (what a SIGKILL leaves behind).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anarchon::mesh::marks::{sign_hello, sign_mark, verify_hello};
use anarchon::mesh::Identity;
use anarchon::proto as pb;
use anarchon::proto::mesh_client::MeshClient;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::Channel;

/// What happened in one fake runtime's life, on the test's clock.
#[derive(Debug, Clone)]
pub struct Life {
    pub node: String,
    /// When its hello went out (before the connection was opened).
    pub started: Instant,
    /// When its first beat went out (the sidecar answered the hello).
    pub linked: Instant,
    /// When it died (ended its half of the stream; no beat after this).
    pub dropped: Instant,
    /// When its last beat went out.
    pub last_beat: Instant,
    /// Beats sent.
    pub beats: u64,
    /// Frames received from the sidecar (its hello included).
    pub frames_in: u64,
}

/// Why a fake runtime's life went wrong.
#[derive(Debug)]
pub enum FakeError {
    Connect(String),
    Refused(tonic::Status),
    /// The sidecar's first frame was not a valid hello.
    BadHello(String),
    /// The sidecar closed the stream while the runtime lived.
    Closed {
        after_beats: u64,
    },
    /// The sidecar did not end its half of the stream after ours.
    NotClosed(Duration),
}

fn frame(f: pb::sync_frame::Frame) -> pb::SyncFrame {
    pb::SyncFrame { frame: Some(f) }
}

/// Lives as runtime `id` at `address` (advertised; nothing listens there)
/// linked to the sidecar at `sidecar`: `beats` beats one `heartbeat` apart,
/// then `tail` more (shorter than a heartbeat: where in the heartbeat the
/// kill lands), then drops everything.
pub async fn live(
    sidecar: SocketAddr,
    sidecar_node: &str,
    id: &Identity,
    address: &str,
    heartbeat: Duration,
    beats: u64,
    tail: Duration,
) -> Result<Life, FakeError> {
    let labels = BTreeMap::new();
    let started = Instant::now();
    // A fresh connection, as a new process opens.
    let channel = Channel::from_shared(format!("http://{sidecar}"))
        .map_err(|e| FakeError::Connect(e.to_string()))?
        .tcp_nodelay(true)
        .connect()
        .await
        .map_err(|e| FakeError::Connect(e.to_string()))?;
    let mut client = MeshClient::new(channel);
    let (tx, rx) = mpsc::channel::<pb::SyncFrame>(8);
    // The hello goes first: the sidecar answers the call only after it.
    tx.try_send(frame(pb::sync_frame::Frame::Hello(sign_hello(
        id, address, None,
    ))))
    .map_err(|e| FakeError::Connect(e.to_string()))?;
    let mut inbound = client
        .sync(ReceiverStream::new(rx))
        .await
        .map_err(FakeError::Refused)?
        .into_inner();
    match inbound.message().await {
        Ok(Some(pb::SyncFrame {
            frame: Some(pb::sync_frame::Frame::Hello(h)),
        })) => {
            verify_hello(&h, None).map_err(|r| FakeError::BadHello(r.as_str().into()))?;
            if h.node != sidecar_node {
                return Err(FakeError::BadHello(format!("from {}", h.node)));
            }
        }
        other => return Err(FakeError::BadHello(format!("{other:?}"))),
    }
    let mut frames_in = 1;
    let linked = Instant::now();
    let mut every = tokio::time::interval(heartbeat);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut sent = 0u64;
    let mut last_beat = linked;
    // The beats, then the tail, all the while taking the sidecar's frames.
    let mut tail_end: Option<tokio::time::Instant> = None;
    loop {
        let t = tail_end;
        let tail_done = async move {
            match t {
                Some(t) => tokio::time::sleep_until(t).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = every.tick(), if sent < beats => {
                sent += 1;
                let m = sign_mark(id, sent, false, address, &labels);
                let f = frame(pb::sync_frame::Frame::Marks(pb::Marks { marks: vec![m], ..Default::default() }));
                if tx.send(f).await.is_err() {
                    return Err(FakeError::Closed { after_beats: sent });
                }
                last_beat = Instant::now();
                if sent == beats {
                    tail_end = Some(tokio::time::Instant::now() + tail);
                }
            }
            _ = tail_done => break,
            msg = inbound.message() => match msg {
                Ok(Some(_)) => frames_in += 1,
                _ => return Err(FakeError::Closed { after_beats: sent }),
            },
        }
    }
    // The kill: no more beats from here. Our half of the stream ends (no
    // `LEFT` mark), then the sidecar's, then the connection goes. Ending
    // ours first, rather than resetting the stream, makes every beat sent
    // before the kill reach the sidecar — a reset can discard one still
    // queued in the client — so the kill is at `dropped`, not a heartbeat
    // earlier. The sidecar ends its half once it has read to the end.
    let dropped = Instant::now();
    drop(tx);
    let closing = async {
        while let Ok(Some(_)) = inbound.message().await {
            frames_in += 1;
        }
    };
    let wait = heartbeat * 10;
    if tokio::time::timeout(wait, closing).await.is_err() {
        return Err(FakeError::NotClosed(wait));
    }
    drop(inbound);
    drop(client);
    Ok(Life {
        node: id.node.clone(),
        started,
        linked,
        dropped,
        last_beat,
        beats: sent,
        frames_in,
    })
}
