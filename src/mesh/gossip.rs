//! Gossip deltas: what one link sends, as a pure struct (no sockets, no
//! clock of its own).
//!
//! Each link keeps an [`Outbox`]: the version (instance, beat, freshness) of
//! every runtime the other end is known to hold — because we sent it, or
//! because it sent it to us (scuttlebutt's digest, learned from the traffic
//! itself). A frame then carries:
//!
//! * our own newest mark, every heartbeat (the direct detection bound);
//! * every change that matters at once: a runtime the other end lacks, a new
//!   instance (restart), a leave;
//! * newer beats of other runtimes, at most `budget` per frame, by one of
//!   two rules, chosen per link by the other end's hello (`Hello.gossip`):
//!   - **relay trees** (both ends speak them): each runtime subscribes, on
//!     each link, to the runtimes whose copy that link brought it — the link
//!     is their fastest path here ([`super::table::Known::via`]). A
//!     subscribed runtime's beat goes as soon as our copy is `eager_gain`
//!     fresher than the other end's (every second beat at the defaults), so
//!     each beat flows down one tree per runtime and reaches every runtime
//!     about once, instead of once per link. Fresh beats a link brings are
//!     relayed on the others within a quarter heartbeat ([`Outbox::relay`]),
//!     not at the next heartbeat. Nothing else is refreshed by age: a copy
//!     is asked for on every link (`Marks.want`; checked every quarter
//!     heartbeat, asked once a heartbeat, [`PeerTable::due_asks`]) as soon
//!     as the link that brought it is silent (`silent_after`) or gone —
//!     its tree is cut here —, or once it grows `fallback_after` old
//!     anyway; this repairs a tree whose link broke (the answer
//!     re-subscribes on its link) and brings a killed runtime's last beat,
//!     which the eager gain may skip;
//!   - **per-link refresh** (an older sidecar at the other end): every
//!     runtime goes once the other end's copy is `relay_after` old, most
//!     stale first.
//!
//! A relayed runtime's public key, address and labels travel once per link
//! (and again when they change, or every `identity_refresh` in case the
//! other end forgot them); otherwise its mark goes without them
//! (`public_key` empty) and the receiver takes them from its table
//! ([`super::table`]). Our own mark always carries them: they are ~70 bytes
//! per link per heartbeat, and the other end may have refused or forgotten
//! us without our knowing.
//!
//! Why a relayed beat may travel less often than every heartbeat and the
//! expiry bounds still hold: a relayed mark carries its age, so the receiver
//! sets `seen_at` to when the beat first rose at a direct neighbour however
//! late the mark travels. A runtime killed at `T` is then expired everywhere
//! at `seen_at(last beat) + expiry ≤ T + expiry + transit`, provided the
//! last beat reaches each runtime within one expiry of rising (it is newer
//! than any copy, so it is due as soon as a copy is `relay_after` old, and
//! the most stale copies go first); and no earlier than
//! `T − heartbeat + expiry` for the same reason (exactly: no earlier than
//! one expiry after the last beat rose, which is a heartbeat before `T`
//! plus however late the runtime's own timer fired). `relay_after` only sets how
//! old a *live* runtime's copy gets between refreshes: it must stay below
//! `expiry / 2` (plus a heartbeat per hop), or live runtimes would show
//! `UNREACHABLE`. With trees a live runtime's copy is refreshed down its
//! tree every `eager_gain` (rounded up to whole beats) plus at most a
//! quarter heartbeat per hop; the last beat of a killed runtime may be
//! skipped by the eager gain, but every copy `fallback_after` old is asked
//! for on every link each heartbeat, and an ask stays open at the other end
//! for two heartbeats, answered as soon as a fresher copy arrives there: the
//! last beat then spreads at a quarter heartbeat per hop, from
//! `fallback_after` (0.3 expiry) on, long before any copy expires (the
//! lower bound); the upper bound is `seen_at` again. A tree link that
//! breaks is repaired the same way, sooner: the copies it brought are asked
//! for once it has been silent for `silent_after` (1½ heartbeats), and the
//! answer re-subscribes on its link. Asking early changes no bound: an
//! answer is a signed mark with its age, like any other.
//! `benches/mesh_sim.rs` measures both sides.

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::time::{Duration, Instant};

use super::table::{Known, PeerTable};
use crate::proto as pb;

/// Tunables of the deltas.
#[derive(Debug, Clone, Copy)]
pub struct GossipConfig {
    pub heartbeat: Duration,
    pub expiry: Duration,
    /// A newer beat of a relayed runtime is due once the other end's copy is
    /// this old.
    pub relay_after: Duration,
    /// Identities are sent again this often on every link.
    pub identity_refresh: Duration,
    /// A relayed beat goes only if it is at least this much fresher than
    /// the other end's copy: the other end drops a smaller gain unchecked
    /// (the table's `min_gain`), so sending it would waste the budget.
    pub min_gain: Duration,
    /// Relay trees: a runtime the other end subscribed to goes as soon as
    /// our copy is this much fresher than its copy (whatever its age)...
    pub eager_gain: Duration,
    /// ...and a copy of ours this old is asked for on every link, each
    /// heartbeat until a fresher one comes (the fallback that repairs a
    /// tree, and brings a killed runtime's last beat).
    pub fallback_after: Duration,
    /// A link that has heard nothing for this long is silent (it carries
    /// its peer's own beat every heartbeat: it is cut, or the peer stalled).
    /// It no longer feeds the trees it was part of, so the copies it brought
    /// are asked for on the other links at once, whatever their age; and its
    /// runtime is not chosen (another is dialled) until heard again
    /// ([`super::discovery`]).
    pub silent_after: Duration,
}

