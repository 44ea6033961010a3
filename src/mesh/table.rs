//! The liveness table: a pure struct. Marks in, `seen_at` out, states
//! computed from an injected monotonic `now`. No sockets, no clocks of its
//! own, so every rule is unit-tested with made-up instants.
//!
//! Rules (SPEC §4.2):
//! * a mark is accepted only if it verifies and is newer (higher instance, or
//!   same instance with a higher beat);
//! * `seen_at = now - min(age, expiry)`, and never moves backwards for the
//!   same instance: a relay cannot keep a dead runtime alive past one expiry;
//! * `ALIVE` while `now - seen_at <= expiry / 2`, `UNREACHABLE` until
//!   `expiry`, then `EXPIRED`; `LEFT` after a signed leave;
//! * a higher instance of a known node is a restart (counted); marks of older
//!   instances are dropped, so a stale mark relayed late never revives one;
//! * `LEFT` is final for an instance: no later mark of it is taken;
//! * a mark may arrive without its identity (public key, address, labels:
//!   links send those once, see [`super::gossip`]); it takes them from the
//!   known entry, or is dropped (`unknown_identity`) if there is none;
//! * runtimes `LEFT` or `EXPIRED` for longer than the forget time are dropped
//!   from the view; a full view evicts the longest-dead entry first (a
//!   death not reported yet is reported as it goes) and refuses a newcomer
//!   only when no entry is dead (`ALIVE` or `UNREACHABLE`: maybe alive).
//!
//! Forgetting is safe for claims: a forgotten holder is *unknown*, and an
//! unknown holder is never dead here (the store lease decides, as for a
//! runtime without a mesh). It is dropped from frames two expiries after it
//! died, so nobody relays it when anyone forgets it (forget ≥ 3 × expiry);
//! a late stale copy would come back `EXPIRED` (its age is clamped to one
//! expiry) and be forgotten again, never `ALIVE`.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use super::marks::{prepare_mark, verify_mark_keyed, verify_prepared, Prepared, Refusal};
use crate::claim::{DeadHolders, Holder};
use crate::proto as pb;
use ed25519_dalek::VerifyingKey;

/// A change worth telling watchers about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Change {
    Joined,
    Alive,
    Unreachable,
    Expired,
    Restarted,
    Left,
}

impl Change {
    /// The change of a runtime whose state became `st`.
    fn to(st: pb::PeerState) -> Change {
        match st {
            pb::PeerState::Alive => Change::Alive,
            pb::PeerState::Unreachable => Change::Unreachable,
            pb::PeerState::Left => Change::Left,
            _ => Change::Expired,
        }
    }

    pub fn kind(self) -> pb::PeerEventKind {
        match self {
            Change::Joined => pb::PeerEventKind::Joined,
            Change::Alive => pb::PeerEventKind::Alive,
            Change::Unreachable => pb::PeerEventKind::Unreachable,
            Change::Expired => pb::PeerEventKind::Expired,
            Change::Restarted => pb::PeerEventKind::Restarted,
            Change::Left => pb::PeerEventKind::Left,
        }
    }
}

#[derive(Debug, Clone)]
struct Entry {
    /// The newest accepted mark (relayed verbatim, with a fresh age).
    mark: pb::Mark,
    /// When this runtime's beat was last seen rising; `None` = never fresh
    /// (restored from disk).
    seen_at: Option<Instant>,
    /// When it was restored from disk (`seen_at` is `None` until it beats).
    restored_at: Option<Instant>,
    restarts: u32,
    /// The state last reported, to detect transitions.
    reported: pb::PeerState,
    /// Last frame received over a direct link with this runtime.
    direct_rx: Option<Instant>,
    /// Last newer mark of it received from another runtime (a relay).
    relayed_rx: Option<Instant>,
    /// When its signed leave was taken in.
    left_at: Option<Instant>,
    /// When we last asked our links for a fresher copy of it.
    asked_at: Option<Instant>,
    /// The link (the node at its other end) that brought the copy we hold;
    /// `None` if restored from disk. A link asks for eager relay of the
    /// runtimes it brought ([`super::gossip`]).
    via: Option<String>,
    /// Its public key, decoded and proven to hash to the node, for the
    /// next mark's check.
    key: Option<VerifyingKey>,
}

impl Entry {
    /// Since when this runtime is known dead (`LEFT` or `EXPIRED`), if it is.
    fn dead_since(&self, now: Instant, expiry: Duration) -> Option<Instant> {
        match state_of(self, now, expiry) {
            pb::PeerState::Left => self.left_at.or(self.seen_at).or(self.restored_at),
            pb::PeerState::Expired => self
                .seen_at
                .or(self.restored_at)
                .map(|t| t + expiry)
                .or(Some(now)),
            _ => None,
        }
    }
}

/// What a link needs to know about one runtime to decide whether to relay it.
#[derive(Debug, Clone, Copy)]
pub struct Known<'a> {
    pub mark: &'a pb::Mark,
    /// When its newest beat rose, on our clock (`None`: restored, not fresh).
    pub seen_at: Option<Instant>,
    /// The link that brought that beat (`None`: restored, or our own).
    pub via: Option<&'a str>,
}

/// Tunables of the table.
#[derive(Debug, Clone, Copy)]
pub struct TableConfig {
    pub expiry: Duration,
    /// Most runtimes kept (a bound against floods).
    pub max_runtimes: usize,
}

pub struct PeerTable {
    cfg: TableConfig,
    /// How long a `LEFT` or `EXPIRED` runtime is kept before it is dropped.
    forget: Duration,
    /// A relayed beat of the same instance must make an entry this much
    /// fresher to be taken (zero: any newer beat).
    min_gain: Duration,
    self_node: String,
    self_instance: u64,
    own: Option<(pb::Mark, Instant)>,
    peers: HashMap<String, Entry>,
    drops: BTreeMap<Refusal, u64>,
    beats: u64,
    /// Marks about our own node from another instance: (instance, beat).
    foreign_self: Option<(u64, u64)>,
    duplicate_key: bool,
    /// Deaths reported as their entries were evicted, for the watchers.
    evicted: Vec<(Change, pb::Peer)>,
    /// Runtimes held `EXPIRED` that a fresher beat brought back (a healed
    /// partition), for the links to pass on at once.
    revived: Vec<String>,
}

impl PeerTable {
    pub fn new(cfg: TableConfig, self_node: &str, self_instance: u64) -> Self {
        PeerTable {
            cfg,
            forget: cfg.expiry * DEFAULT_FORGET_EXPIRIES,
            min_gain: Duration::ZERO,
            self_node: self_node.to_owned(),
            self_instance,
            own: None,
            peers: HashMap::new(),
            drops: BTreeMap::new(),
            beats: 0,
            foreign_self: None,
            duplicate_key: false,
            evicted: Vec::new(),
            revived: Vec::new(),
        }
    }

    pub fn expiry(&self) -> Duration {
        self.cfg.expiry
    }

    /// Sets the forget time (at least three expiries: see the module doc).
    pub fn with_forget(mut self, forget: Duration) -> Self {
        self.forget = forget.max(self.cfg.expiry * 3);
        self
    }

    /// Relayed beats must freshen an entry by `gain` to be checked and
    /// taken (half a heartbeat is the mesh's choice: the final beat of a
    /// killed runtime is a heartbeat fresher than the one before, so it is
    /// always taken and the lower detection bound holds).
    pub fn with_min_gain(mut self, gain: Duration) -> Self {
        self.min_gain = gain;
        self
    }

