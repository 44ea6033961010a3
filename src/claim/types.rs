use std::collections::{HashMap, HashSet};
use std::fmt;

use crate::error::{Error, Result};

/// Longest job name, in bytes.
pub const MAX_JOB_LEN: usize = 200;

/// A validated job name: 1..=200 bytes of `[A-Za-z0-9._:/-]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Job(String);

impl Job {
    pub fn parse(s: &str) -> Result<Job> {
        if s.is_empty() {
            return Err(Error::invalid("job", "must not be empty"));
        }
        if s.len() > MAX_JOB_LEN {
            return Err(Error::invalid(
                "job",
                format!("is {} bytes, at most {MAX_JOB_LEN} allowed", s.len()),
            ));
        }
        if let Some(c) = s
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '/' | '-')))
        {
            return Err(Error::invalid(
                "job",
                format!("contains {c:?}; allowed are [A-Za-z0-9._:/-]"),
            ));
        }
        Ok(Job(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Job {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A slot: epoch milliseconds of the scheduled run. 0 is a lock not tied to time.
pub type SlotMs = i64;

/// A holder's secret: 128 random bits as 32 lowercase hex characters.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Token(String);

impl Token {
    pub fn parse(s: &str) -> Result<Token> {
        if s.len() != 32
            || !s
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            return Err(Error::invalid(
                "token",
                "must be 32 lowercase hex characters (128 bits)",
            ));
        }
        Ok(Token(s.to_owned()))
    }

    pub fn generate() -> Token {
        let bytes: [u8; 16] = rand::random();
        Token(hex::encode(bytes))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Token {
    // A token is a secret: never print it whole.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Token({}…)", &self.0[..4.min(self.0.len())])
    }
}

/// The runtime that holds a run.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Holder {
    pub node: String,
    pub instance: u64,
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.node, self.instance)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Overlap {
    #[default]
    Allow,
    Skip,
}

impl Overlap {
    pub fn as_str(self) -> &'static str {
        match self {
            Overlap::Allow => "allow",
            Overlap::Skip => "skip",
        }
    }

    pub fn parse(s: &str) -> Result<Overlap> {
        match s.to_ascii_lowercase().as_str() {
            "allow" => Ok(Overlap::Allow),
            "skip" => Ok(Overlap::Skip),
            _ => Err(Error::invalid(
                "overlap",
                format!("{s:?} is not allow or skip"),
            )),
        }
    }
}

/// As the config key `overlap`: `allow` or `skip`, in any case.
impl serde::Serialize for Overlap {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> serde::Deserialize<'de> for Overlap {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Overlap::parse(&s)
            .map_err(|_| serde::de::Error::custom(format!("{s:?} is not allow or skip")))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunState {
    Running,
    Succeeded,
    Failed,
    Interrupted,
    /// Once backends: the slot was claimed, nothing more is known.
    Claimed,
}

impl RunState {
    pub fn as_str(self) -> &'static str {
        match self {
            RunState::Running => "RUNNING",
            RunState::Succeeded => "SUCCEEDED",
            RunState::Failed => "FAILED",
            RunState::Interrupted => "INTERRUPTED",
            RunState::Claimed => "CLAIMED",
        }
    }

    pub fn parse(s: &str) -> Result<RunState> {
        Ok(match s {
            "RUNNING" => RunState::Running,
            "SUCCEEDED" => RunState::Succeeded,
            "FAILED" => RunState::Failed,
            "INTERRUPTED" => RunState::Interrupted,
            "CLAIMED" => RunState::Claimed,
            other => {
                return Err(Error::Store(format!(
                    "unknown run state {other:?} in store"
                )))
            }
        })
    }

    pub fn is_finished(self) -> bool {
        !matches!(self, RunState::Running)
    }
}

/// How a holder ends its run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseResult {
    Succeeded,
    Failed,
}

impl ReleaseResult {
    pub fn state(self) -> RunState {
        match self {
            ReleaseResult::Succeeded => RunState::Succeeded,
            ReleaseResult::Failed => RunState::Failed,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    Won,
    Lost,
    Running,
    Done,
    Late,
    Overlap,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Won => "WON",
            Outcome::Lost => "LOST",
            Outcome::Running => "RUNNING",
            Outcome::Done => "DONE",
            Outcome::Late => "LATE",
            Outcome::Overlap => "OVERLAP",
        }
    }
}

/// A fully resolved claim: defaults applied, every field validated.
#[derive(Debug, Clone)]
pub struct ClaimSpec {
    pub job: Job,
    pub slot_ms: SlotMs,
    pub token: Token,
    pub holder: Holder,
    pub lease_ms: i64,
    pub max_late_ms: i64,
    pub overlap: Overlap,
    pub max_attempts: u32,
}