/// How long (in heartbeats) an ask of the other end stays open: it asks
/// again each heartbeat while it still needs a copy.
const WANT_KEPT_HB: u32 = 2;

/// Most runtimes a link keeps as subscribed or asked for by the other end
/// (against a flood of names; far above any view).
const MAX_NAMES_PER_LINK: usize = 1 << 16;

/// The relay rules this build speaks (`Hello.gossip`): relay trees.
pub const GOSSIP_TREES: u32 = 2;

impl GossipConfig {
    /// The defaults. Per-link refresh (older sidecars): relayed beats due
    /// once the other end's copy is a quarter expiry old (at least a
    /// heartbeat). Relay trees: a subscribed beat goes once `expiry / 8`
    /// fresher (½–1½ heartbeats: every second beat at 1 s / 10 s), and a
    /// copy `0.3 × expiry` old is asked for. Identities refreshed every 60
    /// heartbeats.
    pub fn new(heartbeat: Duration, expiry: Duration) -> Self {
        GossipConfig {
            heartbeat,
            expiry,
            relay_after: (expiry / 4).max(heartbeat),
            identity_refresh: heartbeat * 60,
            min_gain: heartbeat / 2,
            eager_gain: (expiry / 8).clamp(heartbeat / 2, heartbeat * 3 / 2),
            fallback_after: (expiry * 3 / 10).max(heartbeat * 3 / 2),
            silent_after: heartbeat * 3 / 2,
        }
    }
}

/// What the other end of a link holds of one runtime, as far as we know.
#[derive(Debug, Clone, Copy)]
struct Held {
    instance: u64,
    beat: u64,
    left: bool,
    /// When that beat rose, on our clock.
    seen_at: Option<Instant>,
    /// Hash of the identity it holds (0: none known).
    identity: u64,
}

/// One link's view of the other end, and the frames it sends.
#[derive(Debug)]
pub struct Outbox {
    /// The node at the other end (never sent its own marks back)...
    peer: String,
    /// ...from its own address: the same node beating elsewhere is a copied
    /// node key, and the other end must hear of it.
    peer_address: Option<String>,
    cfg: GossipConfig,
    held: HashMap<String, Held>,
    identities_since: Instant,
    frames: u64,
    /// The other end speaks relay trees (its hello said so).
    trees: bool,
    /// Runtimes the other end subscribed to on this link.
    eager: HashSet<String>,
    /// Runtimes we told the other end we subscribe to on this link.
    subscribed: HashSet<String>,
    /// Runtimes the other end asked for, and when: answered once each, as
    /// soon as we hold a fresher copy, or dropped after `WANT_KEPT_HB`
    /// heartbeats (it asks again every heartbeat while it needs one).
    asked: HashMap<String, Instant>,
    /// Our subscriptions must go again in full (a frame may have been lost).
    resubscribe: bool,
}

/// Whether a frame carries nothing (and need not be sent).
pub fn is_empty(f: &pb::Marks) -> bool {
    f.marks.is_empty()
        && f.subscribe.is_empty()
        && f.unsubscribe.is_empty()
        && f.want.is_empty()
        && !f.subscriptions_reset
}

/// A hash of what a mark carries besides its signed facts.
pub fn identity_hash(m: &pb::Mark) -> u64 {
    let mut h = DefaultHasher::new();
    m.public_key.hash(&mut h);
    m.address.hash(&mut h);
    let mut labels: Vec<_> = m.labels.iter().collect();
    labels.sort();
    labels.hash(&mut h);
    h.finish() | 1
}

/// How much fresher our copy (risen at `ours`) is than the other end's
/// (`theirs`); `None` if ours never rose here (restored), so it is no gain.
fn gain(ours: Option<Instant>, theirs: Option<Instant>) -> Option<Duration> {
    match (ours, theirs) {
        (Some(ours), Some(theirs)) => Some(ours.saturating_duration_since(theirs)),
        (Some(_), None) => Some(Duration::MAX),
        (None, _) => None,
    }
}

fn age_ms(seen_at: Option<Instant>, now: Instant, expiry: Duration) -> i64 {
    seen_at
        .map_or(expiry, |s| now.saturating_duration_since(s).min(expiry))
        .as_millis() as i64
}

impl Outbox {
    pub fn new(peer: &str, cfg: GossipConfig, now: Instant) -> Self {
        Outbox {
            peer: peer.to_owned(),
            peer_address: None,
            cfg,
            held: HashMap::new(),
            identities_since: now,
            frames: 0,
            trees: false,
            eager: HashSet::new(),
            subscribed: HashSet::new(),
            asked: HashMap::new(),
            resubscribe: false,
        }
    }

    /// Whether the other end speaks relay trees (`Hello.gossip`).
    pub fn with_trees(mut self, trees: bool) -> Self {
        self.trees = trees;
        self
    }

    /// Whether the other end speaks relay trees.
    pub fn trees(&self) -> bool {
        self.trees
    }

    /// How many runtimes the other end subscribed to on this link.
    pub fn eager_len(&self) -> usize {
        self.eager.len()
    }

    /// The address the other end announced in its hello.
    pub fn with_peer_address(mut self, address: &str) -> Self {
        self.peer_address = Some(address.to_owned());
        self
    }

    /// Frames built so far.
    pub fn frames(&self) -> u64 {
        self.frames
    }

    /// Forgets what the other end holds (a frame may have been lost): the
    /// next frame carries everything again.
    pub fn reset(&mut self) {
        self.held.clear();
        if self.trees {
            self.subscribed.clear();
            self.resubscribe = true;
        }
    }

