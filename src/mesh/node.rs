//! The mesh runtime: the I/O around the pure [`PeerTable`]. This file holds
//! the core (the [`Mesh`] struct, start, the beat loop, events, views); the
//! links are in [`super::links`], discovery and dialling in
//! [`super::discovery`], `WatchPeers` in [`super::watch`], and the
//! persistence loop in [`super::persist`].
//!
//! * a beat loop raises and signs this runtime's beat every heartbeat and
//!   ticks the table (at a quarter heartbeat) to publish state changes;
//! * links are `Sync` streams; both ends send a hello (proof of key, mesh
//!   secret) and then a frame with every known mark each heartbeat;
//! * dialers redial with jittered exponential backoff from one heartbeat,
//!   capped at the expiry; the lower node id dials, the other only when
//!   nothing arrived for 3 heartbeats;
//! * discovery: `--peer`, `--peer-dns` (re-resolved every 5 heartbeats) and
//!   addresses learned from gossip; known peers persist in the data dir.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::{broadcast, watch};

use super::gossip::GossipConfig;
use super::identity::Identity;
use super::links::{LinkInfo, RefusedLink};
use super::marks::{sign_mark, Refusal};
use super::persist;
use super::table::{Change, PeerTable, TableConfig};
use crate::claim::{DeadHolders, Holder};
use crate::proto as pb;

/// Mesh settings, from the config.
#[derive(Debug, Clone)]
pub struct MeshConfig {
    pub heartbeat: Duration,
    pub expiry: Duration,
    pub advertise: String,
    pub labels: BTreeMap<String, String>,
    pub secret: Option<String>,
    pub data_dir: PathBuf,
    pub peers: Vec<String>,
    pub peer_dns: Vec<String>,
    pub max_runtimes: usize,
    pub max_frame_bytes: usize,
    pub watch_buffer: usize,
    /// Inbound links accepted at once from one runtime.
    pub max_links_per_peer: usize,
    /// Links this runtime aims to keep ([`super::fanout`]).
    pub max_links: usize,
    /// `LEFT`/`EXPIRED` runtimes are forgotten after this long.
    pub forget: Duration,
    /// TLS for dialing peers (their CA, our certificate), when TLS is on.
    pub tls: Option<tonic::transport::ClientTlsConfig>,
    /// The source address of our dials: the listen IP, when it is a
    /// specific one (so a peer sees our links come from our own address).
    pub bind_ip: Option<std::net::IpAddr>,
    /// The store identity announced in the hello (`StoreInfo::identity`).
    /// Peers announcing another one are refused as links; empty: no check.
    pub store_identity: String,
}

impl MeshConfig {
    pub fn from_config(
        c: &crate::Config,
        advertise: String,
        secret: Option<String>,
        tls: Option<tonic::transport::ClientTlsConfig>,
    ) -> Self {
        MeshConfig {
            bind_ip: Some(c.listen.ip()).filter(|ip| !ip.is_unspecified()),
            heartbeat: Duration::from_millis(c.heartbeat_ms),
            expiry: Duration::from_millis(c.expiry_ms),
            advertise,
            labels: c.label.clone(),
            secret,
            data_dir: c.data_dir.clone(),
            peers: c.peer.clone(),
            peer_dns: c.peer_dns.clone(),
            max_runtimes: c.max_runtimes,
            max_frame_bytes: c.max_frame_bytes,
            watch_buffer: c.watch_buffer,
            max_links_per_peer: c.max_links_per_peer,
            max_links: c.max_links,
            forget: Duration::from_millis(c.forget_ms),
            tls,
            store_identity: String::new(),
        }
    }
}

