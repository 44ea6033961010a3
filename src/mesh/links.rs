//! Links: the hello exchange (proof of key, mesh secret, store identity),
//! refusals, and one `Sync` stream's life: a frame of deltas each heartbeat,
//! nudges, received marks into the table, expiry, and closing a surplus link.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Status, Streaming};

use super::fanout;
use super::gossip::{GossipConfig, Outbox};
use super::marks::{sign_hello, verify_hello, Refusal};
use super::node::{clock_now, lock, Mesh};
use crate::error::{is_frame_too_large, MeshError};
use crate::proto as pb;

/// A live `Sync` stream with another runtime.
#[derive(Debug, Clone)]
pub(super) struct LinkInfo {
    pub(super) node: String,
    pub(super) address: String,
    pub(super) outbound: bool,
    pub(super) last_rx: Instant,
}

/// A runtime refused as a link, for `peers`, `/readyz` and the dashboard.
#[derive(Debug, Clone)]
pub(super) struct RefusedLink {
    pub(super) address: String,
    pub(super) reason: Refusal,
    pub(super) store_identity: String,
    pub(super) at: Instant,
    /// Known from its own hello (proof of key), not just from what the
    /// runtime we dialed said about itself when it refused us.
    pub(super) verified: bool,
}

/// Relayed marks (beyond changes that matter) a runtime sends per heartbeat,
/// shared among its links: at ~110 bytes a mark without identity, about
/// 110 KiB per heartbeat whatever the size of the mesh.
pub const RELAY_MARKS_PER_HEARTBEAT: usize = 1024;

/// Each link may relay at least this many per heartbeat.
const MIN_RELAY_BUDGET: usize = 32;

impl Mesh {
    /// Refuses a peer that claims in another store than ours: counted as
    /// `store_mismatch`, logged with both identities, remembered for
    /// `peers`/`/readyz`, and — when `verified` (we checked its hello's proof
    /// of key) — dropped from the table with its marks ignored, so that it
    /// never counts as a dead holder here (its runs live in its own store).
    pub(super) fn refuse_store_mismatch(
        &self,
        node: &str,
        address: &str,
        theirs: &str,
        verified: bool,
    ) {
        let now = clock_now();
        let first = {
            let mut refused = lock(&self.refused);
            // Bounded: only recent refusals are kept (and at most max_runtimes).
            refused.retain(|_, r| now.saturating_duration_since(r.at) < self.cfg.expiry);
            if refused.len() >= self.cfg.max_runtimes && !refused.contains_key(node) {
                return;
            }
            // Once known from its own hello, it stays so while it keeps trying.
            let was_verified = refused.get(node).is_some_and(|r| r.verified);
            refused
                .insert(
                    node.to_owned(),
                    RefusedLink {
                        address: address.to_owned(),
                        reason: Refusal::StoreMismatch,
                        store_identity: theirs.to_owned(),
                        at: now,
                        verified: verified || was_verified,
                    },
                )
                .is_none()
        };
        {
            let mut table = lock(&self.table);
            table.count_refusal(Refusal::StoreMismatch);
            if verified {
                table.forget(node);
            }
        }
        if first {
            tracing::error!(
                peer = %node, %address, ours = %self.cfg.store_identity, theirs = %theirs,
                "refused a peer on another store: sidecars of one mesh must share one store, \
                 or each one's claims can be won again through the other"
            );
        }
    }

    /// Whether a hello announces another store than ours (either side may
    /// leave it empty: nothing to compare). A hello on our store clears an
    /// earlier refusal of that runtime (its operator fixed its store).
    pub(super) fn other_store(&self, hello: &pb::Hello) -> bool {
        let other = !self.cfg.store_identity.is_empty()
            && !hello.store_identity.is_empty()
            && hello.store_identity != self.cfg.store_identity;
        if !other {
            lock(&self.refused).remove(&hello.node);
        }
        other
    }