    /// Notes a frame the other end sent us: it holds at least those marks,
    /// and wants these runtimes eagerly.
    pub fn note_received(&mut self, frame: &pb::Marks, now: Instant) {
        if self.trees {
            if frame.subscriptions_reset {
                self.eager.clear();
            }
            for n in &frame.unsubscribe {
                self.eager.remove(n);
            }
            // Names the table does not know are dropped at the next frame;
            // until then a flood is bounded here.
            for n in &frame.subscribe {
                if self.eager.len() < MAX_NAMES_PER_LINK {
                    self.eager.insert(n.clone());
                }
            }
            for n in &frame.want {
                if self.asked.len() < MAX_NAMES_PER_LINK {
                    self.asked.insert(n.clone(), now);
                }
            }
        }
        for m in &frame.marks {
            let seen = now.checked_sub(Duration::from_millis(m.age_ms.max(0) as u64));
            let identity = if m.public_key.is_empty() {
                None
            } else {
                Some(identity_hash(m))
            };
            let h = self.held.entry(m.node.clone()).or_insert(Held {
                instance: 0,
                beat: 0,
                left: false,
                seen_at: None,
                identity: 0,
            });
            if (m.instance, m.beat) > (h.instance, h.beat) {
                if m.instance > h.instance {
                    h.identity = 0;
                }
                h.instance = m.instance;
                h.beat = m.beat;
                h.left = m.left;
                h.seen_at = seen;
            }
            if let Some(i) = identity {
                if m.instance == h.instance {
                    h.identity = i;
                }
            }
        }
    }

    /// The frame to send now: marks and, with relay trees, changes of our
    /// subscriptions. `budget` caps the relayed beats that are merely newer
    /// (changes that matter are never held back); the first frame of a link
    /// is not capped.
    pub fn frame(&mut self, table: &PeerTable, now: Instant, budget: usize) -> pb::Marks {
        if now.saturating_duration_since(self.identities_since) >= self.cfg.identity_refresh {
            self.identities_since = now;
            for h in self.held.values_mut() {
                h.identity = 0;
            }
        }
        let first = self.frames == 0;
        self.frames += 1;
        let mut out = pb::Marks::default();
        if let Some((own, at)) = table.own_known() {
            let k = Known {
                mark: own,
                seen_at: Some(at),
                via: None,
            };
            if self.lacks(&k) {
                let mut m = self.take(&k, now);
                if m.public_key.is_empty() {
                    // Our own mark always carries our identity (~70 bytes a
                    // heartbeat per link): the other end may have refused us
                    // (a full view) or forgotten us, and nothing tells us so.
                    m.public_key = own.public_key.clone();
                    m.address = own.address.clone();
                    m.labels = own.labels.clone();
                }
                out.marks.push(m);
            }
        }
        // Without trees every copy is refreshed once it is `relay_after`
        // old; with trees, a subscribed runtime by `eager_gain`, the others
        // when asked for.
        self.forget_old_asks(now);
        let mut wanted: Vec<&str> = Vec::new();
        // (urgent, eager, staleness of the other end's copy, node)
        let mut due: Vec<(bool, bool, Duration, &str)> = Vec::new();
        for k in table.known() {
            let echo = k.mark.node == self.peer
                && self
                    .peer_address
                    .as_ref()
                    .is_none_or(|a| *a == k.mark.address);
            if echo || !table.relay_worthy(&k, now) {
                continue;
            }
            if k.mark.node == self.peer {
                // Its own node beating from another address: a copied node
                // key, which it must hear of at once (every frame: whether
                // it "lacks" it cannot be told from its own beats).
                due.push((true, false, Duration::MAX, &k.mark.node));
                continue;
            }
            if self.trees && !k.mark.left && k.via == Some(self.peer.as_str()) {
                wanted.push(&k.mark.node);
            }
            if !self.lacks(&k) {
                continue;
            }
            match self.held.get(&k.mark.node) {
                Some(h) if h.instance == k.mark.instance && !k.mark.left => {
                    let stale = h
                        .seen_at
                        .map_or(Duration::MAX, |s| now.saturating_duration_since(s));
                    // How much fresher our copy is than the other end's:
                    // it takes only a gain of `min_gain` or more.
                    let Some(gain) = gain(k.seen_at, h.seen_at) else {
                        continue;
                    };
                    if gain < self.cfg.min_gain {
                        continue;
                    }
                    let go = if self.trees {
                        (gain >= self.cfg.eager_gain && self.eager.contains(&k.mark.node))
                            || self.asked.contains_key(&k.mark.node)
                    } else {
                        stale >= self.cfg.relay_after
                    };
                    if go || first {
                        due.push((false, go, stale, &k.mark.node));
                    }
                }
                _ => due.push((true, false, Duration::MAX, &k.mark.node)),
            }
        }
        due.sort_by(|a, b| b.cmp(a));
        let mut relayed = 0usize;
        for (urgent, _, _, node) in due {
            if !urgent && !first {
                if relayed >= budget {
                    continue;
                }
                relayed += 1;
            }
            if let Some(k) = table.known_of(node) {
                let m = self.take(&k, now);
                self.asked.remove(node);
                out.marks.push(m);
            }
        }
        if self.trees {
            self.subscriptions(wanted, &mut out);
        }
        if self.held.len() > 2 * table.len() + 16 {
            let peer = self.peer.clone();
            self.held
                .retain(|n, _| table.known_of(n).is_some() || *n == peer);
        }
        if self.eager.len() > table.len() + 16 {
            self.eager.retain(|n| table.known_of(n).is_some());
        }
        out
    }