    pub fn forget_after(&self) -> Duration {
        self.forget
    }

    /// How many runtimes the view holds.
    pub fn len(&self) -> usize {
        self.peers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.peers.is_empty()
    }

    /// Every known runtime with its freshness, for links deciding what to
    /// relay (see [`super::gossip`]).
    pub fn known(&self) -> impl Iterator<Item = Known<'_>> {
        self.peers.values().map(|e| Known {
            mark: &e.mark,
            seen_at: e.seen_at,
            via: e.via.as_deref(),
        })
    }

    /// The signed mark of one runtime and its freshness.
    pub fn known_of(&self, node: &str) -> Option<Known<'_>> {
        self.peers.get(node).map(|e| Known {
            mark: &e.mark,
            seen_at: e.seen_at,
            via: e.via.as_deref(),
        })
    }

    /// Our own newest mark and when it rose.
    pub fn own_known(&self) -> Option<(&pb::Mark, Instant)> {
        self.own.as_ref().map(|(m, at)| (m, *at))
    }

    /// Whether a runtime's newest mark is worth relaying at `now`: fresh
    /// within two expiries, or left within two expiries. Older ones are dead
    /// everywhere by now; relaying them would only delay forgetting.
    pub fn relay_worthy(&self, k: &Known<'_>, now: Instant) -> bool {
        let horizon = self.cfg.expiry * 2;
        let Some(seen) = k.seen_at else { return false };
        if k.mark.left {
            let at = self
                .peers
                .get(&k.mark.node)
                .and_then(|e| e.left_at)
                .unwrap_or(seen);
            return now.saturating_duration_since(at) < horizon;
        }
        now.saturating_duration_since(seen) < horizon
    }

    /// Records this runtime's own newest mark, made at `now`.
    pub fn set_own(&mut self, mark: pb::Mark, now: Instant) {
        self.own = Some((mark, now));
    }

    pub fn own(&self) -> Option<&pb::Mark> {
        self.own.as_ref().map(|(m, _)| m)
    }

    /// Our own beat and how long ago it rose.
    pub fn own_beat(&self, now: Instant) -> (u64, i64) {
        match &self.own {
            Some((m, at)) => (
                m.beat,
                now.saturating_duration_since(*at).as_millis() as i64,
            ),
            None => (0, 0),
        }
    }

    /// Restores a runtime known before a restart: who was there, never
    /// freshness. It is never `ALIVE` until it beats again; for one expiry
    /// after `now` it is `UNREACHABLE` (not known dead: a live runtime has
    /// had no chance to reach us yet, so its runs still exclude), then
    /// `EXPIRED`. Without this grace a restarted sidecar would take over
    /// every run of every live peer in the moments before its links bring
    /// their first beats.
    pub fn restore(&mut self, mark: pb::Mark, now: Instant) {
        if mark.node == self.self_node || self.peers.contains_key(&mark.node) {
            return;
        }
        let Ok(key) = verify_mark_keyed(&mark) else {
            return;
        };
        self.peers.insert(
            mark.node.clone(),
            Entry {
                mark,
                seen_at: None,
                restored_at: Some(now),
                restarts: 0,
                reported: pb::PeerState::Unreachable,
                direct_rx: None,
                relayed_rx: None,
                left_at: None,
                asked_at: None,
                via: None,
                key: Some(key),
            },
        );
    }

    fn drop_mark(&mut self, r: Refusal) -> Refusal {
        *self.drops.entry(r).or_default() += 1;
        r
    }

    /// Takes in one mark, received over a link with `from` at `now`.
    pub fn ingest(
        &mut self,
        mark: &pb::Mark,
        from: Option<&str>,
        now: Instant,
    ) -> Result<Option<Change>, Refusal> {
        // One mark in, one outcome out.
        match self
            .ingest_batch(std::slice::from_ref(mark), from, now)
            .pop()
        {
            Some(outcome) => outcome,
            None => Err(Refusal::Malformed),
        }
    }

    /// Takes in a frame's marks, with the outcome of each as
    /// [`PeerTable::ingest`] would give it, but checks their signatures in
    /// one batch ([`super::marks::verify_prepared`]). A frame naming one
    /// runtime twice is taken one mark at a time (the second depends on the
    /// first).
    pub fn ingest_frame(
        &mut self,
        marks: &[pb::Mark],
        from: Option<&str>,
        now: Instant,
    ) -> Vec<Result<Option<Change>, Refusal>> {
        let mut names = std::collections::HashSet::with_capacity(marks.len());
        if marks.iter().all(|m| names.insert(m.node.as_str())) {
            self.ingest_batch(marks, from, now)
        } else {
            marks.iter().map(|m| self.ingest(m, from, now)).collect()
        }
    }

    /// Marks naming distinct runtimes: the cheap checks of each, one
    /// signature check of all, then each taken in order.
    fn ingest_batch(
        &mut self,
        marks: &[pb::Mark],
        from: Option<&str>,
        now: Instant,
    ) -> Vec<Result<Option<Change>, Refusal>> {
        let mut out = Vec::with_capacity(marks.len());
        let mut pending = Vec::new();
        let mut checks: Vec<Prepared> = Vec::new();
        for (i, m) in marks.iter().enumerate() {
            let admitted = self.admit(m, from, now).and_then(|mark| {
                let known_key = self.peers.get(&mark.node).and_then(|e| e.key);
                match prepare_mark(&mark, known_key.as_ref()) {
                    Ok(p) => Ok((mark, p)),
                    Err(r) => Err(self.drop_mark(r)),
                }
            });
            match admitted {
                Ok((mark, p)) => {
                    out.push(Ok(None));
                    pending.push((i, mark));
                    checks.push(p);
                }
                Err(r) => out.push(Err(r)),
            }
        }
        let verified = verify_prepared(&checks);
        for (((i, mark), p), ok) in pending.into_iter().zip(checks).zip(verified) {
            out[i] = if ok {
                self.apply(&mark, p.key, from, now)
            } else {
                Err(self.drop_mark(Refusal::BadSignature))
            };
        }
        out
    }

    /// The cheap checks of a mark, before its signature: newer than what we
    /// hold (by `min_gain`, if relayed), not our own echo; and its identity
    /// filled in from what we know if it came without.
    fn admit<'m>(
        &mut self,
        mark: &'m pb::Mark,
        from: Option<&str>,
        now: Instant,
    ) -> Result<Cow<'m, pb::Mark>, Refusal> {
        // Cheap checks first: relays repeat the same marks all the time, and a
        // mark that is not newer is dropped whatever its signature says.
        if let Some(e) = self.peers.get_mut(&mark.node) {
            if from == Some(mark.node.as_str()) {
                e.direct_rx = Some(now);
            }
            if mark.instance < e.mark.instance {
                return Err(self.drop_mark(Refusal::StaleInstance));
            }
            // LEFT is final: nothing after a leave of the same instance.
            if mark.instance == e.mark.instance && (mark.beat <= e.mark.beat || e.mark.left) {
                return Err(self.drop_mark(Refusal::NotNewer));
            }
            // A relayed newer beat that would not make the entry at least
            // `min_gain` fresher is not worth a signature check (several
            // links often bring about the same beat).
            if mark.instance == e.mark.instance
                && !mark.left
                && from != Some(mark.node.as_str())
                && !self.min_gain.is_zero()
            {
                if let Some(s) = e.seen_at {
                    let age = Duration::from_millis(mark.age_ms.max(0) as u64).min(self.cfg.expiry);
                    let seen = now.checked_sub(age).unwrap_or(now);
                    if seen < s + self.min_gain {
                        return Err(self.drop_mark(Refusal::NotNewer));
                    }
                }
            }
        }
        if mark.node == self.self_node
            && mark.instance == self.self_instance
            && self.own.as_ref().is_some_and(|(m, _)| {
                mark.beat <= m.beat && (mark.public_key.is_empty() || m.address == mark.address)
            })
        {
            // Our own beat relayed back: an echo, not a refusal worth counting.
            return Err(Refusal::AboutSelf);
        }
        // A mark sent without its identity takes it from what we know.
        let mark: Cow<'m, pb::Mark> = if mark.public_key.is_empty() {
            let known = if mark.node == self.self_node {
                self.own.as_ref().map(|(m, _)| m)
            } else {
                self.peers.get(&mark.node).map(|e| &e.mark)
            };
            let Some(k) = known else {
                return Err(self.drop_mark(Refusal::UnknownIdentity));
            };
            let mut m = mark.clone();
            m.public_key = k.public_key.clone();
            m.address = k.address.clone();
            m.labels = k.labels.clone();
            Cow::Owned(m)
        } else {
            Cow::Borrowed(mark)
        };
        Ok(mark)
    }

    /// Takes in a mark whose signature verified with `key`.
    fn apply(
        &mut self,
        mark: &pb::Mark,
        key: VerifyingKey,
        from: Option<&str>,
        now: Instant,
    ) -> Result<Option<Change>, Refusal> {
        if mark.node == self.self_node {
            // Our own mark relayed back carries our instance and address; a
            // different instance, or our instance from another address (a
            // copied data dir starts at the same instance), is someone else.
            let own_address = self.own.as_ref().map(|(m, _)| m.address.as_str());
            if mark.instance != self.self_instance || own_address.is_some_and(|a| a != mark.address)
            {
                // Another process with our key? Only a *rising* beat of a
                // foreign instance proves it is alive right now.
                if matches!(self.foreign_self, Some((i, b)) if i == mark.instance && mark.beat > b)
                {
                    self.duplicate_key = true;
                }
                if self
                    .foreign_self
                    .is_none_or(|(i, b)| (mark.instance, mark.beat) > (i, b))
                {
                    self.foreign_self = Some((mark.instance, mark.beat));
                }
            }
            return Err(self.drop_mark(Refusal::AboutSelf));
        }
        let expiry = self.cfg.expiry;
        let age = Duration::from_millis(mark.age_ms.max(0) as u64).min(expiry);
        let seen = now.checked_sub(age).unwrap_or(now);
        let direct = from == Some(mark.node.as_str());
        let change = match self.peers.get_mut(&mark.node) {
            None => {
                if self.peers.len() >= self.cfg.max_runtimes && !self.evict_one(now) {
                    return Err(self.drop_mark(Refusal::TooManyRuntimes));
                }
                let mut e = Entry {
                    mark: mark.clone(),
                    seen_at: Some(seen),
                    restarts: 0,
                    reported: pb::PeerState::Alive,
                    restored_at: None,
                    direct_rx: direct.then_some(now),
                    relayed_rx: (!direct).then_some(now),
                    left_at: mark.left.then_some(now),
                    asked_at: None,
                    via: from.map(str::to_owned),
                    key: Some(key),
                };
                e.reported = state_of(&e, now, expiry);
                self.peers.insert(mark.node.clone(), e);
                Change::Joined
            }
            Some(e) => {
                let restarted = mark.instance > e.mark.instance;
                let before = e.reported;
                if restarted {
                    // Every instance between was a start too (a restart too
                    // quick to beat here is still a restart).
                    let starts = u32::try_from(mark.instance - e.mark.instance).unwrap_or(u32::MAX);
                    e.restarts = e.restarts.saturating_add(starts);
                    e.seen_at = Some(seen);
                } else {
                    // Never move freshness backwards for the same instance.
                    e.seen_at = Some(e.seen_at.map_or(seen, |s| s.max(seen)));
                }
                e.mark = mark.clone();
                e.key = Some(key);
                if e.via.as_deref() != from {
                    e.via = from.map(str::to_owned);
                }
                if direct {
                    e.direct_rx = Some(now);
                } else {
                    e.relayed_rx = Some(now);
                }
                if mark.left {
                    e.left_at = Some(now);
                } else if restarted {
                    e.left_at = None;
                }
                e.reported = state_of(e, now, expiry);
                if restarted {
                    Change::Restarted
                } else if e.reported == pb::PeerState::Left && before != pb::PeerState::Left {
                    Change::Left
                } else if e.reported == pb::PeerState::Alive && before != pb::PeerState::Alive {
                    if before == pb::PeerState::Expired {
                        self.revived.push(mark.node.clone());
                    }
                    Change::Alive
                } else {
                    self.beats += 1;
                    return Ok(None);
                }
            }
        };
        self.beats += 1;
        Ok(Some(change))
    }

    /// Notes that a frame arrived over a direct link with `node`.
    pub fn touch_direct(&mut self, node: &str, now: Instant) {
        if let Some(e) = self.peers.get_mut(node) {
            e.direct_rx = Some(now);
        }
    }

    /// Recomputes states; returns the runtimes whose state changed.
    pub fn tick(&mut self, now: Instant) -> Vec<(String, Change)> {
        let expiry = self.cfg.expiry;
        let mut out = Vec::new();
        for (node, e) in self.peers.iter_mut() {
            let st = state_of(e, now, expiry);
            if st != e.reported {
                e.reported = st;
                out.push((node.clone(), Change::to(st)));
            }
        }
        let forget = self.forget;
        self.peers.retain(|_, e| {
            e.dead_since(now, expiry)
                .is_none_or(|d| now.saturating_duration_since(d) < forget)
        });
        out.sort();
        out
    }

    /// Makes room in a full view: drops the entry dead the longest. False
    /// when no entry is dead (the newcomer is refused: a flood bound). Only
    /// the dead: an `UNREACHABLE` runtime may be alive, and a watcher that
    /// last heard `ALIVE` or `UNREACHABLE` of it would never hear of it
    /// again. Claims are unaffected either way (a dropped holder becomes
    /// unknown, which is never dead here: the store lease decides).
    fn evict_one(&mut self, now: Instant) -> bool {
        let expiry = self.cfg.expiry;
        let victim = self
            .peers
            .iter()
            .filter_map(|(n, e)| e.dead_since(now, expiry).map(|d| (d, n)))
            .min()
            .map(|(_, n)| n.clone());
        let Some(n) = victim else { return false };
        // A death not reported yet (the tick has not run since) is reported
        // now, before the entry goes: every watcher sees it end.
        let lagging = self.peers.get(&n).and_then(|e| {
            let st = state_of(e, now, expiry);
            (st != e.reported).then_some(st)
        });
        if let Some(st) = lagging {
            if let Some(peer) = self.peer(&n, now) {
                self.evicted.push((Change::to(st), peer));
            }
        }
        self.peers.remove(&n);
        true
    }

    /// The runtimes to ask our links for a fresher copy of (relay trees,
    /// [`super::gossip`]), not expired and not asked for in the last
    /// `every`: each copy `after` old or older, and each copy that a link
    /// `quiet` names brought (a link gone silent: the tree it fed us is cut
    /// here, so its copies are asked for at once instead of once they are
    /// `after` old). Marks them asked now.
    pub fn due_asks(
        &mut self,
        now: Instant,
        after: Duration,
        every: Duration,
        quiet: impl Fn(&str) -> bool,
    ) -> Vec<String> {
        let expiry = self.cfg.expiry;
        let mut out = Vec::new();
        for (node, e) in self.peers.iter_mut() {
            if e.mark.left {
                continue;
            }
            let Some(seen) = e.seen_at else { continue };
            let age = now.saturating_duration_since(seen);
            if age >= expiry || (age < after && !e.via.as_deref().is_some_and(&quiet)) {
                continue;
            }
            if e.asked_at
                .is_some_and(|a| now.saturating_duration_since(a) < every)
            {
                continue;
            }
            e.asked_at = Some(now);
            out.push(node.clone());
        }
        out
    }

    /// The runtimes brought back from `EXPIRED` since the last call.
    pub fn take_revived(&mut self) -> Vec<String> {
        std::mem::take(&mut self.revived)
    }

    /// The deaths reported only as their entries were evicted (see
    /// `evict_one`), for the watchers; drained.
    pub fn take_evicted(&mut self) -> Vec<(Change, pb::Peer)> {
        std::mem::take(&mut self.evicted)
    }

    /// Every mark worth relaying, with ages as seen from here: our own, and
    /// each runtime seen within the last two expiries (or that left).
    pub fn frame_marks(&self, now: Instant) -> Vec<pb::Mark> {
        let expiry = self.cfg.expiry;
        let mut out = Vec::with_capacity(self.peers.len() + 1);
        if let Some((m, at)) = &self.own {
            let mut m = m.clone();
            m.age_ms = now.saturating_duration_since(*at).as_millis() as i64;
            out.push(m);
        }
        for e in self.peers.values() {
            let Some(seen) = e.seen_at else { continue };
            let age = now.saturating_duration_since(seen);
            let since = if e.mark.left {
                e.left_at.map_or(age, |l| now.saturating_duration_since(l))
            } else {
                age
            };
            if since >= expiry * 2 {
                continue;
            }
            let mut m = e.mark.clone();
            m.age_ms = age.min(expiry).as_millis() as i64;
            out.push(m);
        }
        out
    }

    /// The peer view of one runtime.
    pub fn peer(&self, node: &str, now: Instant) -> Option<pb::Peer> {
        let e = self.peers.get(node)?;
        let expiry = self.cfg.expiry;
        let state = state_of(e, now, expiry);
        let direct = e
            .direct_rx
            .is_some_and(|t| now.saturating_duration_since(t) <= expiry / 2);
        let link = if direct {
            pb::Link::Direct
        } else if e
            .relayed_rx
            .is_some_and(|t| now.saturating_duration_since(t) <= expiry / 2)
            && matches!(state, pb::PeerState::Alive | pb::PeerState::Unreachable)
        {
            pb::Link::Relayed
        } else {
            pb::Link::None
        };
        Some(pb::Peer {
            node: e.mark.node.clone(),
            instance: e.mark.instance,
            restarts: e.restarts,
            address: e.mark.address.clone(),
            state: state as i32,
            link: link as i32,
            beat: e.mark.beat,
            beat_age_ms: e
                .seen_at
                .map_or(-1, |s| now.saturating_duration_since(s).as_millis() as i64),
            labels: e.mark.labels.clone(),
            node_name: e.mark.labels.get("node_name").cloned().unwrap_or_default(),
        })
    }

    /// Every known runtime but ourselves, sorted by node.
    pub fn peers(&self, now: Instant) -> Vec<pb::Peer> {
        let mut nodes: Vec<&String> = self.peers.keys().collect();
        nodes.sort();
        nodes
            .into_iter()
            .filter_map(|n| self.peer(n, now))
            .collect()
    }

    /// Holders whose runs no longer exclude anyone: expired or left
    /// instances, and every instance older than the newest known one.
    pub fn dead_holders(&self, now: Instant) -> DeadHolders {
        let (mut d, expired) = self.dead_split(now);
        for h in expired {
            d.mark_dead(h);
        }
        d
    }

    /// For claims: the holders dead for sure (left, or an older instance of
    /// a known node), and the instances that expired, whose death the store
    /// must confirm first (`crate::liveness`).
    pub fn dead_split(&self, now: Instant) -> (DeadHolders, Vec<Holder>) {
        let mut d = DeadHolders::none();
        let mut expired = Vec::new();
        // Every claim asks for this: only the dead and the restarted cost an
        // allocation (a view of a thousand live runtimes is one pass).
        d.set_current(&self.self_node, self.self_instance);
        for e in self.peers.values() {
            d.set_current(&e.mark.node, e.mark.instance);
            let state = state_of(e, now, self.cfg.expiry);
            if !matches!(state, pb::PeerState::Left | pb::PeerState::Expired) {
                continue;
            }
            let h = Holder {
                node: e.mark.node.clone(),
                instance: e.mark.instance,
            };
            if state == pb::PeerState::Left {
                d.mark_dead(h);
            } else {
                expired.push(h);
            }
        }
        (d, expired)
    }

    /// Runtimes whose liveness record is worth watching: not alive, or
    /// directly linked (`direct` says which) with a beat older than `late`
    /// (a relayed beat is older by a heartbeat per hop, so only a direct
    /// one that is late says something). Left runtimes are dead for sure
    /// and not watched.
    pub fn suspects(
        &self,
        now: Instant,
        late: Duration,
        direct: impl Fn(&str) -> bool,
    ) -> Vec<Holder> {
        self.peers
            .values()
            .filter(|e| match state_of(e, now, self.cfg.expiry) {
                pb::PeerState::Left => false,
                pb::PeerState::Alive => {
                    direct(&e.mark.node)
                        && e.seen_at
                            .is_none_or(|s| now.saturating_duration_since(s) > late)
                }
                _ => true,
            })
            .map(|e| Holder {
                node: e.mark.node.clone(),
                instance: e.mark.instance,
            })
            .collect()
    }

    /// The newest known instance of `node`.
    pub fn instance_of(&self, node: &str) -> Option<u64> {
        self.peers.get(node).map(|e| e.mark.instance)
    }

    /// The newest known address of `node`.
    pub fn address_of(&self, node: &str) -> Option<&str> {
        self.peers.get(node).map(|e| e.mark.address.as_str())
    }

    /// Addresses of every known runtime with the time since it was fresh.
    pub fn addresses(&self, now: Instant) -> Vec<(String, String, Option<Duration>)> {
        self.peers
            .values()
            .map(|e| {
                (
                    e.mark.node.clone(),
                    e.mark.address.clone(),
                    e.seen_at.map(|s| now.saturating_duration_since(s)),
                )
            })
            .collect()
    }

    /// The newest marks of every known runtime (for persisting who was there).
    pub fn known_marks(&self) -> Vec<pb::Mark> {
        self.peers.values().map(|e| e.mark.clone()).collect()
    }

    pub fn drops(&self) -> &BTreeMap<Refusal, u64> {
        &self.drops
    }

    pub fn beats_accepted(&self) -> u64 {
        self.beats
    }

    /// Counts a refusal that happened outside `ingest` (frame or hello level).
    pub fn count_refusal(&mut self, r: Refusal) {
        *self.drops.entry(r).or_default() += 1;
    }

    /// Whether another live process with our node key has been seen.
    pub fn duplicate_key_seen(&self) -> bool {
        self.duplicate_key
    }

    /// Drops everything known about `node` (a runtime refused as a link).
    pub fn forget(&mut self, node: &str) {
        self.peers.remove(node);
    }

    /// The instance of the other process with our node key, once seen alive.
    pub fn duplicate_instance(&self) -> Option<u64> {
        self.foreign_self
            .filter(|_| self.duplicate_key)
            .map(|(i, _)| i)
    }
}