pub struct Mesh {
    pub(super) id: Arc<Identity>,
    pub(super) cfg: MeshConfig,
    pub(super) table: Mutex<PeerTable>,
    pub(super) events: broadcast::Sender<pb::PeerEvent>,
    pub(super) links: Mutex<HashMap<u64, LinkInfo>>,
    /// When the last link to a node broke (suspects for one expiry).
    pub(super) links_lost: Mutex<HashMap<String, Instant>>,
    pub(super) next_link: AtomicU64,
    beat: AtomicU64,
    /// Set by [`Mesh::leave`]: every later mark of ours says LEFT (final).
    left: AtomicBool,
    /// The runtimes this one dials ([`super::fanout`]), recomputed by the
    /// discovery loop.
    pub(super) chosen: Mutex<HashSet<String>>,
    /// Bytes of sync frames sent, for the metrics and the benchmarks.
    pub(super) sent_bytes: AtomicU64,
    /// Bumped when our beat rises (and for the leave mark): every link sends
    /// its frame then.
    pub(super) frames_due: watch::Sender<u64>,
    /// The runtimes whose fresher beats a link just brought: every link
    /// relays those its other end subscribed to at once (relay trees).
    pub(super) taken: broadcast::Sender<(u64, Arc<super::links::Brought>)>,
    pub(super) dialing: Mutex<HashSet<String>>,
    /// Configured peer addresses (`--peer`, DNS) whose last dial failed, with
    /// the error: shown by `ListPeers` and counted as unreachable links.
    pub(super) unreachable: Mutex<HashMap<String, String>>,
    pub(super) self_addrs: Mutex<HashSet<String>>,
    pub(super) dns: Mutex<HashSet<String>>,
    pub(super) stop: watch::Receiver<bool>,
    /// Bumped when a peer dies or nudges us: waiters re-check the store.
    runs_changed: watch::Sender<u64>,
    pub(super) nudges: broadcast::Sender<pb::Nudge>,
    /// Runtimes refused as links because they claim in another store.
    pub(super) refused: Mutex<HashMap<String, RefusedLink>>,
    /// The runtimes whose links were silent at the last quarter tick; one
    /// more wakes the discovery loop (`rechoose`) at once.
    silent: Mutex<HashSet<String>>,
    pub(super) rechoose: tokio::sync::Notify,
}