    /// Between heartbeats, as soon as a frame came in on any link: the
    /// runtimes just taken (`taken`) that the other end subscribed to, if
    /// `eager_gain` fresher than its copy, and the answers to what it asked
    /// for. It looks at those runtimes only, so a beat goes down its tree at
    /// the speed of the network instead of a heartbeat per hop. Nothing
    /// without trees (the heartbeat's [`Outbox::frame`] does it all).
    ///
    /// `revived` (runtimes a fresher beat brought back from `EXPIRED`) go
    /// whether subscribed or not, if `min_gain` fresher than the other
    /// end's copy: after a healed partition no tree carries them, and an
    /// expired copy is asked for by nobody.
    ///
    /// `asks` (copies of ours `fallback_after` old, from
    /// [`PeerTable::due_asks`]) go out as `want`.
    pub fn relay(
        &mut self,
        table: &PeerTable,
        now: Instant,
        taken: &[String],
        revived: &[String],
        asks: &[String],
    ) -> pb::Marks {
        let mut out = pb::Marks::default();
        if !self.trees || self.frames == 0 {
            return out;
        }
        out.want = asks.to_vec();
        self.forget_old_asks(now);
        // (runtime, the gain it needs over the other end's copy)
        let candidates: Vec<(String, Duration)> = taken
            .iter()
            .filter(|n| self.eager.contains(*n))
            .map(|n| (n.clone(), self.cfg.eager_gain))
            .chain(self.asked.keys().map(|n| (n.clone(), self.cfg.min_gain)))
            .chain(revived.iter().map(|n| (n.clone(), self.cfg.min_gain)))
            .collect();
        for (node, needed) in candidates {
            if node == self.peer {
                continue;
            }
            let Some(k) = table.known_of(&node) else {
                continue;
            };
            // (A runtime named twice is sent once: then it no longer lacks.)
            if !table.relay_worthy(&k, now) || !self.lacks(&k) {
                continue;
            }
            if let Some(h) = self.held.get(&node) {
                if h.instance == k.mark.instance && !k.mark.left {
                    match gain(k.seen_at, h.seen_at) {
                        Some(g) if g >= needed => {}
                        _ => continue,
                    }
                }
            }
            let m = self.take(&k, now);
            self.asked.remove(&node);
            out.marks.push(m);
        }
        out
    }

    /// Whether a relay of these fresh beats may send anything: one of them
    /// is subscribed, or the other end asked for something.
    pub fn wants_any(&self, taken: &[String]) -> bool {
        self.trees && (!self.asked.is_empty() || taken.iter().any(|n| self.eager.contains(n)))
    }

    /// Whether the other end asked for something not answered yet.
    pub fn has_asks(&self) -> bool {
        !self.asked.is_empty()
    }

    fn forget_old_asks(&mut self, now: Instant) {
        let kept = self.cfg.heartbeat * WANT_KEPT_HB;
        self.asked
            .retain(|_, at| now.saturating_duration_since(*at) < kept);
    }

    /// Subscribes on this link to the runtimes it brought us (it is their
    /// fastest path here), and unsubscribes from the others.
    fn subscriptions(&mut self, wanted: Vec<&str>, out: &mut pb::Marks) {
        if self.resubscribe {
            self.resubscribe = false;
            self.subscribed.clear();
            out.subscriptions_reset = true;
        }
        let wanted: HashSet<&str> = wanted.into_iter().collect();
        self.subscribed.retain(|n| {
            let keep = wanted.contains(n.as_str());
            if !keep {
                out.unsubscribe.push(n.clone());
            }
            keep
        });
        for n in wanted {
            if !self.subscribed.contains(n) {
                self.subscribed.insert(n.to_owned());
                out.subscribe.push(n.to_owned());
            }
        }
    }

    /// Whether the other end lacks this mark (or a newer one).
    fn lacks(&self, k: &Known<'_>) -> bool {
        match self.held.get(&k.mark.node) {
            None => true,
            Some(h) => {
                (k.mark.instance, k.mark.beat) > (h.instance, h.beat)
                    || (k.mark.left && !h.left && k.mark.instance >= h.instance)
            }
        }
    }

