//! The recent runs this sidecar has seen, for the dashboard: a bounded ring
//! (the newest [`MAX_RUNS`] runs, at most [`MAX_RUNS_PER_JOB`] per job) and a
//! broadcast of run events (won, released, lease ended, fenced refusals).
//!
//! Fed by the Claims service; read by `/api/v1/events`. Nothing here ever
//! waits: the ring is a short critical section and a slow subscriber lags
//! behind the broadcast instead of holding anyone up.

use std::collections::hash_map::DefaultHasher;
use std::collections::VecDeque;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};

use serde::Serialize;
use tokio::sync::broadcast;

use crate::claim::{host_now_ms, ClaimAnswer, ClaimSpec, ReleaseResult, SlotMs};

/// Runs kept in the ring, over all jobs.
pub const MAX_RUNS: usize = 200;
/// Runs kept per job, so one busy job cannot push every other job out.
pub const MAX_RUNS_PER_JOB: usize = 20;
/// Run events a dashboard stream may fall behind before it is dropped.
const BROADCAST: usize = 256;

/// One run as this sidecar last saw it. Never carries the token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RunView {
    pub job: String,
    pub slot_ms: SlotMs,
    /// 0 when this sidecar did not see the win (e.g. a release of a run won
    /// through another sidecar).
    pub attempt: u32,
    pub fencing: u64,
    /// `RUNNING`, `SUCCEEDED` or `FAILED`.
    pub state: &'static str,
    /// `node/instance`, empty when unknown.
    pub holder: String,
    /// Store clock at the win.
    pub claimed_at_ms: i64,
    /// This host's clock at the release; 0 while running.
    pub finished_at_ms: i64,
    /// Store clock; a `RUNNING` run past it is up for takeover.
    pub lease_until_ms: i64,
    /// Renewals and releases refused as fenced for this run.
    pub fenced: u32,
    /// The reason of the last fenced refusal.
    pub fenced_reason: &'static str,
}

/// What happened to a run.
#[derive(Debug, Clone, Serialize)]
pub struct RunEvent {
    /// `won`, `released`, `lease_ended` or `fenced`.
    pub kind: &'static str,
    /// The RPC: `claim`, `hold`, `renew` or `release`.
    pub op: &'static str,
    /// `taken_over`, `holder_dead`, ... for fenced refusals.
    pub reason: &'static str,
    /// This host's clock.
    pub at_ms: i64,
    /// The run after the event.
    pub run: RunView,
}

/// The ring and the broadcast. One per sidecar, shared by the Claims service
/// and the admin server.
pub struct RunFeed {
    /// Each run with a hash of its job, which the lookup of every event
    /// compares before the job's name (the names compared for all 200 runs
    /// were 4 % of a claim's instructions).
    ring: Mutex<VecDeque<(u64, RunView)>>,
    /// Events as JSON, serialized once for every subscriber.
    events: broadcast::Sender<Arc<str>>,
}

impl Default for RunFeed {
    fn default() -> Self {
        RunFeed {
            ring: Mutex::new(VecDeque::with_capacity(MAX_RUNS)),
            events: broadcast::channel(BROADCAST).0,
        }
    }
}

impl RunFeed {
    fn ring(&self) -> MutexGuard<'_, VecDeque<(u64, RunView)>> {
        self.ring.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The recent runs (oldest first) and a subscription to what happens
    /// next, taken together: no event is missed or seen twice.
    pub fn subscribe(&self) -> (Vec<RunView>, broadcast::Receiver<Arc<str>>) {
        let ring = self.ring();
        (
            ring.iter().map(|(_, r)| r.clone()).collect(),
            self.events.subscribe(),
        )
    }

    /// A claim or hold was won here (attempt > 1 is a takeover).
    pub fn won(&self, op: &'static str, spec: &ClaimSpec, a: &ClaimAnswer) {
        let holder = a.holder.as_ref().unwrap_or(&spec.holder).to_string();
        self.update("won", op, "", spec.job.as_str(), spec.slot_ms, |r| {
            if r.attempt != a.attempt || r.fencing != a.fencing {
                // A new attempt: forget what the previous one did.
                r.state = "RUNNING";
                r.finished_at_ms = 0;
                r.fenced = 0;
                r.fenced_reason = "";
            }
            r.attempt = a.attempt;
            r.fencing = a.fencing;
            r.holder = holder;
            r.claimed_at_ms = a.now_ms;
            r.lease_until_ms = a.lease_until_ms;
        });
    }

    /// The holder released the run.
    pub fn released(&self, job: &str, slot_ms: SlotMs, result: ReleaseResult) {
        self.update("released", "release", "", job, slot_ms, |r| {
            r.state = result.state().as_str();
            if r.finished_at_ms == 0 {
                r.finished_at_ms = host_now_ms();
            }
        });
    }

    /// A `Hold` stream broke without a release; the lease ended at once.
    pub fn lease_ended(&self, job: &str, slot_ms: SlotMs) {
        self.update("lease_ended", "hold", "", job, slot_ms, |r| {
            r.lease_until_ms = host_now_ms();
        });
    }

    /// A renewal or release was refused: the token no longer holds the run.
    pub fn fenced(&self, op: &'static str, job: &str, slot_ms: SlotMs, reason: &'static str) {
        self.update("fenced", op, reason, job, slot_ms, |r| {
            r.fenced = r.fenced.saturating_add(1);
            r.fenced_reason = reason;
        });
    }