/// The default forget time, in expiries (10 s expiry: 5 minutes).
pub const DEFAULT_FORGET_EXPIRIES: u32 = 30;

fn state_of(e: &Entry, now: Instant, expiry: Duration) -> pb::PeerState {
    if e.mark.left {
        return pb::PeerState::Left;
    }
    match e.seen_at {
        None => match e.restored_at {
            Some(r) if now.saturating_duration_since(r) < expiry => pb::PeerState::Unreachable,
            _ => pb::PeerState::Expired,
        },
        Some(s) => {
            let age = now.saturating_duration_since(s);
            if age >= expiry {
                pb::PeerState::Expired
            } else if age > expiry / 2 {
                pb::PeerState::Unreachable
            } else {
                pb::PeerState::Alive
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mesh::identity::Identity;
    use crate::mesh::marks::sign_mark;

    const EXPIRY: Duration = Duration::from_millis(1500);

    fn table(me: &Identity) -> PeerTable {
        bounded(me, 64)
    }

    /// A table of at most `max_runtimes` runtimes.
    fn bounded(me: &Identity, max_runtimes: usize) -> PeerTable {
        PeerTable::new(
            TableConfig {
                expiry: EXPIRY,
                max_runtimes,
            },
            &me.node,
            me.instance,
        )
    }

    fn mark(id: &Identity, beat: u64, age_ms: i64) -> pb::Mark {
        let mut m = sign_mark(id, beat, false, "127.0.0.1:9", &Default::default());
        m.age_ms = age_ms;
        m
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn state(t: &PeerTable, node: &str, now: Instant) -> pb::PeerState {
        pb::PeerState::try_from(t.peer(node, now).unwrap().state).unwrap()
    }

    #[test]
    fn a_direct_beat_is_alive_until_expiry_then_expired() {
        let me = Identity::ephemeral(1);
        let b = Identity::ephemeral(1);
        let mut t = table(&me);
        let t0 = Instant::now();
        assert_eq!(
            t.ingest(&mark(&b, 1, 0), Some(&b.node), t0),
            Ok(Some(Change::Joined))
        );
        assert_eq!(state(&t, &b.node, t0 + ms(750)), pb::PeerState::Alive);
        assert_eq!(state(&t, &b.node, t0 + ms(751)), pb::PeerState::Unreachable);
        assert_eq!(
            state(&t, &b.node, t0 + ms(1499)),
            pb::PeerState::Unreachable
        );
        assert_eq!(state(&t, &b.node, t0 + ms(1500)), pb::PeerState::Expired);
        assert_eq!(
            t.tick(t0 + ms(800)),
            vec![(b.node.clone(), Change::Unreachable)]
        );
        assert_eq!(
            t.tick(t0 + ms(1500)),
            vec![(b.node.clone(), Change::Expired)]
        );
        assert!(
            t.tick(t0 + ms(1600)).is_empty(),
            "a transition is reported once"
        );
        let dead = t.dead_holders(t0 + ms(1500));
        assert!(dead.is_dead(&Holder {
            node: b.node.clone(),
            instance: 1
        }));
        // It beats again: ALIVE, same instance, no restart.
        assert_eq!(
            t.ingest(&mark(&b, 2, 0), Some(&b.node), t0 + ms(2000)),
            Ok(Some(Change::Alive))
        );
        let p = t.peer(&b.node, t0 + ms(2000)).unwrap();
        assert_eq!((p.restarts, p.instance), (0, 1));
    }

    #[test]
    fn suspects_and_the_split_dead_set() {
        let me = Identity::ephemeral(1);
        let b = Identity::ephemeral(1);
        let c = Identity::ephemeral(1);
        let mut t = table(&me);
        let t0 = Instant::now();
        t.ingest(&mark(&b, 1, 0), Some(&b.node), t0).unwrap();
        t.ingest(&mark(&c, 1, 0), Some(&b.node), t0).unwrap();
        let late = ms(300);
        let hb = |t: &PeerTable, at, direct: &[&str]| {
            let mut v: Vec<String> = t
                .suspects(at, late, |n| direct.contains(&n))
                .into_iter()
                .map(|h| h.node)
                .collect();
            v.sort();
            v
        };
        // Fresh beats: nobody is suspect.
        assert!(hb(&t, t0 + ms(300), &[&b.node, &c.node]).is_empty());
        // A late direct beat is suspect; a late relayed one is not yet.
        assert_eq!(hb(&t, t0 + ms(301), &[&b.node]), vec![b.node.clone()]);
        // Not alive any more: suspect however it is reached.
        let mut both = vec![b.node.clone(), c.node.clone()];
        both.sort();
        assert_eq!(hb(&t, t0 + ms(751), &[]), both);
        // Expired holders are split out: their death needs the store.
        let (dead, expired) = t.dead_split(t0 + ms(1500));
        assert_eq!(expired.len(), 2);
        assert!(!dead.is_dead(&expired[0]) && !dead.is_dead(&expired[1]));
        // A left runtime is dead for sure, and not watched.
        let mut left = sign_mark(&b, 2, true, "127.0.0.1:9", &Default::default());
        left.age_ms = 0;
        t.ingest(&left, Some(&b.node), t0 + ms(1600)).unwrap();
        let (dead, expired) = t.dead_split(t0 + ms(1600));
        assert!(dead.is_dead(&Holder {
            node: b.node.clone(),
            instance: 1
        }));
        assert_eq!(expired.len(), 1);
        assert_eq!(hb(&t, t0 + ms(1600), &[]), vec![c.node.clone()]);
    }

    #[test]
    fn relay_age_sets_seen_in_the_past() {
        let me = Identity::ephemeral(1);
        let c = Identity::ephemeral(1);
        let mut t = table(&me);
        let t0 = Instant::now();
        // B relays C's beat that B saw 600 ms ago.
        t.ingest(&mark(&c, 5, 600), Some("b"), t0).unwrap();
        let p = t.peer(&c.node, t0).unwrap();
        assert_eq!(p.beat_age_ms, 600);
        assert_eq!(p.link, pb::Link::Relayed as i32);
        assert_eq!(state(&t, &c.node, t0 + ms(899)), pb::PeerState::Unreachable);
        assert_eq!(
            state(&t, &c.node, t0 + ms(900)),
            pb::PeerState::Expired,
            "expiry counts from when the beat rose"
        );
    }

    #[test]
    fn a_huge_age_is_clamped_to_one_expiry() {
        let me = Identity::ephemeral(1);
        let c = Identity::ephemeral(1);
        let mut t = table(&me);
        let t0 = Instant::now() + Duration::from_secs(3600);
        t.ingest(&mark(&c, 1, i64::MAX), None, t0).unwrap();
        assert_eq!(t.peer(&c.node, t0).unwrap().beat_age_ms, 1500);
        assert_eq!(state(&t, &c.node, t0), pb::PeerState::Expired);
        // A negative age counts as zero.
        let d = Identity::ephemeral(1);
        t.ingest(&mark(&d, 1, -5000), None, t0).unwrap();
        assert_eq!(t.peer(&d.node, t0).unwrap().beat_age_ms, 0);
    }

    #[test]
    fn relays_cannot_keep_a_dead_runtime_alive() {
        let me = Identity::ephemeral(1);
        let c = Identity::ephemeral(1);
        let mut t = table(&me);
        let t0 = Instant::now();
        t.ingest(&mark(&c, 9, 0), Some(&c.node), t0).unwrap();
        // C dies. Relays keep sending its last beat with ever smaller ages
        // (a buggy or hostile relay): not newer, so nothing is refreshed.
        for i in 1..20u64 {
            let r = t.ingest(&mark(&c, 9, 0), Some("b"), t0 + ms(100 * i));
            assert_eq!(r, Err(Refusal::NotNewer));
        }
        assert_eq!(state(&t, &c.node, t0 + ms(1500)), pb::PeerState::Expired);
    }

    #[test]
    fn freshness_never_moves_backwards() {
        let me = Identity::ephemeral(1);
        let c = Identity::ephemeral(1);
        let mut t = table(&me);
        let t0 = Instant::now();
        t.ingest(&mark(&c, 1, 0), Some(&c.node), t0 + ms(1000))
            .unwrap();
        // A newer beat relayed with a large age does not age the entry.
        t.ingest(&mark(&c, 2, 900), Some("b"), t0 + ms(1100))
            .unwrap();
        assert_eq!(t.peer(&c.node, t0 + ms(1100)).unwrap().beat_age_ms, 100);
    }

    #[test]
    fn restart_is_detected_counted_and_stale_instances_dropped() {
        let me = Identity::ephemeral(1);
        let dir = tempfile::tempdir().unwrap();
        let old = Identity::load_or_create(dir.path()).unwrap();
        let new = Identity::load_or_create(dir.path()).unwrap();
        assert_eq!(old.node, new.node);
        let mut t = table(&me);
        let t0 = Instant::now();
        t.ingest(&mark(&old, 50, 0), Some(&old.node), t0).unwrap();
        assert_eq!(
            t.ingest(&mark(&new, 1, 0), Some(&new.node), t0 + ms(10)),
            Ok(Some(Change::Restarted))
        );
        let p = t.peer(&new.node, t0 + ms(10)).unwrap();
        assert_eq!((p.instance, p.restarts, p.beat), (2, 1, 1));
        // A late relay of the old instance's mark never brings it back.
        assert_eq!(
            t.ingest(&mark(&old, 51, 0), Some("b"), t0 + ms(20)),
            Err(Refusal::StaleInstance)
        );
        assert_eq!(t.peers(t0).len(), 1, "listed once");
        // The old instance is dead for claims; the new one is not.
        let dead = t.dead_holders(t0 + ms(20));
        assert!(dead.is_dead(&Holder {
            node: old.node.clone(),
            instance: 1
        }));
        assert!(!dead.is_dead(&Holder {
            node: old.node.clone(),
            instance: 2
        }));
    }

    #[test]
    fn a_signed_leave_is_left_and_dead() {
        let me = Identity::ephemeral(1);
        let c = Identity::ephemeral(4);
        let mut t = table(&me);
        let t0 = Instant::now();
        t.ingest(&mark(&c, 3, 0), Some(&c.node), t0).unwrap();
        let mut bye = sign_mark(&c, 4, true, "x", &Default::default());
        bye.age_ms = 0;
        assert_eq!(
            t.ingest(&bye, Some(&c.node), t0 + ms(5)),
            Ok(Some(Change::Left))
        );
        assert_eq!(state(&t, &c.node, t0 + ms(5)), pb::PeerState::Left);
        assert!(t.dead_holders(t0 + ms(5)).is_dead(&Holder {
            node: c.node.clone(),
            instance: 4
        }));
    }

    #[test]
    fn forged_and_self_marks_are_dropped_and_counted() {
        let me = Identity::ephemeral(1);
        let c = Identity::ephemeral(1);
        let mut t = table(&me);
        let t0 = Instant::now();
        let mut forged = mark(&c, 2, 0);
        forged.beat = 3;
        assert_eq!(t.ingest(&forged, None, t0), Err(Refusal::BadSignature));
        let mut stolen = mark(&c, 2, 0);
        stolen.node = me.node.clone();
        assert_eq!(t.ingest(&stolen, None, t0), Err(Refusal::KeyMismatch));
        assert_eq!(
            t.ingest(&mark(&me, 1, 0), None, t0),
            Err(Refusal::AboutSelf)
        );
        assert!(t.peers(t0).is_empty());
        assert_eq!(t.drops().get(&Refusal::BadSignature), Some(&1));
        assert_eq!(t.drops().get(&Refusal::KeyMismatch), Some(&1));
        assert_eq!(t.drops().get(&Refusal::AboutSelf), Some(&1));
    }

    #[test]
    fn a_reload_restores_who_was_there_but_no_freshness() {
        let me = Identity::ephemeral(2);
        let c = Identity::ephemeral(7);
        let mut t = table(&me);
        let t0 = Instant::now();
        t.restore(mark(&c, 40, 0), t0);
        let holder = Holder {
            node: c.node.clone(),
            instance: 7,
        };
        // Never alive, never relayed as fresh; but for one expiry not known
        // dead either: a live peer has had no chance to beat at us yet, and
        // its runs must keep excluding our claimers.
        for at in [t0, t0 + EXPIRY - Duration::from_millis(1)] {
            let p = t.peer(&c.node, at).unwrap();
            assert_eq!(p.state, pb::PeerState::Unreachable as i32);
            assert_eq!(p.link, pb::Link::None as i32);
            assert_eq!(p.beat_age_ms, -1);
            assert!(!t.dead_holders(at).is_dead(&holder));
            assert!(
                t.frame_marks(at).iter().all(|m| m.node != c.node),
                "not relayed as fresh"
            );
        }
        // Older instances of it are dead at once: it restarted since.
        assert!(t.dead_holders(t0).is_dead(&Holder {
            node: c.node.clone(),
            instance: 6
        }));
        // Silent for one expiry: expired, and its runs are free.
        let later = t0 + EXPIRY;
        assert_eq!(t.tick(later), vec![(c.node.clone(), Change::Expired)]);
        assert_eq!(
            t.peer(&c.node, later).unwrap().state,
            pb::PeerState::Expired as i32
        );
        assert!(t.dead_holders(later).is_dead(&holder));
        // The same beat again does not revive it; a new beat does.
        assert_eq!(
            t.ingest(&mark(&c, 40, 0), Some(&c.node), later),
            Err(Refusal::NotNewer)
        );
        assert_eq!(
            t.ingest(&mark(&c, 41, 0), Some(&c.node), later),
            Ok(Some(Change::Alive))
        );
        assert!(!t.dead_holders(later).is_dead(&holder));
    }

    #[test]
    fn wall_clock_skew_between_runtimes_changes_nothing() {
        // Marks carry no wall-clock time at all: only beats and ages on the
        // sender's monotonic clock. Two runtimes whose wall clocks differ by
        // hours produce byte-identical marks for the same beat and age, so the
        // table must give the same answer. We check that the answer depends
        // only on (beat, age, local now).
        let me = Identity::ephemeral(1);
        let c = Identity::ephemeral(1);
        let t0 = Instant::now();
        let mut a = table(&me);
        let mut b = table(&me);
        let skewed_hours = Duration::from_secs(5 * 3600);
        a.ingest(&mark(&c, 1, 200), None, t0).unwrap();
        // The same facts observed by a table whose own clock is far ahead.
        b.ingest(&mark(&c, 1, 200), None, t0 + skewed_hours)
            .unwrap();
        for dt in [0, 500, 1299, 1300, 5000] {
            assert_eq!(
                state(&a, &c.node, t0 + ms(dt)),
                state(&b, &c.node, t0 + skewed_hours + ms(dt))
            );
        }
    }

    #[test]
    fn duplicate_node_key_is_detected_by_a_rising_foreign_beat() {
        let dir = tempfile::tempdir().unwrap();
        let me = Identity::load_or_create(dir.path()).unwrap();
        let twin = Identity::load_or_create(dir.path()).unwrap();
        let mut t = table(&me);
        let t0 = Instant::now();
        t.ingest(&mark(&twin, 1, 0), Some("b"), t0).unwrap_err();
        assert!(!t.duplicate_key_seen(), "one sighting may be an old relay");
        t.ingest(&mark(&twin, 2, 0), Some("b"), t0 + ms(100))
            .unwrap_err();
        assert!(t.duplicate_key_seen());
        assert_eq!(t.duplicate_instance(), Some(me.instance + 1));
    }

    #[test]
    fn duplicate_node_key_with_our_instance_is_told_by_its_address() {
        // A copied data dir starts at the same instance as ours.
        let dir = tempfile::tempdir().unwrap();
        let me = Identity::load_or_create(dir.path()).unwrap();
        let mut t = table(&me);
        let t0 = Instant::now();
        t.set_own(sign_mark(&me, 5, false, "a:1", &BTreeMap::new()), t0);
        // Our own marks relayed back are not a twin.
        t.ingest(
            &sign_mark(&me, 4, false, "a:1", &BTreeMap::new()),
            Some("b"),
            t0,
        )
        .unwrap_err();
        t.ingest(
            &sign_mark(&me, 5, false, "a:1", &BTreeMap::new()),
            Some("b"),
            t0,
        )
        .unwrap_err();
        assert!(!t.duplicate_key_seen());
        t.ingest(
            &sign_mark(&me, 7, false, "z:9", &BTreeMap::new()),
            Some("b"),
            t0,
        )
        .unwrap_err();
        t.ingest(
            &sign_mark(&me, 8, false, "z:9", &BTreeMap::new()),
            Some("b"),
            t0,
        )
        .unwrap_err();
        assert!(t.duplicate_key_seen());
        assert_eq!(t.duplicate_instance(), Some(me.instance));
    }

    #[test]
    fn the_table_is_bounded() {
        let me = Identity::ephemeral(1);
        let mut t = bounded(&me, 2);
        let t0 = Instant::now();
        for _ in 0..2 {
            t.ingest(&mark(&Identity::ephemeral(1), 1, 0), None, t0)
                .unwrap();
        }
        assert_eq!(
            t.ingest(&mark(&Identity::ephemeral(1), 1, 0), None, t0),
            Err(Refusal::TooManyRuntimes)
        );
    }

    #[test]
    fn a_full_view_evicts_the_longest_dead_and_never_refuses_a_newcomer_for_them() {
        let me = Identity::ephemeral(1);
        let mut t = bounded(&me, 3);
        let t0 = Instant::now();
        let (old, newer, live) = (
            Identity::ephemeral(1),
            Identity::ephemeral(1),
            Identity::ephemeral(1),
        );
        t.ingest(&mark(&old, 1, 0), Some(&old.node), t0).unwrap();
        t.ingest(&mark(&newer, 1, 0), Some(&newer.node), t0 + ms(500))
            .unwrap();
        t.ingest(&mark(&live, 1, 0), Some(&live.node), t0 + ms(2500))
            .unwrap();
        // At 2.6 s: `old` dead since 1.5 s, `newer` since 2.0 s, `live` alive.
        let at = t0 + ms(2600);
        let a = Identity::ephemeral(1);
        assert_eq!(
            t.ingest(&mark(&a, 1, 0), Some(&a.node), at),
            Ok(Some(Change::Joined))
        );
        assert!(
            t.peer(&old.node, at).is_none(),
            "the longest dead goes first"
        );
        assert!(t.peer(&newer.node, at).is_some());
        let b = Identity::ephemeral(1);
        t.ingest(&mark(&b, 1, 0), Some(&b.node), at).unwrap();
        assert!(t.peer(&newer.node, at).is_none());
        // Only live entries now: a flood is still refused.
        let c = Identity::ephemeral(1);
        assert_eq!(
            t.ingest(&mark(&c, 1, 0), Some(&c.node), at),
            Err(Refusal::TooManyRuntimes)
        );
    }

    /// A frame's marks checked in one batch give each the outcome it gets
    /// alone: a forged one among good ones is refused by itself, and the
    /// good ones are taken.
    #[test]
    fn a_frame_checked_in_one_batch_refuses_only_its_forged_mark() {
        let me = Identity::ephemeral(1);
        let t0 = Instant::now();
        let ids: Vec<Identity> = (0..5).map(|_| Identity::ephemeral(1)).collect();
        let mut frame: Vec<pb::Mark> = ids.iter().map(|id| mark(id, 1, 0)).collect();
        // A forged beat: ids[2]'s mark with another beat's signature.
        frame[2].beat = 7;
        // And one not newer than what we hold.
        let mut t = table(&me);
        t.ingest(&mark(&ids[4], 3, 0), Some(&ids[4].node), t0)
            .unwrap();
        let out = t.ingest_frame(&frame, Some(&ids[0].node), t0);
        assert_eq!(out.len(), 5);
        assert_eq!(out[0], Ok(Some(Change::Joined)));
        assert_eq!(out[1], Ok(Some(Change::Joined)));
        assert_eq!(out[2], Err(Refusal::BadSignature));
        assert_eq!(out[3], Ok(Some(Change::Joined)));
        assert_eq!(out[4], Err(Refusal::NotNewer));
        assert!(
            t.peer(&ids[2].node, t0).is_none(),
            "the forged one is not taken"
        );
        // All good: one batch, all taken, keys kept for the next check.
        let next: Vec<pb::Mark> = ids[..2].iter().map(|id| mark(id, 2, 0)).collect();
        let out = t.ingest_frame(&next, Some(&ids[0].node), t0 + ms(10));
        assert_eq!(out, vec![Ok(None), Ok(None)]);
        assert_eq!(t.peer(&ids[1].node, t0 + ms(10)).unwrap().beat, 2);
        // A runtime named twice in one frame: taken in order, as one by one.
        let twice = vec![mark(&ids[3], 5, 0), mark(&ids[3], 4, 0)];
        let out = t.ingest_frame(&twice, Some(&ids[0].node), t0 + ms(20));
        assert_eq!(out, vec![Ok(None), Err(Refusal::NotNewer)]);
    }

    /// A full view evicts only the dead, and a death it had not reported yet
    /// (no tick since) is reported as the entry goes: a watcher never keeps
    /// an evicted runtime as `ALIVE` or `UNREACHABLE`.
    #[test]
    fn an_eviction_reports_a_death_not_yet_reported_and_spares_the_unreachable() {
        let me = Identity::ephemeral(1);
        let mut t = bounded(&me, 2);
        let t0 = Instant::now();
        let (dead, unreachable) = (Identity::ephemeral(1), Identity::ephemeral(1));
        t.ingest(&mark(&dead, 1, 0), Some(&dead.node), t0).unwrap();
        t.ingest(
            &mark(&unreachable, 1, 0),
            Some(&unreachable.node),
            t0 + ms(800),
        )
        .unwrap();
        // At 1.6 s: `dead` expired 100 ms ago (never ticked: still reported
        // `ALIVE`), `unreachable` is 800 ms old (past expiry / 2).
        let at = t0 + ms(1600);
        assert_eq!(
            t.peer(&unreachable.node, at).unwrap().state,
            pb::PeerState::Unreachable as i32
        );
        let a = Identity::ephemeral(1);
        assert_eq!(
            t.ingest(&mark(&a, 1, 0), Some(&a.node), at),
            Ok(Some(Change::Joined))
        );
        assert!(t.peer(&dead.node, at).is_none());
        let evicted = t.take_evicted();
        assert_eq!(evicted.len(), 1, "{evicted:?}");
        assert_eq!(evicted[0].0, Change::Expired);
        assert_eq!(evicted[0].1.node, dead.node);
        assert_eq!(evicted[0].1.state, pb::PeerState::Expired as i32);
        assert!(t.take_evicted().is_empty(), "drained");
        // The unreachable one may be alive: a newcomer waits instead.
        let b = Identity::ephemeral(1);
        assert_eq!(
            t.ingest(&mark(&b, 1, 0), Some(&b.node), at),
            Err(Refusal::TooManyRuntimes)
        );
        assert!(t.peer(&unreachable.node, at).is_some());
        // Once it is dead it goes (its death already reported by a tick:
        // nothing more to report).
        let later = t0 + ms(2600);
        let ticked = t.tick(later);
        assert!(ticked.contains(&(unreachable.node.clone(), Change::Expired)));
        assert_eq!(
            t.ingest(&mark(&b, 1, 0), Some(&b.node), later),
            Ok(Some(Change::Joined))
        );
        assert!(t.peer(&unreachable.node, later).is_none());
        assert!(t.take_evicted().is_empty());
    }

    /// The forget time's safety argument, checked: forgotten only after the
    /// forget time (never earlier), gone from frames two expiries after
    /// death (so nobody relays it when anyone forgets it), and a late stale
    /// copy comes back `EXPIRED`, never `ALIVE`.
    #[test]
    fn the_long_dead_are_forgotten_and_cannot_come_back_alive() {
        let me = Identity::ephemeral(1);
        let forget = EXPIRY * 3;
        let mut t = table(&me).with_forget(forget);
        let t0 = Instant::now();
        let (dead, gone) = (Identity::ephemeral(1), Identity::ephemeral(2));
        t.ingest(&mark(&dead, 1, 0), Some(&dead.node), t0).unwrap();
        let mut bye = sign_mark(&gone, 9, true, "x", &Default::default());
        bye.age_ms = 0;
        t.ingest(&bye, Some(&gone.node), t0).unwrap();
        // `dead` is dead from t0 + expiry, `gone` from t0.
        assert!(t.frame_marks(t0 + EXPIRY * 2 - ms(1)).len() == 2);
        assert!(t.frame_marks(t0 + EXPIRY * 3).is_empty());
        t.tick(t0 + forget - ms(1));
        assert_eq!(t.len(), 2, "not before the forget time");
        t.tick(t0 + forget);
        assert!(t.peer(&gone.node, t0 + forget).is_none(), "left: forgotten");
        assert!(t.peer(&dead.node, t0 + forget).is_some());
        t.tick(t0 + EXPIRY + forget);
        assert!(t.is_empty());
        // A stale relayed copy of the dead one: EXPIRED at once.
        let late = t0 + EXPIRY + forget + ms(1);
        let mut stale = mark(&dead, 1, 0);
        stale.age_ms = EXPIRY.as_millis() as i64;
        t.ingest(&stale, Some("relay"), late).unwrap();
        assert_eq!(state(&t, &dead.node, late), pb::PeerState::Expired);
        // Our own persisted view shrank too.
        assert_eq!(t.known_marks().len(), 1);
    }

    #[test]
    fn left_is_final_for_an_instance() {
        let me = Identity::ephemeral(1);
        let c = Identity::from_seed([7; 32], 3);
        let mut t = table(&me);
        let t0 = Instant::now();
        let mut bye = sign_mark(&c, 5, true, "x", &Default::default());
        bye.age_ms = 0;
        t.ingest(&bye, Some(&c.node), t0).unwrap();
        // A later beat of the same instance (a beat loop racing the leave).
        assert_eq!(
            t.ingest(&mark(&c, 6, 0), Some(&c.node), t0 + ms(5)),
            Err(Refusal::NotNewer)
        );
        assert_eq!(state(&t, &c.node, t0 + ms(5)), pb::PeerState::Left);
        assert!(t.tick(t0 + EXPIRY * 2).is_empty(), "no event after LEFT");
        // A new instance is a restart.
        let c2 = Identity::from_seed([7; 32], 4);
        assert_eq!(
            t.ingest(&mark(&c2, 1, 0), Some(&c.node), t0 + ms(10)),
            Ok(Some(Change::Restarted))
        );
    }

    #[test]
    fn a_runtime_reached_only_directly_is_never_said_relayed() {
        let me = Identity::ephemeral(1);
        let b = Identity::ephemeral(1);
        let mut t = table(&me);
        let t0 = Instant::now();
        t.ingest(&mark(&b, 1, 0), Some(&b.node), t0).unwrap();
        let p = t.peer(&b.node, t0 + ms(800)).unwrap();
        assert_eq!(p.state, pb::PeerState::Unreachable as i32);
        assert_eq!(p.link, pb::Link::None as i32);
    }

    #[test]
    fn relayed_beats_that_freshen_too_little_are_dropped_before_any_check() {
        let me = Identity::ephemeral(1);
        let c = Identity::ephemeral(1);
        let mut t = table(&me).with_min_gain(ms(100));
        let t0 = Instant::now();
        t.ingest(&mark(&c, 1, 0), Some("b"), t0).unwrap();
        // Newer, but seen only 50 ms later: not checked (a forged signature
        // would not even be noticed), counted as not newer.
        let mut forged = mark(&c, 2, 0);
        forged.signature = vec![0; 64];
        assert_eq!(
            t.ingest(&forged, Some("d"), t0 + ms(50)),
            Err(Refusal::NotNewer)
        );
        assert_eq!(t.drops().get(&Refusal::BadSignature), None);
        // 100 ms fresher: checked and taken.
        assert_eq!(t.ingest(&mark(&c, 2, 0), Some("d"), t0 + ms(100)), Ok(None));
        // A direct beat is always taken.
        assert_eq!(
            t.ingest(&mark(&c, 3, 0), Some(&c.node), t0 + ms(110)),
            Ok(None)
        );
    }
}