#[derive(Debug, Clone)]
pub struct RenewSpec {
    pub job: Job,
    pub slot_ms: SlotMs,
    pub token: Token,
    /// The new lease; 0 keeps the lease the run was claimed with.
    pub lease_ms: i64,
}

#[derive(Debug, Clone)]
pub struct ReleaseSpec {
    pub job: Job,
    pub slot_ms: SlotMs,
    pub token: Token,
    pub result: ReleaseResult,
}

/// The stored record of one (job, slot).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunRow {
    pub slot_ms: SlotMs,
    pub state: RunState,
    pub attempt: u32,
    pub fencing: u64,
    pub token: Token,
    pub holder: Holder,
    pub lease_until_ms: i64,
    pub claimed_at_ms: i64,
    /// 0 while running.
    pub finished_at_ms: i64,
}

/// What a store answers to a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimAnswer {
    pub outcome: Outcome,
    /// Only set when won: the caller's own token.
    pub token: Option<Token>,
    pub attempt: u32,
    pub fencing: u64,
    pub lease_until_ms: i64,
    /// The store's clock at the decision.
    pub now_ms: i64,
    pub holder: Option<Holder>,
    /// Machine-readable detail, e.g. `slot_older_than_newest`.
    pub reason: Option<&'static str>,
}

impl ClaimAnswer {
    /// An answer that carries nothing but the outcome.
    pub fn bare(outcome: Outcome, now_ms: i64, reason: Option<&'static str>) -> Self {
        ClaimAnswer {
            outcome,
            token: None,
            attempt: 0,
            fencing: 0,
            lease_until_ms: 0,
            now_ms,
            holder: None,
            reason,
        }
    }

    /// The lease left at the decision, measured on the store's clock.
    pub fn valid_for_ms(&self) -> i64 {
        if self.outcome == Outcome::Won && self.lease_until_ms > 0 {
            (self.lease_until_ms - self.now_ms).max(0)
        } else {
            0
        }
    }
}

/// What a successful renew answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Renewed {
    pub lease_until_ms: i64,
    pub attempt: u32,
    pub fencing: u64,
    pub now_ms: i64,
}

/// A page of history.
#[derive(Debug, Clone, Default)]
pub struct HistoryPage {
    pub runs: Vec<RunRow>,
    /// False when the backend keeps less than full run records.
    pub complete: bool,
    pub note: Option<String>,
}

/// The runtimes whose runs no longer exclude anyone.
///
/// A holder is dead when its instance is listed as dead (it left, or it
/// expired and the store confirmed it), or when a newer instance of its node
/// is known (it restarted). The sidecar builds this from its mesh view and
/// passes it into the store's atomic step.
///
/// An *expired* holder is listed **conditionally**: with the value of its
/// liveness counter in the store (see `docs/safety.md`) that this sidecar
/// has seen unchanged for at least one expiry on its own clock. The store's
/// step treats such a holder as dead only if the counter still has that
/// value ([`DeadHolders::confirmed`]); a holder that refreshed its record
/// since is alive, whatever the mesh says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeadHolders {
    dead: HashSet<Holder>,
    /// Expired holders and the liveness counter they must still have.
    conditional: HashMap<Holder, u64>,
    /// The newest known instance per node: anything older is dead.
    current: HashMap<String, u64>,
}

impl DeadHolders {
    pub fn none() -> Self {
        DeadHolders::default()
    }

    /// Records that `holder` is dead (it left, or its death is confirmed).
    pub fn mark_dead(&mut self, holder: Holder) {
        self.conditional.remove(&holder);
        self.dead.insert(holder);
    }

    /// Records that `holder` is dead if its liveness counter in the store is
    /// still `counter` when the step runs.
    pub fn mark_dead_if(&mut self, holder: Holder, counter: u64) {
        if !self.dead.contains(&holder) {
            self.conditional.insert(holder, counter);
        }
    }

    /// Records that `instance` is the newest run of `node`. Instance 1 is a
    /// node's first start (`mesh::identity`): nothing older can hold a run,
    /// so it is not kept, and a claim's step is sent only the nodes that
    /// restarted, not the whole mesh.
    pub fn set_current(&mut self, node: &str, instance: u64) {
        if instance <= 1 {
            return;
        }
        if let Some(e) = self.current.get_mut(node) {
            *e = (*e).max(instance);
        } else {
            self.current.insert(node.to_owned(), instance);
        }
    }

    /// Dead, or dead if the store confirms it. Renew and release refuse on
    /// either (refusing is always safe); a claim's locked step must first
    /// resolve the conditional entries with [`DeadHolders::confirmed`].
    pub fn is_dead(&self, h: &Holder) -> bool {
        self.dead.contains(h)
            || self.conditional.contains_key(h)
            || self
                .current
                .get(&h.node)
                .is_some_and(|&cur| h.instance < cur)
    }