/// The time now on tokio's clock: the system's monotonic clock, except
/// under a paused tokio clock (`start_paused` tests), where the beats, the
/// links and the table then all read the same paused time.
pub(super) fn clock_now() -> Instant {
    tokio::time::Instant::now().into_std()
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock cannot leave the table half-updated in
    // a way that matters more than stopping the mesh would; keep serving.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The relay budget lives with the links; named here too for `benches/`.
pub use super::links::{RELAY_MARKS_PER_HEARTBEAT, RELAY_TICKS_PER_HB};

impl Mesh {
    /// Starts the mesh tasks. They stop when `stop` turns true. The mesh bumps
    /// `runs_changed` when a runtime dies or a peer nudges us.
    pub fn start(
        id: Arc<Identity>,
        cfg: MeshConfig,
        stop: watch::Receiver<bool>,
        runs_changed: watch::Sender<u64>,
    ) -> Arc<Mesh> {
        let mesh = Arc::new(Mesh::new(id, cfg, stop, runs_changed));
        tokio::spawn(mesh.clone().beat_loop());
        tokio::spawn(mesh.clone().discovery_loop());
        tokio::spawn(mesh.clone().persist_loop());
        mesh
    }

    /// The mesh without its tasks: nothing beats, dials or persists until
    /// [`Mesh::start`] spawns them (unit tests drive it by hand).
    pub(super) fn new(
        id: Arc<Identity>,
        cfg: MeshConfig,
        stop: watch::Receiver<bool>,
        runs_changed: watch::Sender<u64>,
    ) -> Mesh {
        let mut table = PeerTable::new(
            TableConfig {
                expiry: cfg.expiry,
                max_runtimes: cfg.max_runtimes,
            },
            &id.node,
            id.instance,
        )
        .with_forget(cfg.forget)
        // What the links' deltas assume (they never send a smaller gain).
        .with_min_gain(GossipConfig::new(cfg.heartbeat, cfg.expiry).min_gain);
        let started = clock_now();
        for m in persist::load(&cfg.data_dir) {
            table.restore(m, started);
        }
        table.set_own(
            sign_mark(&id, 1, false, &cfg.advertise, &cfg.labels),
            clock_now(),
        );
        let (events, _) = broadcast::channel(1024);
        let (frames_due, _) = watch::channel(0u64);
        let (nudges, _) = broadcast::channel(256);
        let (taken, _) = broadcast::channel(256);
        let mut self_addrs = HashSet::new();
        self_addrs.insert(cfg.advertise.clone());
        Mesh {
            id,
            cfg,
            table: Mutex::new(table),
            events,
            links: Mutex::new(HashMap::new()),
            links_lost: Mutex::new(HashMap::new()),
            next_link: AtomicU64::new(1),
            beat: AtomicU64::new(1),
            left: AtomicBool::new(false),
            chosen: Mutex::new(HashSet::new()),
            sent_bytes: AtomicU64::new(0),
            frames_due,
            taken,
            dialing: Mutex::new(HashSet::new()),
            unreachable: Mutex::new(HashMap::new()),
            self_addrs: Mutex::new(self_addrs),
            dns: Mutex::new(HashSet::new()),
            stop,
            runs_changed,
            nudges,
            refused: Mutex::new(HashMap::new()),
            silent: Mutex::new(HashSet::new()),
            rechoose: tokio::sync::Notify::new(),
        }
    }

    pub fn node(&self) -> &str {
        &self.id.node
    }

    /// The store identity this runtime announces in its hello.
    pub fn store_identity(&self) -> &str {
        &self.cfg.store_identity
    }

    pub(super) fn stopped(&self) -> bool {
        *self.stop.borrow()
    }

    // ---- beats and events --------------------------------------------------

    /// Beats on an exact heartbeat period (so a peer's last view of us is at
    /// most one heartbeat old), and ticks the table every quarter heartbeat
    /// (so a state change is published at most a quarter heartbeat late).
    async fn beat_loop(self: Arc<Self>) {
        let mut beats = tokio::time::interval(self.cfg.heartbeat);
        beats.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
        let quarter = (self.cfg.heartbeat / 4).max(Duration::from_millis(10));
        let mut ticks = tokio::time::interval(quarter);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut stop = self.stop.clone();
        loop {
            tokio::select! {
                biased;
                _ = stop.changed() => return,
                _ = beats.tick() => self.raise_beat(false, clock_now()),
                _ = ticks.tick() => {}
            }
            self.quarter_tick(clock_now());
        }
    }

    /// Every quarter heartbeat: publishes the table's state changes, sends
    /// every link the copies to ask for ([`PeerTable::due_asks`]): those
    /// `fallback_after` old, and those a link brought that has been silent
    /// for `silent_after` (or is gone); and wakes the discovery loop when a
    /// link went silent, to dial another runtime at once.
    pub(super) fn quarter_tick(&self, now: Instant) {
        let gossip = GossipConfig::new(self.cfg.heartbeat, self.cfg.expiry);
        let silent = self.silent_links(now);
        let newly = {
            let mut before = lock(&self.silent);
            let newly = silent.iter().any(|n| !before.contains(n));
            *before = silent;
            newly
        };
        if newly {
            self.rechoose.notify_one();
        }
        let heard = self.links_heard();
        let quiet = |via: &str| {
            heard
                .get(via)
                .is_none_or(|t| now.saturating_duration_since(*t) >= gossip.silent_after)
        };
        let (changes, asks) = {
            let mut table = lock(&self.table);
            let changes = table.tick(now);
            let asks = table.due_asks(now, gossip.fallback_after, self.cfg.heartbeat, quiet);
            (changes, asks)
        };
        self.publish(changes, now);
        if !asks.is_empty() {
            // Link id 0 is no link: every link asks.
            let asks = super::links::Brought {
                asks,
                ..Default::default()
            };
            let _ = self.taken.send((0, Arc::new(asks)));
        }
    }

    /// When each runtime we have links with was last heard, on the freshest
    /// of its links.
    pub(super) fn links_heard(&self) -> HashMap<String, Instant> {
        let mut heard: HashMap<String, Instant> = HashMap::new();
        for l in lock(&self.links).values() {
            let t = heard.entry(l.node.clone()).or_insert(l.last_rx);
            *t = (*t).max(l.last_rx);
        }
        heard
    }

    /// Raises and signs our beat, then makes every link send a frame at
    /// once: the newest beat leaves with age ≈ 0, so a peer's last view of us
    /// is never more than one heartbeat old (the lower detection bound).
    pub(super) fn raise_beat(&self, left: bool, now: Instant) {
        // LEFT is final: once announced, every later mark says so too.
        let left = if left {
            self.left.store(true, Ordering::SeqCst);
            true
        } else {
            self.left.load(Ordering::SeqCst)
        };
        let beat = self.beat.fetch_add(1, Ordering::SeqCst) + 1;
        let m = sign_mark(&self.id, beat, left, &self.cfg.advertise, &self.cfg.labels);
        lock(&self.table).set_own(m, now);
        self.frames_due.send_modify(|n| *n = n.wrapping_add(1));
    }

    pub(super) fn publish(&self, changes: Vec<(String, Change)>, now: Instant) {
        if changes.is_empty() {
            return;
        }
        let events: Vec<(Change, pb::Peer)> = {
            let table = lock(&self.table);
            changes
                .into_iter()
                .filter_map(|(node, change)| table.peer(&node, now).map(|p| (change, p)))
                .collect()
        };
        self.announce(events);
    }

    /// Deaths reported as their entries were evicted from a full view
    /// (`PeerTable::take_evicted`): the entries are gone, so the events
    /// carry the last view of them.
    pub(super) fn publish_evicted(&self, evicted: Vec<(Change, pb::Peer)>) {
        self.announce(evicted);
    }

    /// Tells the watchers, and wakes the claim waiters if a runtime died or
    /// restarted.
    fn announce(&self, events: Vec<(Change, pb::Peer)>) {
        if events
            .iter()
            .any(|(c, _)| matches!(c, Change::Expired | Change::Left | Change::Restarted))
        {
            self.wake_waiters();
        }
        for (change, peer) in events {
            match change {
                Change::Expired | Change::Restarted | Change::Left => tracing::info!(
                    peer = %peer.node, instance = peer.instance, change = ?change, "peer changed"
                ),
                _ => tracing::debug!(peer = %peer.node, change = ?change, "peer changed"),
            }
            let _ = self.events.send(pb::PeerEvent {
                kind: change.kind() as i32,
                peer: Some(peer),
            });
        }
    }

    pub(super) fn wake_waiters(&self) {
        self.runs_changed.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Tells every linked peer that a run was released or its lease ended
    /// here, so their waiters re-check at once.
    pub fn nudge(&self, job: &str, slot_ms: i64) {
        let _ = self.nudges.send(pb::Nudge {
            runs: vec![pb::RunRef {
                job: job.to_owned(),
                slot_ms,
            }],
        });
    }

    /// Announces a graceful leave: a signed LEFT mark, pushed on every link.
    pub async fn leave(&self) {
        self.raise_beat(true, clock_now());
        // Give the links a moment to put the frame on the wire.
        tokio::time::sleep(Duration::from_millis(50).min(self.cfg.heartbeat)).await;
    }

    // ---- views -----------------------------------------------------------

    pub fn self_peer(&self, now: Instant) -> pb::Peer {
        let table = lock(&self.table);
        let (beat, age) = table.own_beat(now);
        pb::Peer {
            node: self.id.node.clone(),
            instance: self.id.instance,
            // Every earlier instance of this node key was a start: what the
            // peers count as restarts.
            restarts: u32::try_from(self.id.instance.saturating_sub(1)).unwrap_or(u32::MAX),
            address: self.cfg.advertise.clone(),
            state: if self.left.load(Ordering::SeqCst) {
                pb::PeerState::Left as i32
            } else {
                pb::PeerState::Alive as i32
            },
            // Not linked with itself.
            link: pb::Link::None as i32,
            beat,
            labels: self.cfg.labels.clone().into_iter().collect(),
            node_name: self
                .cfg
                .labels
                .get("node_name")
                .cloned()
                .unwrap_or_default(),
            beat_age_ms: age,
        }
    }

    pub fn list(&self) -> pb::ListPeersResponse {
        let now = clock_now();
        let (mut peers, duplicate_node_key, duplicate_instance) = {
            let table = lock(&self.table);
            (
                table.peers(now),
                table.duplicate_key_seen(),
                table.duplicate_instance().unwrap_or_default(),
            )
        };
        peers.extend(self.unreachable_peers(now));
        pb::ListPeersResponse {
            self_: Some(self.self_peer(now)),
            peers,
            duplicate_node_key,
            duplicate_instance,
            store_identity: self.cfg.store_identity.clone(),
            refused: self.refused_peers(now),
        }
    }

    /// Configured peer addresses that never answered (no runtime known there):
    /// `UNREACHABLE`, no node, the last dial error in the label `last_error`.
    pub fn unreachable_peers(&self, now: Instant) -> Vec<pb::Peer> {
        let known: HashSet<String> = lock(&self.table)
            .addresses(now)
            .into_iter()
            .map(|(_, a, _)| a)
            .collect();
        let mut out: Vec<pb::Peer> = lock(&self.unreachable)
            .iter()
            .filter(|(addr, _)| !known.contains(*addr))
            .map(|(addr, err)| pb::Peer {
                address: addr.clone(),
                state: pb::PeerState::Unreachable as i32,
                link: pb::Link::None as i32,
                labels: [("last_error".to_owned(), err.clone())].into(),
                ..Default::default()
            })
            .collect();
        out.sort_by(|a, b| a.address.cmp(&b.address));
        out
    }

    /// Runtimes refused as links within the last expiry, newest first.
    pub fn refused_peers(&self, now: Instant) -> Vec<pb::RefusedPeer> {
        let mut out: Vec<_> = lock(&self.refused)
            .iter()
            .filter(|(_, r)| now.saturating_duration_since(r.at) < self.cfg.expiry)
            .map(|(node, r)| pb::RefusedPeer {
                node: node.clone(),
                address: r.address.clone(),
                reason: r.reason.as_str().to_owned(),
                store_identity: r.store_identity.clone(),
                age_ms: now.saturating_duration_since(r.at).as_millis() as i64,
            })
            .collect();
        out.sort_by_key(|r| r.age_ms);
        out
    }

    /// The runtimes in the liveness table (without the configured
    /// addresses that never answered: see [`Mesh::unreachable_peers`]).
    pub fn table_peers(&self, now: Instant) -> Vec<pb::Peer> {
        lock(&self.table).peers(now)
    }

    /// The links up now.
    pub fn link_status(&self, now: Instant) -> Vec<LinkStatus> {
        lock(&self.links)
            .values()
            .map(|l| LinkStatus {
                node: l.node.clone(),
                address: l.address.clone(),
                outbound: l.outbound,
                quiet: now.saturating_duration_since(l.last_rx),
            })
            .collect()
    }

    /// The liveness table's counters.
    pub fn table_stats(&self) -> TableStats {
        let table = lock(&self.table);
        TableStats {
            drops: table.drops().clone(),
            beats_accepted: table.beats_accepted(),
            duplicate_node_key: table.duplicate_key_seen(),
            duplicate_instance: table.duplicate_instance(),
        }
    }

    /// The runtimes this one chose to dial ([`super::fanout`]).
    pub fn chosen(&self) -> Vec<String> {
        lock(&self.chosen).iter().cloned().collect()
    }

    /// The settings this mesh runs with.
    pub fn config(&self) -> &MeshConfig {
        &self.cfg
    }
}

/// A link up now, as the admin endpoints show it.
#[derive(Debug, Clone)]
pub struct LinkStatus {
    pub node: String,
    pub address: String,
    pub outbound: bool,
    /// Since the last frame from the other end.
    pub quiet: Duration,
}

/// The liveness table's counters, for the metrics and the admin endpoints.
#[derive(Debug, Clone, Default)]
pub struct TableStats {
    /// Marks, frames and hellos refused, by reason.
    pub drops: BTreeMap<Refusal, u64>,
    pub beats_accepted: u64,
    /// Another live process runs with our node key.
    pub duplicate_node_key: bool,
    /// The instance of that other process, when known.
    pub duplicate_instance: Option<u64>,
}

impl crate::liveness::MeshView for Mesh {
    fn dead_holders(&self) -> DeadHolders {
        lock(&self.table).dead_holders(clock_now())
    }

    fn dead_split(&self) -> (DeadHolders, Vec<Holder>) {
        lock(&self.table).dead_split(clock_now())
    }

    /// Runtimes not alive, with a beat more than 1.5 heartbeats old, or
    /// whose last link broke less than one expiry ago (a killed process's
    /// sockets close at once: its record is watched from that moment, so a
    /// takeover lands about one expiry after the kill).
    fn suspects(&self) -> Vec<Holder> {
        let now = clock_now();
        let late = self.cfg.heartbeat * 3 / 2;
        // One lock at a time: links, then the table.
        let linked: HashSet<String> = lock(&self.links).values().map(|l| l.node.clone()).collect();
        let lost: Vec<String> = {
            let mut lost = lock(&self.links_lost);
            lost.retain(|_, at| now.saturating_duration_since(*at) < self.cfg.expiry);
            lost.keys()
                .filter(|n| !linked.contains(*n))
                .cloned()
                .collect()
        };
        let table = lock(&self.table);
        let mut out = table.suspects(now, late, |n| linked.contains(n));
        for node in &lost {
            if out.iter().any(|h| &h.node == node) {
                continue;
            }
            if let Some(instance) = table.instance_of(node) {
                out.push(Holder {
                    node: node.clone(),
                    instance,
                });
            }
        }
        out
    }
}
