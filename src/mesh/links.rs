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
use super::gossip::{self, GossipConfig, Outbox, GOSSIP_TREES};
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

/// Between heartbeats a link relays what the other links brought (relay
/// trees) this many times per heartbeat: often enough that a beat crosses
/// six hops in under two heartbeats, seldom enough that a frame carries
/// tens of marks, checked in one signature batch.
pub const RELAY_TICKS_PER_HB: u64 = 4;

/// What one frame brought, for the other links to relay.
#[derive(Debug, Default)]
pub(super) struct Brought {
    /// Runtimes whose fresher marks were taken.
    pub(super) taken: Vec<String>,
    /// Those of them that were `EXPIRED` here (a healed partition): passed on
    /// on every link at once, subscribed or not, since the other ends may
    /// hold them expired too and no tree carries them any more.
    pub(super) revived: Vec<String>,
    /// Runtimes whose copy here is `fallback_after` old: asked for on every
    /// link (`Marks.want`; from the beat loop, not from a frame).
    pub(super) asks: Vec<String>,
}

/// Sleeps until `at`, or forever if there is nothing to wait for.
async fn sleep_until_some(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Frames a link may have waiting to go out: a heartbeat's frame plus the
/// relays between heartbeats (about one per other link). A link whose queue
/// is full misses a frame and sends everything again in the next.
pub(super) const LINK_QUEUE: usize = 32;

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
        let (tx, rx) = mpsc::channel::<pb::SyncFrame>(LINK_QUEUE);
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
        let mut taken = self.taken.subscribe();
        // What the other links brought since the last relay tick, and the
        // tick: fresh beats go down their trees (and what the other end
        // asked for is answered) a quarter heartbeat at most after they
        // arrive, not at our next beat.
        // (Armed only while something waits: an idle link does not wake.)
        let relay_every = self.cfg.heartbeat / RELAY_TICKS_PER_HB as u32;
        let mut pending: HashSet<String> = HashSet::new();
        let mut revived: HashSet<String> = HashSet::new();
        let mut asks: HashSet<String> = HashSet::new();
        let mut relay_at: Option<tokio::time::Instant> = None;
        let mut stop = self.stop.clone();
        let mut last_rx = now;
        let mut outbox = Outbox::new(
            &remote.node,
            GossipConfig::new(self.cfg.heartbeat, self.cfg.expiry),
            now,
        )
        .with_peer_address(&remote.address)
        .with_trees(remote.gossip >= GOSSIP_TREES);
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
                    // The heartbeat's frame carries whatever a relay waits to
                    // send (the same rules), so the relay has nothing left.
                    relay_at = None;
                    pending.clear();
                    let urgent: Vec<String> = revived.drain().collect();
                    let ask: Vec<String> = asks.drain().collect();
                    let waiting = !urgent.is_empty() || !ask.is_empty();
                    if waiting && !self.send_relay(&tx, &mut outbox, &[], &urgent, &ask) {
                        break;
                    }
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
                brought = taken.recv() => {
                    // Lagged: the heartbeat's frame relays what was missed.
                    if let Ok((link, b)) = brought {
                        // Only what the other end subscribed to, or must
                        // hear of at once, goes between heartbeats: nothing
                        // else arms the relay.
                        // (A link to an older sidecar relays nothing then.)
                        if link != id
                            && outbox.trees()
                            && (outbox.wants_any(&b.taken)
                                || !b.revived.is_empty()
                                || !b.asks.is_empty())
                        {
                            pending.extend(b.taken.iter().cloned());
                            revived.extend(b.revived.iter().cloned());
                            asks.extend(b.asks.iter().cloned());
                            relay_at.get_or_insert_with(|| tokio::time::Instant::now() + relay_every);
                        }
                    }
                }
                _ = sleep_until_some(relay_at) => {
                    relay_at = None;
                    let nodes: Vec<String> = pending.drain().collect();
                    let urgent: Vec<String> = revived.drain().collect();
                    let ask: Vec<String> = asks.drain().collect();
                    if !self.send_relay(&tx, &mut outbox, &nodes, &urgent, &ask) {
                        break;
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
                            outbox.note_received(m, last_rx);
                            if !m.want.is_empty() {
                                relay_at.get_or_insert_with(|| tokio::time::Instant::now() + relay_every);
                            }
                        }
                        let brought = self.take_frame(&remote.node, frame, last_rx);
                        if !brought.taken.is_empty() {
                            let _ = self.taken.send((id, Arc::new(brought)));
                        }
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
        self.send_marks(tx, outbox, marks)
    }

    /// Sends, between heartbeats, the fresh beats just `taken` that the
    /// other end subscribed to, and the answers to what it asked for
    /// ([`Outbox::relay`]).
    fn send_relay(
        &self,
        tx: &mpsc::Sender<pb::SyncFrame>,
        outbox: &mut Outbox,
        taken: &[String],
        revived: &[String],
        asks: &[String],
    ) -> bool {
        let marks = outbox.relay(&lock(&self.table), clock_now(), taken, revived, asks);
        self.send_marks(tx, outbox, marks)
    }

    fn send_marks(
        &self,
        tx: &mpsc::Sender<pb::SyncFrame>,
        outbox: &mut Outbox,
        marks: pb::Marks,
    ) -> bool {
        if gossip::is_empty(&marks) {
            return !tx.is_closed();
        }
        let frame = pb::SyncFrame {
            frame: Some(pb::sync_frame::Frame::Marks(marks)),
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

    /// Takes in one frame from `from`; returns what the other links relay:
    /// the runtimes whose marks it took (fresher beats, down their trees)
    /// and, among them, those it brought back from `EXPIRED`.
    fn take_frame(&self, from: &str, frame: pb::SyncFrame, now: Instant) -> Brought {
        let marks = match frame.frame {
            Some(pb::sync_frame::Frame::Marks(m)) => m.marks,
            Some(pb::sync_frame::Frame::Hello(_)) => return Brought::default(),
            Some(pb::sync_frame::Frame::Nudge(_)) => {
                self.wake_waiters();
                return Brought::default();
            }
            None => {
                lock(&self.table).count_refusal(Refusal::Malformed);
                return Brought::default();
            }
        };
        let mut changes = Vec::new();
        let mut taken = Vec::new();
        let revived;
        let evicted = {
            let mut table = lock(&self.table);
            if marks.len() > self.cfg.max_runtimes + 1 {
                table.count_refusal(Refusal::TooManyRuntimes);
                return Brought::default();
            }
            table.touch_direct(from, now);
            let refused = lock(&self.refused);
            let marks: Vec<pb::Mark> = marks
                .into_iter()
                .filter(|m| !Self::recently_refused(&refused, &m.node, now, self.cfg.expiry))
                .collect();
            let twin_before = table.duplicate_key_seen();
            let outcomes = table.ingest_frame(&marks, Some(from), now);
            if !twin_before && table.duplicate_key_seen() {
                tracing::error!(
                    node = %self.id.node, instance = self.id.instance, via = %from,
                    "another process is running with this node key (a shared data dir or a \
                     copied node.key): its claims and ours look like one runtime; stop one of them"
                );
            }
            for (m, ingested) in marks.iter().zip(outcomes) {
                if ingested.is_ok() {
                    taken.push(m.node.clone());
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
            revived = table.take_revived();
            table.take_evicted()
        };
        self.publish_evicted(evicted);
        self.publish(changes, now);
        Brought {
            taken,
            revived,
            asks: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    //! The link logic under tokio's paused clock: `run_link` over in-memory
    //! channels, the beats raised by hand (no beat, dial or persist task).

    use std::collections::BTreeMap;
    use std::sync::Arc;
    use std::time::Duration;

    use tokio::sync::{mpsc, watch};
    use tokio::task::JoinHandle;
    use tokio::time::Instant as TokioInstant;
    use tokio_stream::wrappers::ReceiverStream;
    use tonic::Status;

    use super::{MIN_RELAY_BUDGET, RELAY_MARKS_PER_HEARTBEAT};
    use crate::mesh::identity::Identity;
    use crate::mesh::marks::{sign_hello, sign_mark};
    use crate::mesh::node::{clock_now, lock, Mesh, MeshConfig};
    use crate::proto as pb;

    const HB: Duration = Duration::from_millis(100);
    const EXPIRY: Duration = Duration::from_millis(1000);

    struct Fixture {
        mesh: Arc<Mesh>,
        _stop: watch::Sender<bool>,
        _dir: tempfile::TempDir,
    }

    fn mesh() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let cfg = MeshConfig {
            heartbeat: HB,
            expiry: EXPIRY,
            advertise: "127.0.0.1:1".into(),
            labels: BTreeMap::new(),
            secret: None,
            data_dir: dir.path().to_path_buf(),
            peers: Vec::new(),
            peer_dns: Vec::new(),
            max_runtimes: 1024,
            max_frame_bytes: 4 << 20,
            watch_buffer: 64,
            max_links_per_peer: 2,
            max_links: 8,
            forget: Duration::from_secs(600),
            tls: None,
            bind_ip: None,
            store_identity: String::new(),
        };
        let (stop_tx, stop) = watch::channel(false);
        let (runs_changed, _) = watch::channel(0u64);
        let mesh = Arc::new(Mesh::new(
            Arc::new(Identity::ephemeral(1)),
            cfg,
            stop,
            runs_changed,
        ));
        Fixture {
            mesh,
            _stop: stop_tx,
            _dir: dir,
        }
    }

    /// The other end of a link: what it sends us, what we send it.
    struct Wire {
        node: String,
        to_us: mpsc::Sender<Result<pb::SyncFrame, Status>>,
        from_us: mpsc::Receiver<pb::SyncFrame>,
        task: JoinHandle<()>,
    }

    impl Wire {
        /// The marks of every frame sent to the other end so far.
        fn sent(&mut self) -> Vec<Vec<pb::Mark>> {
            self.sent_frames().into_iter().map(|m| m.marks).collect()
        }

        /// Every frame of marks sent to the other end so far, whole.
        fn sent_frames(&mut self) -> Vec<pb::Marks> {
            let mut out = Vec::new();
            while let Ok(f) = self.from_us.try_recv() {
                if let Some(pb::sync_frame::Frame::Marks(m)) = f.frame {
                    out.push(m);
                }
            }
            out
        }

        async fn send(&self, marks: Vec<pb::Mark>) {
            self.send_frame(pb::Marks {
                marks,
                ..Default::default()
            })
            .await;
        }

        async fn send_frame(&self, marks: pb::Marks) {
            let frame = pb::SyncFrame {
                frame: Some(pb::sync_frame::Frame::Marks(marks)),
            };
            self.to_us.send(Ok(frame)).await.unwrap();
        }
    }

    /// A link with a runtime of this hello, run as a task.
    fn link_with(mesh: &Arc<Mesh>, hello: pb::Hello, outbound: bool, referral: bool) -> Wire {
        let (to_us, inbound) = mpsc::channel(64);
        let (tx, from_us) = mpsc::channel(64);
        let node = hello.node.clone();
        let address = hello.address.clone();
        let task = tokio::spawn(mesh.clone().run_link(
            hello,
            address,
            outbound,
            referral,
            ReceiverStream::new(inbound),
            tx,
        ));
        Wire {
            node,
            to_us,
            from_us,
            task,
        }
    }

    fn link(mesh: &Arc<Mesh>, outbound: bool, referral: bool) -> (Identity, Wire) {
        let id = Identity::ephemeral(1);
        let hello = sign_hello(&id, "127.0.0.1:2", None);
        let wire = link_with(mesh, hello, outbound, referral);
        (id, wire)
    }

    /// A link with an older sidecar: no relay trees in its hello.
    fn old_link(mesh: &Arc<Mesh>) -> Wire {
        let id = Identity::ephemeral(1);
        let mut hello = sign_hello(&id, "127.0.0.1:2", None);
        hello.gossip = 0;
        link_with(mesh, hello, false, false)
    }

    /// Lets the spawned links run (no time passes).
    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    fn beat(mesh: &Mesh) {
        mesh.raise_beat(false, clock_now());
    }

    #[tokio::test(start_paused = true)]
    async fn a_link_that_hears_nothing_for_one_expiry_ends_and_is_remembered_as_lost() {
        let f = mesh();
        let start = TokioInstant::now();
        let (_, wire) = link(&f.mesh, false, false);
        settle().await;
        assert_eq!(f.mesh.link_count(), 1);
        tokio::time::sleep(EXPIRY - Duration::from_millis(10)).await;
        assert!(!wire.task.is_finished(), "up until the expiry");
        assert_eq!(f.mesh.link_count(), 1);
        wire.task.await.unwrap();
        let lasted = start.elapsed();
        assert!(
            lasted >= EXPIRY && lasted < EXPIRY + Duration::from_millis(50),
            "{lasted:?}"
        );
        assert_eq!(f.mesh.link_count(), 0);
        assert!(
            lock(&f.mesh.links_lost).contains_key(&wire.node),
            "a broken link makes its runtime a suspect"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn every_frame_received_restarts_the_expiry_and_its_marks_reach_the_table() {
        let f = mesh();
        let start = TokioInstant::now();
        let (id, wire) = link(&f.mesh, false, false);
        settle().await;
        let addr = "127.0.0.1:7";
        for b in 1..=3 {
            tokio::time::sleep(EXPIRY * 3 / 4).await;
            wire.send(vec![sign_mark(&id, b, false, addr, &BTreeMap::new())])
                .await;
            settle().await;
        }
        let peer = f
            .mesh
            .table_peers(clock_now())
            .into_iter()
            .find(|p| p.node == id.node)
            .expect("the runtime at the other end is known");
        assert_eq!(peer.beat, 3);
        assert_eq!(peer.state, pb::PeerState::Alive as i32);
        assert_eq!(peer.link, pb::Link::Direct as i32);
        // Last frame at 2.25 expiries: the link holds until 3.25.
        tokio::time::sleep(EXPIRY * 3 / 4).await;
        assert!(!wire.task.is_finished(), "still up at 3 expiries");
        wire.task.await.unwrap();
        let lasted = start.elapsed();
        let expected = EXPIRY * 9 / 4 + EXPIRY;
        assert!(
            lasted >= expected && lasted < expected + Duration::from_millis(50),
            "{lasted:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn one_frame_per_beat_each_with_our_own_newest_mark() {
        let f = mesh();
        let (_, mut wire) = link(&f.mesh, true, false);
        settle().await;
        let me = f.mesh.node().to_owned();
        let first = wire.sent();
        assert_eq!(first.len(), 1, "one frame as the link comes up");
        assert_eq!(first[0].len(), 1, "{:?}", first[0]);
        assert_eq!(
            (first[0][0].node.as_str(), first[0][0].beat),
            (me.as_str(), 1)
        );
        // No beat, no frame, however long.
        tokio::time::sleep(HB * 5).await;
        assert!(wire.sent().is_empty());
        for b in 2..=6u64 {
            beat(&f.mesh);
            settle().await;
            let frames = wire.sent();
            assert_eq!(frames.len(), 1, "beat {b}: {frames:?}");
            let own: Vec<_> = frames[0].iter().filter(|m| m.node == me).collect();
            assert_eq!(own.len(), 1);
            assert_eq!(own[0].beat, b);
            assert!(
                !own[0].public_key.is_empty(),
                "our mark carries our identity"
            );
            tokio::time::sleep(HB).await;
            wire.send(Vec::new()).await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_referral_closes_after_its_third_beat_an_ordinary_inbound_link_stays() {
        let f = mesh();
        let (_, referral) = link(&f.mesh, false, true);
        let (_, kept) = link(&f.mesh, false, false);
        settle().await;
        assert_eq!(f.mesh.link_count(), 2);
        for _ in 0..2 {
            beat(&f.mesh);
            settle().await;
        }
        assert!(!referral.task.is_finished(), "two beats: it got our view");
        beat(&f.mesh);
        settle().await;
        assert!(referral.task.is_finished(), "closed at the third beat");
        for _ in 0..5 {
            beat(&f.mesh);
            settle().await;
        }
        assert!(!kept.task.is_finished());
        assert_eq!(f.mesh.link_count(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn an_outbound_link_nobody_chose_closes_only_once_a_chosen_link_is_up() {
        let f = mesh();
        let (_, seed) = link(&f.mesh, true, false);
        let chosen = Identity::ephemeral(1);
        *lock(&f.mesh.chosen) = [chosen.node.clone()].into();
        settle().await;
        // The chosen runtime is not linked: the seed link is all we have.
        for _ in 0..5 {
            beat(&f.mesh);
            settle().await;
        }
        assert!(!seed.task.is_finished(), "kept while no chosen link is up");
        let hello = sign_hello(&chosen, "127.0.0.1:3", None);
        let wanted = link_with(&f.mesh, hello, true, false);
        settle().await;
        for _ in 0..2 {
            beat(&f.mesh);
            settle().await;
        }
        assert!(!seed.task.is_finished(), "the other end gets two beats");
        beat(&f.mesh);
        settle().await;
        assert!(seed.task.is_finished(), "surplus: closed");
        for _ in 0..5 {
            beat(&f.mesh);
            settle().await;
        }
        assert!(!wanted.task.is_finished(), "a chosen link stays");
    }

    /// A link that hears nothing for 1½ heartbeats is silent: its runtime
    /// is not chosen (others are dialled instead) until it is heard again,
    /// and the discovery loop is woken at once to dial them.
    #[tokio::test(start_paused = true)]
    async fn a_runtime_whose_link_went_silent_is_not_chosen_until_heard_again() {
        let f = mesh();
        let (p, wire) = link(&f.mesh, false, false);
        let q = Identity::ephemeral(1);
        settle().await;
        let frame = |b| {
            vec![
                sign_mark(&p, b, false, "127.0.0.1:2", &BTreeMap::new()),
                sign_mark(&q, b, false, "127.0.0.1:3", &BTreeMap::new()),
            ]
        };
        wire.send(frame(1)).await;
        settle().await;
        f.mesh.choose_links(0);
        let chosen = lock(&f.mesh.chosen).clone();
        assert!(
            chosen.contains(&p.node) && chosen.contains(&q.node),
            "{chosen:?}"
        );
        // A heartbeat of silence: still chosen, and nobody is woken.
        tokio::time::sleep(HB).await;
        f.mesh.quarter_tick(clock_now());
        f.mesh.choose_links(0);
        assert!(lock(&f.mesh.chosen).contains(&p.node), "not silent yet");
        let woken = || async {
            tokio::time::timeout(Duration::ZERO, f.mesh.rechoose.notified())
                .await
                .is_ok()
        };
        assert!(!woken().await);
        // 1½: silent (still ALIVE in the table: 15 % of the expiry old); the
        // quarter tick wakes the discovery loop, once.
        tokio::time::sleep(HB / 2).await;
        f.mesh.quarter_tick(clock_now());
        assert!(woken().await, "the discovery loop is woken");
        f.mesh.quarter_tick(clock_now());
        assert!(!woken().await, "only when a link newly goes silent");
        f.mesh.choose_links(0);
        let chosen = lock(&f.mesh.chosen).clone();
        assert!(
            !chosen.contains(&p.node),
            "a silent link's runtime: {chosen:?}"
        );
        assert!(chosen.contains(&q.node));
        assert_eq!(
            f.mesh.link_count(),
            1,
            "the link itself stays until it expires"
        );
        // Heard again: chosen again.
        wire.send(frame(2)).await;
        settle().await;
        f.mesh.choose_links(0);
        assert!(lock(&f.mesh.chosen).contains(&p.node));
    }

    /// A beat of every runtime the feeder knows, `beat` each.
    fn marks(ids: &[Identity], beat: u64) -> Vec<pb::Mark> {
        ids.iter()
            .enumerate()
            .map(|(i, id)| sign_mark(id, beat, false, &format!("10.0.0.{i}:1"), &BTreeMap::new()))
            .collect()
    }

    /// How many marks of others the next beat's frame relays on `wire`,
    /// when `others` runtimes all beat again since its last frame.
    async fn relayed_at_next_beat(
        f: &Fixture,
        feeder: &Wire,
        wire: &mut Wire,
        others: &[Identity],
        beat_no: u64,
    ) -> usize {
        wire.sent();
        // The other end's copies grow older than `relay_after` (a quarter
        // expiry): the new beats are due, within the budget.
        tokio::time::sleep(EXPIRY / 4 + HB).await;
        feeder.send(marks(others, beat_no)).await;
        wire.send(Vec::new()).await;
        settle().await;
        beat(&f.mesh);
        settle().await;
        let frames = wire.sent();
        assert_eq!(frames.len(), 1, "{frames:?}");
        let me = f.mesh.node();
        frames[0].iter().filter(|m| m.node != me).count()
    }

    #[tokio::test(start_paused = true)]
    async fn each_link_relays_its_share_of_the_relay_budget_and_at_least_the_minimum() {
        let f = mesh();
        let others: Vec<Identity> = (0..100).map(|_| Identity::ephemeral(1)).collect();
        let (_, feeder) = link(&f.mesh, false, false);
        feeder.send(marks(&others, 1)).await;
        settle().await;
        let known = f.mesh.table_peers(clock_now());
        assert_eq!(
            others
                .iter()
                .filter(|o| known.iter().any(|p| p.node == o.node))
                .count(),
            100
        );
        // The budget caps the per-link refresh, which an older sidecar's
        // link uses (with relay trees nothing is refreshed by age).
        let mut wire = old_link(&f.mesh);
        settle().await;
        let first = wire.sent();
        assert_eq!(first.len(), 1);
        assert!(first[0].len() >= 101, "the first frame is not capped");

        // Two links: a budget of 512, more than the 100 due.
        assert_eq!(
            relayed_at_next_beat(&f, &feeder, &mut wire, &others, 2).await,
            100
        );

        // 40 links: 1024 / 40 = 25 each, raised to the minimum of 32.
        let mut idle: Vec<_> = (0..38).map(|_| link(&f.mesh, false, false).1).collect();
        settle().await;
        assert_eq!(f.mesh.link_count(), 40);
        assert_eq!(
            relayed_at_next_beat(&f, &feeder, &mut wire, &others, 3).await,
            (RELAY_MARKS_PER_HEARTBEAT / 40).max(MIN_RELAY_BUDGET)
        );
        assert_eq!(MIN_RELAY_BUDGET, 32);

        // 20 links: 1024 / 20 = 51 each.
        idle.truncate(18);
        settle().await;
        assert_eq!(f.mesh.link_count(), 20);
        assert_eq!(
            relayed_at_next_beat(&f, &feeder, &mut wire, &others, 4).await,
            51
        );
    }

    /// (node, beat) of each mark of a frame.
    fn beats(marks: &[pb::Mark]) -> Vec<(&str, u64)> {
        marks.iter().map(|m| (m.node.as_str(), m.beat)).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_subscribed_beat_goes_on_within_a_quarter_heartbeat_and_so_does_an_answer() {
        let f = mesh();
        let c = Identity::ephemeral(1);
        let d = Identity::ephemeral(1);
        let (_, feeder) = link(&f.mesh, false, false);
        let ids = [c, d];
        feeder.send(marks(&ids, 1)).await;
        settle().await;
        let (_, mut wire) = link(&f.mesh, false, false);
        settle().await;
        let first = wire.sent();
        assert_eq!(first.len(), 1);
        assert!(ids
            .iter()
            .all(|i| first[0].iter().any(|m| m.node == i.node)));
        // The other end subscribes to C (we are its fastest path to C).
        wire.send_frame(pb::Marks {
            subscribe: vec![ids[0].node.clone()],
            ..Default::default()
        })
        .await;
        settle().await;
        assert!(wire.sent().is_empty());
        // Two heartbeats on (more than the eager gain), C and D beat again
        // through the feeder: C goes on at once, without waiting for our
        // beat; D (not subscribed) does not.
        tokio::time::sleep(2 * HB).await;
        feeder.send(marks(&ids, 3)).await;
        settle().await;
        assert!(wire.sent().is_empty(), "gathered for a quarter heartbeat");
        tokio::time::sleep(HB / 4).await;
        settle().await;
        let frames = wire.sent();
        assert_eq!(frames.len(), 1, "{frames:?}");
        assert_eq!(beats(&frames[0]), vec![(ids[0].node.as_str(), 3)]);
        // The other end asks for D: answered at once.
        wire.send_frame(pb::Marks {
            want: vec![ids[1].node.clone()],
            ..Default::default()
        })
        .await;
        tokio::time::sleep(HB / 4).await;
        settle().await;
        let frames = wire.sent();
        assert_eq!(frames.len(), 1, "{frames:?}");
        assert_eq!(beats(&frames[0]), vec![(ids[1].node.as_str(), 3)]);
        // Only once: asked again, with nothing fresher, nothing goes.
        wire.send_frame(pb::Marks {
            want: vec![ids[1].node.clone()],
            ..Default::default()
        })
        .await;
        tokio::time::sleep(HB / 4).await;
        settle().await;
        assert!(wire.sent().is_empty());
        // A link to an older sidecar never relays between heartbeats.
        let mut old = old_link(&f.mesh);
        settle().await;
        old.sent();
        tokio::time::sleep(2 * HB).await;
        feeder.send(marks(&ids, 5)).await;
        tokio::time::sleep(HB / 4).await;
        settle().await;
        assert!(old.sent().is_empty());
    }

    /// A link that goes silent no longer feeds the trees it was part of:
    /// the copies it brought are asked for on the other links within a
    /// quarter heartbeat of 1½ heartbeats of silence, long before they are
    /// `fallback_after` old; what the other links brought is not.
    #[tokio::test(start_paused = true)]
    async fn the_copies_a_silent_link_brought_are_asked_for_on_the_others() {
        let f = mesh();
        let c = Identity::ephemeral(1);
        let d = Identity::ephemeral(1);
        let (_, feeder) = link(&f.mesh, false, false);
        let (_, mut wire) = link(&f.mesh, false, false);
        settle().await;
        feeder.send(marks(std::slice::from_ref(&c), 1)).await;
        wire.send(marks(std::slice::from_ref(&d), 1)).await;
        settle().await;
        wire.sent();
        let gossip = crate::mesh::gossip::GossipConfig::new(HB, EXPIRY);
        assert!(gossip.silent_after < gossip.fallback_after);
        let want = |wire: &mut Wire| -> Vec<String> {
            wire.sent_frames()
                .into_iter()
                .flat_map(|m| m.want)
                .collect()
        };
        // One heartbeat of silence from the feeder (the wire keeps talking):
        // nothing is asked for.
        tokio::time::sleep(HB).await;
        wire.send(Vec::new()).await;
        settle().await;
        f.mesh.quarter_tick(clock_now());
        tokio::time::sleep(HB / 4).await;
        settle().await;
        assert!(want(&mut wire).is_empty());
        // 1½ heartbeats: C, which the feeder brought, is asked for on the
        // wire with the next relay; D, which the wire brought, is not.
        tokio::time::sleep(gossip.silent_after - HB - HB / 4).await;
        wire.send(Vec::new()).await;
        settle().await;
        f.mesh.quarter_tick(clock_now());
        tokio::time::sleep(HB / 4).await;
        settle().await;
        let asked = want(&mut wire);
        assert!(asked.contains(&c.node), "{asked:?}");
        assert!(!asked.contains(&d.node), "{asked:?}");
    }
}
