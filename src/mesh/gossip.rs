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
//! * newer beats of other runtimes only when the other end's copy is at
//!   least `relay_after` old, most stale first, at most `budget` per frame.
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
//! `T − heartbeat + expiry` for the same reason. `relay_after` only sets how
//! old a *live* runtime's copy gets between refreshes: it must stay below
//! `expiry / 2` (plus a heartbeat per hop), or live runtimes would show
//! `UNREACHABLE`. `benches/mesh_sim.rs` measures both sides.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
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
}

impl GossipConfig {
    /// The defaults: relayed beats due once the other end's copy is a
    /// quarter expiry old (at least a heartbeat), so each runtime checks
    /// about `4 / expiry` signatures per second per other runtime instead of
    /// one per heartbeat; identities refreshed every 60 heartbeats.
    pub fn new(heartbeat: Duration, expiry: Duration) -> Self {
        GossipConfig {
            heartbeat,
            expiry,
            relay_after: (expiry / 4).max(heartbeat),
            identity_refresh: heartbeat * 60,
            min_gain: heartbeat / 2,
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
        }
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
    }

    /// Notes the marks the other end sent us: it holds at least those.
    pub fn note_received(&mut self, marks: &[pb::Mark], now: Instant) {
        for m in marks {
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

    /// The marks to send now. `budget` caps the relayed beats that are merely
    /// newer (changes that matter are never held back); the first frame of a
    /// link is not capped.
    pub fn frame(&mut self, table: &PeerTable, now: Instant, budget: usize) -> Vec<pb::Mark> {
        if now.saturating_duration_since(self.identities_since) >= self.cfg.identity_refresh {
            self.identities_since = now;
            for h in self.held.values_mut() {
                h.identity = 0;
            }
        }
        let first = self.frames == 0;
        self.frames += 1;
        let mut out = Vec::new();
        if let Some((own, at)) = table.own_known() {
            let k = Known {
                mark: own,
                seen_at: Some(at),
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
                out.push(m);
            }
        }
        // (urgent, staleness of the other end's copy, node)
        let mut due: Vec<(bool, Duration, &str)> = Vec::new();
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
                due.push((true, Duration::MAX, &k.mark.node));
                continue;
            }
            if !self.lacks(&k) {
                continue;
            }
            match self.held.get(&k.mark.node) {
                Some(h) if h.instance == k.mark.instance && !k.mark.left => {
                    let stale = h
                        .seen_at
                        .map_or(Duration::MAX, |s| now.saturating_duration_since(s));
                    // Our copy must be worth it: the other end's is at
                    // least as fresh as we know, and takes only a gain of
                    // `min_gain` or more.
                    let gain = match (k.seen_at, h.seen_at) {
                        (Some(ours), Some(theirs)) => ours >= theirs + self.cfg.min_gain,
                        (Some(_), None) => true,
                        (None, _) => false,
                    };
                    if gain && (first || stale >= self.cfg.relay_after) {
                        due.push((false, stale, &k.mark.node));
                    }
                }
                _ => due.push((true, Duration::MAX, &k.mark.node)),
            }
        }
        due.sort_by(|a, b| b.cmp(a));
        let mut relayed = 0usize;
        for (urgent, _, node) in due {
            if !urgent && !first {
                if relayed >= budget {
                    continue;
                }
                relayed += 1;
            }
            if let Some(k) = table.known_of(node) {
                out.push(self.take(&k, now));
            }
        }
        if self.held.len() > 2 * table.len() + 16 {
            let peer = self.peer.clone();
            self.held
                .retain(|n, _| table.known_of(n).is_some() || *n == peer);
        }
        out
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
        let f1 = out.frame(&ta, t0, 8);
        assert_eq!(f1.len(), 2, "the first frame carries everything");
        assert!(f1.iter().all(|m| !m.public_key.is_empty()));
        for m in &f1 {
            tb.ingest(m, Some(&a.node), t0).unwrap();
        }
        // Nothing newer: nothing to send.
        assert!(out.frame(&ta, t0 + ms(10), 8).is_empty());
        // Our beat rises: it goes (our own mark with our identity, always).
        beat(&mut ta, &a, 2, t0 + HB);
        let f2 = out.frame(&ta, t0 + HB, 8);
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
        assert!(out.frame(&ta, t0 + ms(2499), 8).is_empty());
        let f3 = out.frame(&ta, t0 + ms(2500), 8);
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
        let f4 = out.frame(&ta, t0 + ms(61_000), 8);
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
        out.note_received(&from_b, t0);
        let f = out.frame(&ta, t0, 8);
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
        assert_eq!(out.frame(&ta, t0, 1).len(), 6, "first frame: all");
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
        assert_eq!(out.frame(&ta, at, 2).len(), 2);
        assert_eq!(out.frame(&ta, at, 2).len(), 2);
        // A leave goes at once, whatever the budget.
        let bye = sign_mark(&others[5], 3, true, "x:1", &Default::default());
        ta.ingest(&bye, Some(&others[5].node), at).unwrap();
        let f = out.frame(&ta, at, 0);
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
        for m in out.frame(&ta, t0, 8) {
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
            out.frame(&ta, late, 8).iter().all(|m| m.node != c.node),
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
        let f = out.frame(&ta, late, 8);
        let sent: Vec<_> = f.iter().filter(|m| m.node == c.node).collect();
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].beat, 3);
        assert_eq!(
            tb.ingest(sent[0], Some(&a.node), late),
            Ok(None),
            "a gain of min_gain or more is taken"
        );
    }
}