    /// The mark as it goes out (identity only if the other end lacks it),
    /// noted as held.
    fn take(&mut self, k: &Known<'_>, now: Instant) -> pb::Mark {
        let identity = identity_hash(k.mark);
        let h = self.held.entry(k.mark.node.clone()).or_insert(Held {
            instance: 0,
            beat: 0,
            left: false,
            seen_at: None,
            identity: 0,
        });
        let send_identity =
            h.identity != identity || h.instance != k.mark.instance || k.mark.node == self.peer;
        *h = Held {
            instance: k.mark.instance,
            beat: k.mark.beat,
            left: k.mark.left,
            seen_at: k.seen_at,
            identity,
        };
        let mut m = if send_identity {
            k.mark.clone()
        } else {
            pb::Mark {
                node: k.mark.node.clone(),
                instance: k.mark.instance,
                beat: k.mark.beat,
                signature: k.mark.signature.clone(),
                left: k.mark.left,
                ..Default::default()
            }
        };
        m.age_ms = age_ms(k.seen_at, now, self.cfg.expiry);
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mesh::identity::Identity;
    use crate::mesh::marks::sign_mark;
    use crate::mesh::table::TableConfig;

    const HB: Duration = Duration::from_millis(1000);
    const EXPIRY: Duration = Duration::from_millis(10_000);

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn table(id: &Identity) -> PeerTable {
        PeerTable::new(
            TableConfig {
                expiry: EXPIRY,
                max_runtimes: 64,
            },
            &id.node,
            id.instance,
        )
    }

    /// Three fresh runtimes.
    fn three() -> [Identity; 3] {
        [(); 3].map(|()| Identity::ephemeral(1))
    }

    fn beat(t: &mut PeerTable, id: &Identity, b: u64, now: Instant) {
        t.set_own(
            sign_mark(id, b, false, "10.0.0.1:1", &Default::default()),
            now,
        );
    }

    #[test]
    fn identity_travels_once_and_beats_only_when_newer() {
        let [a, b, c] = three();
        let t0 = Instant::now();
        let mut ta = table(&a);
        let mut tb = table(&b);
        beat(&mut ta, &a, 1, t0);
        ta.ingest(
            &sign_mark(&c, 1, false, "10.0.0.3:1", &Default::default()),
            Some(&c.node),
            t0,
        )
        .unwrap();
        let mut out = Outbox::new(&b.node, GossipConfig::new(HB, EXPIRY), t0);
        let f1 = out.frame(&ta, t0, 8).marks;
        assert_eq!(f1.len(), 2, "the first frame carries everything");
        assert!(f1.iter().all(|m| !m.public_key.is_empty()));
        for m in &f1 {
            tb.ingest(m, Some(&a.node), t0).unwrap();
        }
        // Nothing newer: nothing to send.
        assert!(out.frame(&ta, t0 + ms(10), 8).marks.is_empty());
        // Our beat rises: it goes (our own mark with our identity, always).
        beat(&mut ta, &a, 2, t0 + HB);
        let f2 = out.frame(&ta, t0 + HB, 8).marks;
        assert_eq!(f2.len(), 1);
        assert!(!f2[0].public_key.is_empty());
        assert_eq!(tb.ingest(&f2[0], Some(&a.node), t0 + HB), Ok(None));
        assert_eq!(tb.peer(&a.node, t0 + HB).unwrap().beat, 2);
        // C's newer beat is relayed only once B's copy is relay_after old
        // (2.5 s: a quarter of the expiry).
        ta.ingest(
            &sign_mark(&c, 2, false, "10.0.0.3:1", &Default::default()),
            Some(&c.node),
            t0 + ms(1100),
        )
        .unwrap();
        ta.ingest(
            &sign_mark(&c, 3, false, "10.0.0.3:1", &Default::default()),
            Some(&c.node),
            t0 + ms(1500),
        )
        .unwrap();
        assert!(out.frame(&ta, t0 + ms(2499), 8).marks.is_empty());
        let f3 = out.frame(&ta, t0 + ms(2500), 8).marks;
        assert_eq!(f3.len(), 1);
        assert_eq!((f3[0].node.as_str(), f3[0].beat), (c.node.as_str(), 3));
        // A relayed runtime's identity went with the first frame only.
        assert!(f3[0].public_key.is_empty() && f3[0].address.is_empty());
        assert_eq!(tb.ingest(&f3[0], Some(&a.node), t0 + ms(2500)), Ok(None));
        assert_eq!(
            tb.peer(&c.node, t0 + ms(2500)).unwrap().address,
            "10.0.0.3:1"
        );
        assert_eq!(f3[0].age_ms, 1000, "the age travels with the mark");
        // A table that forgot C cannot take a mark without identity.
        let mut fresh = table(&b);
        assert_eq!(
            fresh.ingest(&f3[0], Some(&a.node), t0 + ms(2000)),
            Err(crate::mesh::marks::Refusal::UnknownIdentity)
        );
        // After the identity refresh the identity travels again.
        ta.ingest(
            &sign_mark(&c, 4, false, "10.0.0.3:1", &Default::default()),
            Some(&c.node),
            t0 + ms(61_000),
        )
        .unwrap();
        let f4 = out.frame(&ta, t0 + ms(61_000), 8).marks;
        assert!(f4.iter().any(|m| m.node == c.node));
        assert!(f4.iter().all(|m| !m.public_key.is_empty()));
    }

    #[test]
    fn what_the_other_end_sent_is_not_sent_back_and_its_own_never() {
        let [a, b, c] = three();
        let t0 = Instant::now();
        let mut ta = table(&a);
        beat(&mut ta, &a, 1, t0);
        let from_b = vec![
            sign_mark(&b, 4, false, "b:1", &Default::default()),
            sign_mark(&c, 7, false, "c:1", &Default::default()),
        ];
        for m in &from_b {
            ta.ingest(m, Some(&b.node), t0).unwrap();
        }
        let mut out = Outbox::new(&b.node, GossipConfig::new(HB, EXPIRY), t0);
        out.note_received(
            &pb::Marks {
                marks: from_b,
                ..Default::default()
            },
            t0,
        );
        let f = out.frame(&ta, t0, 8).marks;
        assert_eq!(f.len(), 1, "only our own mark: {f:?}");
        assert_eq!(f[0].node, a.node);
    }

    #[test]
    fn changes_that_matter_skip_the_budget_and_stale_copies_go_first() {
        let a = Identity::ephemeral(1);
        let b = Identity::ephemeral(1);
        let t0 = Instant::now();
        let mut ta = table(&a);
        let others: Vec<Identity> = (0..6).map(|_| Identity::ephemeral(1)).collect();
        for o in &others {
            ta.ingest(
                &sign_mark(o, 1, false, "x:1", &Default::default()),
                Some(&o.node),
                t0,
            )
            .unwrap();
        }
        let mut out = Outbox::new(&b.node, GossipConfig::new(HB, EXPIRY), t0);
        assert_eq!(out.frame(&ta, t0, 1).marks.len(), 6, "first frame: all");
        // All six beat again; after relay_after only the budget goes.
        for (i, o) in others.iter().enumerate() {
            ta.ingest(
                &sign_mark(o, 2, false, "x:1", &Default::default()),
                Some(&o.node),
                t0 + ms(500 + 100 * i as u64),
            )
            .unwrap();
        }
        let at = t0 + ms(2500);
        assert_eq!(out.frame(&ta, at, 2).marks.len(), 2);
        assert_eq!(out.frame(&ta, at, 2).marks.len(), 2);
        // A leave goes at once, whatever the budget.
        let bye = sign_mark(&others[5], 3, true, "x:1", &Default::default());
        ta.ingest(&bye, Some(&others[5].node), at).unwrap();
        let f = out.frame(&ta, at, 0).marks;
        assert_eq!(f.len(), 1);
        assert!(f[0].left);
    }

    #[test]
    fn a_beat_the_other_end_would_drop_as_no_fresher_is_not_sent() {
        let [a, b, c] = three();
        let t0 = Instant::now();
        let mut ta = table(&a);
        let mut tb = table(&b).with_min_gain(HB / 2);
        ta.ingest(
            &sign_mark(&c, 1, false, "c:1", &Default::default()),
            Some(&c.node),
            t0,
        )
        .unwrap();
        let mut out = Outbox::new(&b.node, GossipConfig::new(HB, EXPIRY), t0);
        for m in out.frame(&ta, t0, 8).marks {
            let _ = tb.ingest(&m, Some(&a.node), t0);
        }
        // C's next beat rose only 400 ms after the copy B holds: B would drop
        // it unchecked (min_gain 500 ms), so it does not go, stale or not.
        ta.ingest(
            &sign_mark(&c, 2, false, "c:1", &Default::default()),
            Some(&c.node),
            t0 + ms(400),
        )
        .unwrap();
        let late = t0 + ms(3000);
        assert!(
            out.frame(&ta, late, 8)
                .marks
                .iter()
                .all(|m| m.node != c.node),
            "a gain under min_gain went"
        );
        // What it would have met: B drops it as not newer.
        let mut m = sign_mark(&c, 2, false, "c:1", &Default::default());
        m.age_ms = 2600;
        assert_eq!(
            tb.ingest(&m, Some(&a.node), late),
            Err(crate::mesh::marks::Refusal::NotNewer)
        );
        // A beat 600 ms fresher than B's copy goes.
        ta.ingest(
            &sign_mark(&c, 3, false, "c:1", &Default::default()),
            Some(&c.node),
            t0 + ms(600),
        )
        .unwrap();
        let f = out.frame(&ta, late, 8).marks;
        let sent: Vec<_> = f.iter().filter(|m| m.node == c.node).collect();
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].beat, 3);
        assert_eq!(
            tb.ingest(sent[0], Some(&a.node), late),
            Ok(None),
            "a gain of min_gain or more is taken"
        );
    }

    fn mark_at(t: &mut PeerTable, id: &Identity, b: u64, via: &str, at: Instant) {
        t.ingest(
            &sign_mark(id, b, false, "x:1", &Default::default()),
            Some(via),
            at,
        )
        .unwrap();
    }

    fn subs(f: &pb::Marks) -> (Vec<&str>, Vec<&str>) {
        (
            f.subscribe.iter().map(String::as_str).collect(),
            f.unsubscribe.iter().map(String::as_str).collect(),
        )
    }

    #[test]
    fn a_link_subscribes_to_the_runtimes_it_brought_and_drops_those_another_brought_fresher() {
        let [a, b, c] = three();
        let d = Identity::ephemeral(1);
        let t0 = Instant::now();
        let cfg = GossipConfig::new(HB, EXPIRY);
        let mut ta = table(&a).with_min_gain(cfg.min_gain);
        beat(&mut ta, &a, 1, t0);
        let mut to_b = Outbox::new(&b.node, cfg, t0).with_trees(true);
        let mut to_d = Outbox::new(&d.node, cfg, t0).with_trees(true);
        // B brings C: we want C from B, eagerly.
        mark_at(&mut ta, &c, 1, &b.node, t0);
        let f = to_b.frame(&ta, t0, 8);
        assert_eq!(subs(&f), (vec![c.node.as_str()], vec![]));
        assert_eq!(subs(&to_d.frame(&ta, t0, 8)), (vec![], vec![]));
        // Told once.
        assert_eq!(subs(&to_b.frame(&ta, t0 + ms(10), 8)), (vec![], vec![]));
        // D brings a fresher copy of C: D is now the faster path.
        mark_at(&mut ta, &c, 2, &d.node, t0 + HB);
        assert_eq!(
            subs(&to_b.frame(&ta, t0 + HB, 8)),
            (vec![], vec![c.node.as_str()])
        );
        assert_eq!(
            subs(&to_d.frame(&ta, t0 + HB, 8)),
            (vec![c.node.as_str()], vec![])
        );
        // A link never subscribes to the runtime at its other end (its own
        // mark comes every heartbeat anyway).
        mark_at(&mut ta, &b, 1, &b.node, t0 + HB);
        assert!(!to_b.frame(&ta, t0 + HB, 8).subscribe.contains(&b.node));
        // A link to an older sidecar (no trees) sends no subscriptions.
        let mut old = Outbox::new(&d.node, cfg, t0);
        let f = old.frame(&ta, t0 + HB, 8);
        assert!(f.subscribe.is_empty() && f.unsubscribe.is_empty() && !f.subscriptions_reset);
    }

    #[test]
    fn a_subscribed_runtime_goes_at_the_eager_gain_the_others_only_when_asked() {
        let [a, b, c] = three();
        let d = Identity::ephemeral(1);
        let t0 = Instant::now();
        let cfg = GossipConfig::new(HB, EXPIRY);
        assert_eq!(cfg.eager_gain, ms(1250));
        assert_eq!(cfg.fallback_after, ms(3000));
        let mut ta = table(&a).with_min_gain(cfg.min_gain);
        let mut out = Outbox::new(&b.node, cfg, t0).with_trees(true);
        mark_at(&mut ta, &c, 1, &c.node, t0);
        mark_at(&mut ta, &d, 1, &d.node, t0);
        let first = out.frame(&ta, t0, 8);
        assert_eq!(first.marks.len(), 2, "the first frame carries everything");
        // B subscribes to C (we are its fastest path to C), not to D.
        out.note_received(
            &pb::Marks {
                subscribe: vec![c.node.clone()],
                ..Default::default()
            },
            t0,
        );
        assert_eq!(out.eager_len(), 1);
        let sent = |f: &pb::Marks| -> Vec<(String, u64)> {
            f.marks.iter().map(|m| (m.node.clone(), m.beat)).collect()
        };
        // One heartbeat fresher: under the eager gain, nothing goes.
        mark_at(&mut ta, &c, 2, &c.node, t0 + HB);
        mark_at(&mut ta, &d, 2, &d.node, t0 + HB);
        assert!(sent(&out.frame(&ta, t0 + HB, 8)).is_empty());
        // Two heartbeats fresher: C goes at once, D does not, however old
        // B's copy of it gets (B asks for it when it needs it).
        mark_at(&mut ta, &c, 3, &c.node, t0 + 2 * HB);
        mark_at(&mut ta, &d, 3, &d.node, t0 + 2 * HB);
        assert_eq!(
            sent(&out.frame(&ta, t0 + 2 * HB, 8)),
            vec![(c.node.clone(), 3)]
        );
        mark_at(&mut ta, &d, 4, &d.node, t0 + 3 * HB);
        assert!(sent(&out.frame(&ta, t0 + 5 * HB, 8)).is_empty());
        // Asked for: D goes, once.
        out.note_received(
            &pb::Marks {
                want: vec![d.node.clone()],
                ..Default::default()
            },
            t0 + 5 * HB,
        );
        assert_eq!(
            sent(&out.frame(&ta, t0 + 5 * HB, 8)),
            vec![(d.node.clone(), 4)]
        );
        assert!(sent(&out.frame(&ta, t0 + 5 * HB, 8)).is_empty());
        // Unsubscribed: C goes no more.
        out.note_received(
            &pb::Marks {
                unsubscribe: vec![c.node.clone()],
                ..Default::default()
            },
            t0 + 5 * HB,
        );
        mark_at(&mut ta, &c, 5, &c.node, t0 + 5 * HB);
        assert!(sent(&out.frame(&ta, t0 + 5 * HB, 8)).is_empty());
        // A leave goes at once on every link, subscribed or not.
        let bye = sign_mark(&d, 6, true, "x:1", &Default::default());
        ta.ingest(&bye, Some(&d.node), t0 + 5 * HB).unwrap();
        let f = out.frame(&ta, t0 + 5 * HB, 0);
        assert_eq!(f.marks.len(), 1);
        assert!(f.marks[0].left);
    }

    #[test]
    fn a_copy_older_than_the_fallback_is_asked_for_once_a_heartbeat_until_it_expires() {
        let [a, b, c] = three();
        let d = Identity::ephemeral(1);
        let t0 = Instant::now();
        let cfg = GossipConfig::new(HB, EXPIRY);
        let mut ta = table(&a);
        mark_at(&mut ta, &c, 1, &b.node, t0);
        mark_at(&mut ta, &d, 1, &b.node, t0 + ms(500));
        let asks = |t: &mut PeerTable, at: Instant| {
            let mut v = t.due_asks(at, cfg.fallback_after, HB, |_| false);
            v.sort();
            v
        };
        assert!(asks(&mut ta, t0 + cfg.fallback_after - ms(1)).is_empty());
        assert_eq!(asks(&mut ta, t0 + cfg.fallback_after), vec![c.node.clone()]);
        // Asked: not again within the heartbeat (the check runs every
        // quarter heartbeat), then again.
        assert!(asks(&mut ta, t0 + cfg.fallback_after + ms(250)).is_empty());
        let mut both = vec![c.node.clone(), d.node.clone()];
        both.sort();
        assert_eq!(asks(&mut ta, t0 + cfg.fallback_after + HB), both);
        // Expired: it is dead, not late; nobody is asked any more.
        assert_eq!(asks(&mut ta, t0 + EXPIRY + ms(100)), vec![d.node.clone()]);
        // A fresher copy ends the asking.
        mark_at(&mut ta, &d, 9, &b.node, t0 + EXPIRY + ms(200));
        assert!(asks(&mut ta, t0 + EXPIRY + 2 * HB).is_empty());
        // The asks go out as `want` on every link that speaks trees, with
        // the next relay; never to an older sidecar.
        let mut out = Outbox::new(&b.node, cfg, t0).with_trees(true);
        let mut old = Outbox::new(&b.node, cfg, t0);
        out.frame(&ta, t0, 8);
        old.frame(&ta, t0, 8);
        let want = vec![c.node.clone()];
        assert_eq!(out.relay(&ta, t0, &[], &[], &want).want, want);
        assert!(old.relay(&ta, t0, &[], &[], &want).want.is_empty());
        // The heartbeat's frame asks for nothing by itself.
        assert!(out.frame(&ta, t0 + 5 * HB, 8).want.is_empty());
    }

    #[test]
    fn the_copies_a_silent_link_brought_are_asked_for_at_once_whatever_their_age() {
        let [a, b, c] = three();
        let d = Identity::ephemeral(1);
        let t0 = Instant::now();
        let cfg = GossipConfig::new(HB, EXPIRY);
        let mut ta = table(&a);
        // C came through B, D through C (its own link).
        mark_at(&mut ta, &c, 1, &b.node, t0);
        mark_at(&mut ta, &d, 1, &c.node, t0);
        let at = t0 + ms(200);
        assert!(ms(200) < cfg.fallback_after);
        let asks = |t: &mut PeerTable, at: Instant, quiet: &str| {
            let mut v = t.due_asks(at, cfg.fallback_after, HB, |via| via == quiet);
            v.sort();
            v
        };
        // No link silent: young copies are not asked for.
        assert!(asks(&mut ta, at, "nobody").is_empty());
        // B went silent: what it brought (C) is asked for at once; D, which
        // came through C, is not.
        assert_eq!(asks(&mut ta, at, &b.node), vec![c.node.clone()]);
        // Once a heartbeat, while B stays silent.
        assert!(asks(&mut ta, at + HB / 2, &b.node).is_empty());
        assert_eq!(asks(&mut ta, at + HB, &b.node), vec![c.node.clone()]);
        // A fresher copy through another link (D) ends it: C's tree is
        // mended, B's silence no longer matters to it.
        mark_at(&mut ta, &c, 3, &d.node, at + HB + ms(10));
        assert!(asks(&mut ta, at + 2 * HB, &b.node).is_empty());
        // An expired copy (D's) is not asked for, silent link or not; C,
        // old by now, is asked for by its age.
        assert_eq!(asks(&mut ta, t0 + EXPIRY, &c.node), vec![c.node.clone()]);
        assert_eq!(cfg.silent_after, HB * 3 / 2);
    }

    #[test]
    fn a_lost_frame_sends_every_subscription_again_and_the_other_end_starts_over() {
        let [a, b, c] = three();
        let d = Identity::ephemeral(1);
        let t0 = Instant::now();
        let cfg = GossipConfig::new(HB, EXPIRY);
        let mut ta = table(&a);
        let mut out = Outbox::new(&b.node, cfg, t0).with_trees(true);
        mark_at(&mut ta, &c, 1, &b.node, t0);
        mark_at(&mut ta, &d, 1, &b.node, t0);
        let mut f = out.frame(&ta, t0, 8);
        f.subscribe.sort();
        assert_eq!(f.subscribe.len(), 2);
        assert!(!f.subscriptions_reset);
        // The frame after a lost one: all of them, as a reset.
        out.reset();
        let g = out.frame(&ta, t0 + HB, 8);
        assert!(g.subscriptions_reset);
        assert_eq!(g.subscribe.len(), 2);
        // The other end: a reset voids what it had.
        let mut theirs = Outbox::new(&a.node, cfg, t0).with_trees(true);
        theirs.note_received(
            &pb::Marks {
                subscribe: vec![c.node.clone(), "gone".into()],
                ..Default::default()
            },
            t0,
        );
        assert_eq!(theirs.eager_len(), 2);
        theirs.note_received(
            &pb::Marks {
                subscribe: vec![d.node.clone()],
                subscriptions_reset: true,
                ..Default::default()
            },
            t0,
        );
        assert_eq!(theirs.eager_len(), 1);
        // A sidecar without trees ignores subscriptions.
        let mut old = Outbox::new(&a.node, cfg, t0);
        old.note_received(&g, t0);
        assert_eq!(old.eager_len(), 0);
    }

    #[test]
    fn an_ask_stays_open_until_a_fresher_copy_comes_for_two_heartbeats_at_most() {
        let [a, b, c] = three();
        let t0 = Instant::now();
        let cfg = GossipConfig::new(HB, EXPIRY);
        let mut ta = table(&a);
        mark_at(&mut ta, &c, 1, &c.node, t0);
        let mut out = Outbox::new(&b.node, cfg, t0).with_trees(true);
        out.frame(&ta, t0, 8);
        let ask = |out: &mut Outbox, at: Instant| {
            out.note_received(
                &pb::Marks {
                    want: vec![c.node.clone()],
                    ..Default::default()
                },
                at,
            )
        };
        // B asks; we hold nothing fresher than what we sent it: nothing goes,
        // but the ask stays open...
        ask(&mut out, t0 + HB);
        assert!(out.relay(&ta, t0 + HB, &[], &[], &[]).marks.is_empty());
        assert!(out.has_asks());
        // ...and the fresher beat that comes next goes at once.
        mark_at(&mut ta, &c, 2, &c.node, t0 + ms(1500));
        let f = out.relay(&ta, t0 + ms(1500), std::slice::from_ref(&c.node), &[], &[]);
        assert_eq!(f.marks.len(), 1);
        assert_eq!(f.marks[0].beat, 2);
        assert!(!out.has_asks(), "answered once");
        // An ask not renewed lapses after two heartbeats.
        ask(&mut out, t0 + 2 * HB);
        mark_at(&mut ta, &c, 3, &c.node, t0 + 4 * HB);
        assert!(out.relay(&ta, t0 + 4 * HB, &[], &[], &[]).marks.is_empty());
        assert!(!out.has_asks());
    }

    #[test]
    fn a_runtime_back_from_expired_goes_on_every_link_subscribed_or_not() {
        let [a, b, c] = three();
        let t0 = Instant::now();
        let cfg = GossipConfig::new(HB, EXPIRY);
        let mut ta = table(&a);
        mark_at(&mut ta, &c, 1, &c.node, t0);
        let mut out = Outbox::new(&b.node, cfg, t0).with_trees(true);
        out.frame(&ta, t0, 8);
        // C was cut off past its expiry, then beats again (a healed
        // partition): B never subscribed to C here, yet C goes at once.
        let back = t0 + EXPIRY + 2 * HB;
        ta.tick(back - HB);
        mark_at(&mut ta, &c, 12, &c.node, back);
        assert_eq!(ta.take_revived(), vec![c.node.clone()]);
        assert!(out
            .relay(&ta, back, std::slice::from_ref(&c.node), &[], &[])
            .marks
            .is_empty());
        let f = out.relay(&ta, back, &[], std::slice::from_ref(&c.node), &[]);
        assert_eq!(f.marks.len(), 1);
        assert_eq!(f.marks[0].beat, 12);
        // Only back from EXPIRED: a fresher beat of a live runtime is not.
        mark_at(&mut ta, &c, 14, &c.node, back + 2 * HB);
        assert!(ta.take_revived().is_empty());
    }
}