    /// Applies `f` to the run (added if unknown, evicting the oldest run of
    /// the job or overall when full) and tells the subscribers.
    fn update(
        &self,
        kind: &'static str,
        op: &'static str,
        reason: &'static str,
        job: &str,
        slot_ms: SlotMs,
        f: impl FnOnce(&mut RunView),
    ) {
        let hash = job_hash(job);
        let mut ring = self.ring();
        // One pass finds the run, or else counts the job's runs and its
        // oldest (three passes were 5 % of the instructions of a claim).
        let (mut found, mut same_job, mut oldest) = (None, 0usize, None);
        for (i, (h, r)) in ring.iter().enumerate() {
            if *h == hash && r.job == job {
                if r.slot_ms == slot_ms {
                    found = Some(i);
                    break;
                }
                same_job += 1;
                oldest.get_or_insert(i);
            }
        }
        let i = match found {
            Some(i) => i,
            None => {
                if same_job >= MAX_RUNS_PER_JOB {
                    if let Some(old) = oldest {
                        ring.remove(old);
                    }
                } else if ring.len() >= MAX_RUNS {
                    ring.pop_front();
                }
                ring.push_back((
                    hash,
                    RunView {
                        job: job.to_owned(),
                        slot_ms,
                        attempt: 0,
                        fencing: 0,
                        state: "RUNNING",
                        holder: String::new(),
                        claimed_at_ms: 0,
                        finished_at_ms: 0,
                        lease_until_ms: 0,
                        fenced: 0,
                        fenced_reason: "",
                    },
                ));
                ring.len() - 1
            }
        };
        let Some((_, run)) = ring.get_mut(i) else {
            return;
        };
        f(run);
        // Sent under the ring lock, so `subscribe` sees each event either in
        // its snapshot or on its receiver, never both.
        if self.events.receiver_count() > 0 {
            let ev = RunEvent {
                kind,
                op,
                reason,
                at_ms: host_now_ms(),
                run: run.clone(),
            };
            if let Ok(json) = serde_json::to_string(&ev) {
                let _ = self.events.send(json.into());
            }
        }
    }
}

/// The hash the ring keeps beside each run's job.
fn job_hash(job: &str) -> u64 {
    let mut h = DefaultHasher::new();
    job.hash(&mut h);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::claim::*;

    fn spec(job: &str, slot_ms: i64) -> ClaimSpec {
        ClaimSpec {
            job: Job::parse(job).unwrap(),
            slot_ms,
            token: Token::generate(),
            holder: Holder {
                node: "n1".into(),
                instance: 2,
            },
            lease_ms: 1000,
            max_late_ms: 1000,
            overlap: Overlap::Allow,
            max_attempts: 3,
        }
    }

    fn won(attempt: u32, fencing: u64) -> ClaimAnswer {
        ClaimAnswer {
            attempt,
            fencing,
            lease_until_ms: 2000,
            ..ClaimAnswer::bare(Outcome::Won, 1000, None)
        }
    }

    #[test]
    fn runs_follow_their_events() {
        let feed = RunFeed::default();
        let (snap, mut rx) = feed.subscribe();
        assert!(snap.is_empty());
        feed.won("claim", &spec("a", 5), &won(1, 1));
        feed.fenced("renew", "a", 5, "taken_over");
        feed.won("claim", &spec("a", 5), &won(2, 2));
        feed.released("a", 5, ReleaseResult::Failed);
        feed.released("b", 7, ReleaseResult::Succeeded);
        let (snap, _) = feed.subscribe();
        assert_eq!(snap.len(), 2);
        let a = &snap[0];
        assert_eq!(
            (a.attempt, a.fencing, a.state, a.fenced, a.holder.as_str()),
            (2, 2, "FAILED", 0, "n1/2")
        );
        assert!(a.finished_at_ms > 0);
        assert_eq!((snap[1].job.as_str(), snap[1].attempt), ("b", 0));
        let kinds: Vec<String> = std::iter::from_fn(|| rx.try_recv().ok())
            .map(|j| {
                let v: serde_json::Value = serde_json::from_str(&j).unwrap();
                assert!(v.get("run").and_then(|r| r.get("token")).is_none());
                v["kind"].as_str().unwrap().to_owned()
            })
            .collect();
        assert_eq!(kinds, ["won", "fenced", "won", "released", "released"]);
    }

    #[test]
    fn the_ring_is_bounded_overall_and_per_job() {
        let feed = RunFeed::default();
        for slot in 0..50 {
            feed.won("claim", &spec("busy", slot), &won(1, 1));
        }
        let (snap, _) = feed.subscribe();
        assert_eq!(snap.len(), MAX_RUNS_PER_JOB);
        assert_eq!(snap[0].slot_ms, 50 - MAX_RUNS_PER_JOB as i64);
        for j in 0..MAX_RUNS {
            feed.won("claim", &spec(&format!("j{j}"), 1), &won(1, 1));
        }
        let (snap, _) = feed.subscribe();
        assert_eq!(snap.len(), MAX_RUNS);
        assert!(snap.iter().all(|r| r.job != "busy"));
        assert_eq!(snap[MAX_RUNS - 1].job, format!("j{}", MAX_RUNS - 1));
    }
}