    /// Whether `node` was refused as a link, on its own hello, within the
    /// last expiry.
    fn recently_refused(
        refused: &HashMap<String, RefusedLink>,
        node: &str,
        now: Instant,
        expiry: Duration,
    ) -> bool {
        refused
            .get(node)
            .is_some_and(|r| r.verified && now.saturating_duration_since(r.at) < expiry)
    }

    /// This runtime's hello, with a fresh nonce.
    pub(super) fn hello(&self) -> pb::Hello {
        let mut h = sign_hello(&self.id, &self.cfg.advertise, self.cfg.secret.as_deref());
        h.store_identity = self.cfg.store_identity.clone();
        h
    }

    pub(super) fn link_with(&self, node: &str) -> Option<LinkInfo> {
        lock(&self.links)
            .values()
            .filter(|l| l.node == node)
            .max_by_key(|l| l.last_rx)
            .cloned()
    }

    /// The first frame of a link, which must be a hello (within one expiry).
    /// Anything else is counted as `no_hello`.
    pub(super) async fn first_hello(
        &self,
        inbound: &mut Streaming<pb::SyncFrame>,
    ) -> Option<pb::Hello> {
        match tokio::time::timeout(self.cfg.expiry, inbound.message()).await {
            Ok(Ok(Some(pb::SyncFrame {
                frame: Some(pb::sync_frame::Frame::Hello(h)),
            }))) => Some(h),
            _ => {
                lock(&self.table).count_refusal(Refusal::NoHello);
                None
            }
        }
    }

    /// Serves an inbound `Sync` stream (the server side of a link).
    pub async fn accept(
        self: Arc<Self>,
        mut inbound: Streaming<pb::SyncFrame>,
        remote_addr: Option<std::net::SocketAddr>,
    ) -> Result<
        impl tokio_stream::Stream<Item = Result<pb::SyncFrame, Status>> + Send + 'static,
        Status,
    > {
        let Some(hello) = self.first_hello(&mut inbound).await else {
            return Err(MeshError::NoHello.into());
        };
        if let Err(r) = verify_hello(&hello, self.cfg.secret.as_deref()) {
            lock(&self.table).count_refusal(r);
            tracing::warn!(peer = %hello.node, from = ?remote_addr, reason = r.as_str(), "refused a peer");
            return Err(MeshError::Refused(r).into());
        }
        if hello.node == self.id.node {
            return Err(MeshError::IsSelf.into());
        }
        if self.other_store(&hello) {
            self.refuse_store_mismatch(&hello.node, &hello.address, &hello.store_identity, true);
            return Err(MeshError::StoreMismatch {
                node: self.id.node.clone(),
                ours: self.cfg.store_identity.clone(),
                theirs: hello.store_identity.clone(),
            }
            .into());
        }
        let inbound_links = lock(&self.links)
            .values()
            .filter(|l| l.node == hello.node && !l.outbound)
            .count();
        if inbound_links >= self.cfg.max_links_per_peer {
            lock(&self.table).count_refusal(Refusal::TooManyLinks);
            return Err(MeshError::TooManyLinks {
                links: inbound_links,
            }
            .into());
        }
        // Over twice max_links: serve the newcomer our view, then close
        // (it links with the runtimes it chooses from that view).
        let links_up = lock(&self.links).len();
        let referral = links_up >= self.cfg.max_links.saturating_mul(2)
            && !lock(&self.chosen).contains(&hello.node);
        let (tx, rx) = mpsc::channel::<pb::SyncFrame>(8);
        let _ = tx.try_send(pb::SyncFrame {
            frame: Some(pb::sync_frame::Frame::Hello(self.hello())),
        });
        let address = hello.address.clone();
        tokio::spawn(
            self.clone()
                .run_link(hello, address, false, referral, inbound, tx),
        );
        Ok(ReceiverStream::new(rx).map(Ok))
    }