    /// The dead instances listed unconditionally.
    pub fn dead(&self) -> impl Iterator<Item = &Holder> {
        self.dead.iter()
    }

    /// The expired instances and the counter each must still have.
    pub fn conditional(&self) -> impl Iterator<Item = (&Holder, u64)> {
        self.conditional.iter().map(|(h, &c)| (h, c))
    }

    pub fn has_conditional(&self) -> bool {
        !self.conditional.is_empty()
    }

    /// The set with every conditional entry resolved: `counter_of` gives the
    /// store's liveness counter of a holder (0 when it has no record), read
    /// inside the same atomic step. An entry whose counter moved is dropped:
    /// that holder refreshed its record, so it is alive.
    pub fn confirmed(&self, mut counter_of: impl FnMut(&Holder) -> u64) -> DeadHolders {
        let mut out = DeadHolders {
            dead: self.dead.clone(),
            conditional: HashMap::new(),
            current: self.current.clone(),
        };
        for (h, &c) in &self.conditional {
            if counter_of(h) == c {
                out.dead.insert(h.clone());
            }
        }
        out
    }

    /// The set without its conditional entries (for a step that cannot read
    /// liveness records): those holders are treated as alive.
    pub fn unconditional(&self) -> DeadHolders {
        DeadHolders {
            dead: self.dead.clone(),
            conditional: HashMap::new(),
            current: self.current.clone(),
        }
    }

    /// The newest instance per node.
    pub fn current(&self) -> impl Iterator<Item = (&String, &u64)> {
        self.current.iter()
    }
}

/// Milliseconds since the Unix epoch on this host's clock.
pub fn host_now_ms() -> i64 {
    use std::time::{SystemTime, UNIX_EPOCH};
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_names() {
        assert!(Job::parse("nightly-report").is_ok());
        assert!(Job::parse("a.b_c:d/e-F9").is_ok());
        assert!(Job::parse(&"x".repeat(200)).is_ok());
        for bad in ["", "has space", "ü", "a<b", "semi;colon"] {
            let e = Job::parse(bad).unwrap_err();
            assert!(
                matches!(e, Error::InvalidArgument { field: "job", .. }),
                "{bad}"
            );
        }
        assert!(Job::parse(&"x".repeat(201)).is_err());
    }

    #[test]
    fn tokens() {
        let t = Token::generate();
        assert_eq!(t.as_str().len(), 32);
        assert!(Token::parse(t.as_str()).is_ok());
        assert_ne!(Token::generate(), Token::generate());
        for bad in ["", "abc", &"G".repeat(32), &"A".repeat(32), &"a".repeat(33)] {
            assert!(Token::parse(bad).is_err(), "{bad}");
        }
        assert!(!format!("{t:?}").contains(&t.as_str()[4..]));
    }

    #[test]
    fn dead_holders() {
        let mut d = DeadHolders::none();
        let h = |i| Holder {
            node: "n1".into(),
            instance: i,
        };
        assert!(!d.is_dead(&h(3)));
        d.set_current("n1", 3);
        assert!(d.is_dead(&h(2)));
        assert!(!d.is_dead(&h(3)));
        assert!(!d.is_dead(&h(4)));
        d.mark_dead(h(4));
        assert!(d.is_dead(&h(4)));
        d.set_current("n1", 1); // never lowers
        assert!(d.is_dead(&h(2)));
        // A node at its first instance has nothing older: not listed, so a
        // claim's step carries only the restarted nodes.
        d.set_current("n2", 1);
        let listed: Vec<&String> = d.current().map(|(n, _)| n).collect();
        assert_eq!(listed, vec!["n1"]);
        let first = Holder {
            node: "n2".into(),
            instance: 1,
        };
        assert!(!d.is_dead(&first));
    }

    #[test]
    fn conditional_deaths_need_the_store_to_agree() {
        let h = |n: &str| Holder {
            node: n.into(),
            instance: 1,
        };
        let mut d = DeadHolders::none();
        d.mark_dead_if(h("a"), 7);
        d.mark_dead_if(h("b"), 3);
        d.mark_dead(h("c"));
        d.mark_dead_if(h("c"), 9); // already dead: stays unconditional
        assert!(d.is_dead(&h("a")) && d.is_dead(&h("b")) && d.is_dead(&h("c")));
        assert_eq!(d.conditional().count(), 2);
        // a's counter is still 7 (dead); b refreshed to 4 (alive).
        let r = d.confirmed(|x| if x.node == "a" { 7 } else { 4 });
        assert!(r.is_dead(&h("a")));
        assert!(!r.is_dead(&h("b")));
        assert!(r.is_dead(&h("c")));
        assert!(!r.has_conditional());
        let u = d.unconditional();
        assert!(!u.is_dead(&h("a")) && !u.is_dead(&h("b")) && u.is_dead(&h("c")));
    }
}