    /// Runs one link until it breaks, expires, or the mesh stops.
    pub(super) async fn run_link<S>(
        self: Arc<Self>,
        remote: pb::Hello,
        address: String,
        outbound: bool,
        referral: bool,
        mut inbound: S,
        tx: mpsc::Sender<pb::SyncFrame>,
    ) where
        S: tokio_stream::Stream<Item = Result<pb::SyncFrame, Status>> + Unpin + Send,
    {
        let id = self.next_link.fetch_add(1, Ordering::Relaxed);
        let now = clock_now();
        lock(&self.links).insert(
            id,
            LinkInfo {
                node: remote.node.clone(),
                address: address.clone(),
                outbound,
                last_rx: now,
            },
        );
        lock(&self.table).touch_direct(&remote.node, now);
        tracing::debug!(peer = %remote.node, %address, outbound, "link up");
        // Frames go out when our beat rises (and once now, so a new link
        // learns everything at once).
        let mut frames_due = self.frames_due.subscribe();
        let mut nudges = self.nudges.subscribe();
        let mut stop = self.stop.clone();
        let mut last_rx = now;
        let mut outbox = Outbox::new(
            &remote.node,
            GossipConfig::new(self.cfg.heartbeat, self.cfg.expiry),
            now,
        )
        .with_peer_address(&remote.address);
        if !self.send_frame(&tx, &mut outbox) {
            lock(&self.links).remove(&id);
            return;
        }
        // Heartbeats in a row this link was not wanted (see `surplus`).
        let mut unwanted = 0u32;
        loop {
            let expires = tokio::time::Instant::from_std(last_rx + self.cfg.expiry);
            tokio::select! {
                _ = frames_due.changed() => {
                    if !self.send_frame(&tx, &mut outbox) { break; }
                    if self.surplus(&remote.node, outbound, referral) {
                        unwanted += 1;
                        // Two heartbeats: the other end has had our whole view.
                        if unwanted > 2 {
                            tracing::debug!(peer = %remote.node, "link not needed: closing");
                            break;
                        }
                    } else {
                        unwanted = 0;
                    }
                }
                nudge = nudges.recv() => {
                    if let Ok(n) = nudge {
                        let frame = pb::SyncFrame { frame: Some(pb::sync_frame::Frame::Nudge(n)) };
                        if matches!(tx.try_send(frame), Err(mpsc::error::TrySendError::Closed(_))) {
                            break;
                        }
                    }
                }
                msg = inbound.next() => match msg {
                    Some(Ok(frame)) => {
                        last_rx = clock_now();
                        if let Some(l) = lock(&self.links).get_mut(&id) {
                            l.last_rx = last_rx;
                        }
                        if let Some(pb::sync_frame::Frame::Marks(m)) = &frame.frame {
                            outbox.note_received(&m.marks, last_rx);
                        }
                        self.take_frame(&remote.node, frame, last_rx);
                    }
                    Some(Err(st)) => {
                        if is_frame_too_large(&st) {
                            lock(&self.table).count_refusal(Refusal::FrameTooLarge);
                        }
                        tracing::debug!(peer = %remote.node, error = %st, "link broke");
                        break;
                    }
                    None => break,
                },
                _ = tokio::time::sleep_until(expires) => {
                    tracing::info!(peer = %remote.node, "link expired: nothing received for one expiry");
                    break;
                }
                _ = stop.changed() => {
                    // Send the last frame (it carries our LEFT mark, if any).
                    self.send_frame(&tx, &mut outbox);
                    break;
                }
            }
        }
        lock(&self.links).remove(&id);
        if !self.stopped() {
            lock(&self.links_lost).insert(remote.node.clone(), clock_now());
        }
        tracing::debug!(peer = %remote.node, "link down");
    }

    /// Sends this link's delta: what the other end lacks, within the relay
    /// budget (a share of [`RELAY_MARKS_PER_HEARTBEAT`] per link).
    fn send_frame(&self, tx: &mpsc::Sender<pb::SyncFrame>, outbox: &mut Outbox) -> bool {
        let links = lock(&self.links).len().max(1);
        let budget = (RELAY_MARKS_PER_HEARTBEAT / links).max(MIN_RELAY_BUDGET);
        let marks = outbox.frame(&lock(&self.table), clock_now(), budget);
        if marks.is_empty() {
            return !tx.is_closed();
        }
        let frame = pb::SyncFrame {
            frame: Some(pb::sync_frame::Frame::Marks(pb::Marks { marks })),
        };
        let bytes = prost::Message::encoded_len(&frame) as u64;
        match tx.try_send(frame) {
            Ok(()) => {
                self.sent_bytes.fetch_add(bytes, Ordering::Relaxed);
                true
            }
            // A slow peer misses a frame rather than slowing us down; the
            // next one carries everything it may have missed.
            Err(mpsc::error::TrySendError::Full(_)) => {
                outbox.reset();
                true
            }
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        }
    }

    /// Whether a link is not needed any more: an inbound link accepted over
    /// the cap (a referral: the newcomer got our view), or an outbound link
    /// to a runtime we no longer chose (a seed, or a reshuffled random link)
    /// once enough chosen links are up.
    fn surplus(&self, node: &str, outbound: bool, referral: bool) -> bool {
        if referral {
            return true;
        }
        if !outbound {
            return false;
        }
        // One lock at a time.
        let linked: HashSet<String> = lock(&self.links).values().map(|l| l.node.clone()).collect();
        let chosen = lock(&self.chosen).clone();
        if chosen.contains(node) {
            return false;
        }
        let up = chosen.iter().filter(|n| linked.contains(*n)).count();
        up >= fanout::split(self.cfg.max_links).0.min(chosen.len()).max(1)
    }

    /// Links up now.
    pub fn link_count(&self) -> usize {
        lock(&self.links).len()
    }

    /// Bytes of sync frames sent since the start.
    pub fn sent_bytes(&self) -> u64 {
        self.sent_bytes.load(Ordering::Relaxed)
    }

    fn take_frame(&self, from: &str, frame: pb::SyncFrame, now: Instant) {
        let marks = match frame.frame {
            Some(pb::sync_frame::Frame::Marks(m)) => m.marks,
            Some(pb::sync_frame::Frame::Hello(_)) => return,
            Some(pb::sync_frame::Frame::Nudge(_)) => {
                self.wake_waiters();
                return;
            }
            None => {
                lock(&self.table).count_refusal(Refusal::Malformed);
                return;
            }
        };
        let mut changes = Vec::new();
        {
            let mut table = lock(&self.table);
            if marks.len() > self.cfg.max_runtimes + 1 {
                table.count_refusal(Refusal::TooManyRuntimes);
                return;
            }
            table.touch_direct(from, now);
            let refused = lock(&self.refused);
            for m in &marks {
                if Self::recently_refused(&refused, &m.node, now, self.cfg.expiry) {
                    continue;
                }
                let twin_before = table.duplicate_key_seen();
                let ingested = table.ingest(m, Some(from), now);
                if !twin_before && table.duplicate_key_seen() {
                    tracing::error!(
                        node = %self.id.node, instance = self.id.instance,
                        other_instance = m.instance, other_address = %m.address, via = %from,
                        "another process is running with this node key (a shared data dir or a \
                         copied node.key): its claims and ours look like one runtime; stop one of them"
                    );
                }
                match ingested {
                    Ok(Some(c)) => changes.push((m.node.clone(), c)),
                    Ok(None) => {}
                    Err(r) if r.is_suspicious() => {
                        tracing::debug!(peer = %from, about = %m.node, reason = r.as_str(), "dropped a mark")
                    }
                    Err(_) => {}
                }
            }
        }
        self.publish(changes, now);
    }
}
