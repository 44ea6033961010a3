//! The lease decision table (SPEC §3.1), as pure functions.
//!
//! The SQL stores run [`decide`] inside their transaction, on the row they
//! read under the lock and the store's `now`; the Redis `lease` script
//! implements the same table in Lua, and the conformance suite proves that
//! they agree.
//!
//! Slot 0 is a lock that is not tied to time: it is never `LATE`, a lapsed or
//! dead holder is always taken over, and once released it is free again. A
//! relock after a release is a *new run* (attempt 1, not a takeover); the
//! job's fencing number still rises, so a stale holder stays fenced.

use super::types::*;
use crate::error::{Error, FenceReason, Result};

/// What the atomic step must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// No run, too late to start it. Write nothing.
    Late,
    /// `overlap = SKIP` and another run of the job excludes. Write nothing.
    Overlap(Holder),
    /// No run: write attempt 1 for the caller.
    Insert,
    /// The caller's token already holds the run, lease current: answer it again.
    Resend,
    /// Another live holder has a current lease.
    Running,
    /// The lease lapsed or the holder died: the caller takes attempt + 1.
    Takeover,
    /// The lease lapsed or the holder died, and attempts ran out: mark the run
    /// `INTERRUPTED`, answer `DONE`.
    Exhausted,
    /// The run finished.
    Done,
    /// Slot 0 only: a finished lock is free again; the caller starts a new
    /// run (attempt 1, the next fencing number). Not a takeover.
    Relock,
}

impl Decision {
    /// Whether carrying out this decision writes to the store.
    pub fn writes(&self) -> bool {
        matches!(
            self,
            Decision::Insert | Decision::Takeover | Decision::Exhausted | Decision::Relock
        )
    }

    /// Whether the caller wins, so the job's fencing number must move on.
    pub fn wins(&self) -> bool {
        matches!(
            self,
            Decision::Insert | Decision::Takeover | Decision::Relock
        )
    }

    /// The row to write, if any. `fencing` is the job's next fencing number
    /// (only used when the caller wins).
    pub fn next_row(
        &self,
        spec: &ClaimSpec,
        run: Option<&RunRow>,
        now: i64,
        fencing: u64,
    ) -> Option<RunRow> {
        let won = |attempt: u32| RunRow {
            slot_ms: spec.slot_ms,
            state: RunState::Running,
            attempt,
            fencing,
            token: spec.token.clone(),
            holder: spec.holder.clone(),
            lease_until_ms: now.saturating_add(spec.lease_ms),
            claimed_at_ms: now,
            finished_at_ms: 0,
        };
        match (self, run) {
            (Decision::Insert | Decision::Relock, _) => Some(won(1)),
            (Decision::Takeover, Some(r)) => Some(won(r.attempt.saturating_add(1))),
            (Decision::Exhausted, Some(r)) => Some(RunRow {
                state: RunState::Interrupted,
                finished_at_ms: now,
                ..r.clone()
            }),
            _ => None,
        }
    }

    /// The answer for the caller. `run` is the row read under the lock and
    /// `written` the row this decision wrote.
    pub fn answer(
        &self,
        spec: &ClaimSpec,
        run: Option<&RunRow>,
        written: Option<&RunRow>,
        now: i64,
    ) -> ClaimAnswer {
        let won = |r: &RunRow| ClaimAnswer {
            outcome: Outcome::Won,
            token: Some(spec.token.clone()),
            attempt: r.attempt,
            fencing: r.fencing,
            lease_until_ms: r.lease_until_ms,
            now_ms: now,
            holder: Some(r.holder.clone()),
            reason: None,
        };
        match self {
            Decision::Late => ClaimAnswer::bare(Outcome::Late, now, Some("too_late")),
            Decision::Overlap(h) => ClaimAnswer {
                holder: Some(h.clone()),
                ..ClaimAnswer::bare(Outcome::Overlap, now, Some("job_running"))
            },
            Decision::Insert | Decision::Takeover | Decision::Relock => match written {
                Some(r) => won(r),
                None => ClaimAnswer::bare(Outcome::Lost, now, Some("unknown")),
            },
            Decision::Resend => match run {
                Some(r) => won(r),
                None => ClaimAnswer::bare(Outcome::Lost, now, Some("unknown")),
            },
            Decision::Running => match run {
                Some(r) => ClaimAnswer {
                    attempt: r.attempt,
                    lease_until_ms: r.lease_until_ms,
                    holder: Some(r.holder.clone()),
                    ..ClaimAnswer::bare(Outcome::Running, now, None)
                },
                None => ClaimAnswer::bare(Outcome::Running, now, None),
            },
            Decision::Exhausted => ClaimAnswer {
                attempt: run.map_or(0, |r| r.attempt),
                ..ClaimAnswer::bare(Outcome::Done, now, Some("interrupted"))
            },
            Decision::Done => {
                let reason = match run.map(|r| r.state) {
                    Some(RunState::Succeeded) => "succeeded",
                    Some(RunState::Failed) => "failed",
                    Some(RunState::Interrupted) => "interrupted",
                    _ => "finished",
                };
                ClaimAnswer {
                    attempt: run.map_or(0, |r| r.attempt),
                    ..ClaimAnswer::bare(Outcome::Done, now, Some(reason))
                }
            }
        }
    }
}

/// Whether `run` keeps others out right now: running, lease current, holder alive.
pub fn excludes(run: &RunRow, now: i64, dead: &DeadHolders) -> bool {
    run.state == RunState::Running && run.lease_until_ms > now && !dead.is_dead(&run.holder)
}

/// The decision table. `run` is the (job, slot) row, `others` the running
/// runs of the same job (only consulted for `overlap = SKIP` when a run would
/// start), `now` the store's clock.
pub fn decide(
    now: i64,
    spec: &ClaimSpec,
    dead: &DeadHolders,
    run: Option<&RunRow>,
    others: &[RunRow],
) -> Decision {
    let overlapping = || {
        if spec.overlap != Overlap::Skip {
            return None;
        }
        others
            .iter()
            .find(|o| o.slot_ms != spec.slot_ms && excludes(o, now, dead))
            .map(|o| o.holder.clone())
    };
    match run {
        None => {
            if spec.slot_ms != 0 && now.saturating_sub(spec.slot_ms) > spec.max_late_ms {
                Decision::Late
            } else if let Some(h) = overlapping() {
                Decision::Overlap(h)
            } else {
                Decision::Insert
            }
        }
        Some(r) if r.state == RunState::Running => {
            if excludes(r, now, dead) {
                if r.token == spec.token {
                    Decision::Resend
                } else {
                    Decision::Running
                }
            } else if spec.slot_ms == 0 || r.attempt < spec.max_attempts {
                Decision::Takeover
            } else {
                Decision::Exhausted
            }
        }
        Some(_) if spec.slot_ms == 0 => match overlapping() {
            Some(h) => Decision::Overlap(h),
            None => Decision::Relock,
        },
        Some(_) => Decision::Done,
    }
}

/// Why `token`, which is not the run's, is refused.
///
/// The store keeps only the current holder's token, so it cannot tell an
/// earlier holder from a stranger directly. The rule: a run at attempt 1 was
/// never taken over, so no token other than its own ever held it — the
/// caller is `not_holder` (a wrong or made-up token, or a token of an
/// earlier, finished run of a relocked slot 0). A run past attempt 1 was
/// taken over, and the token may be an earlier attempt's: `taken_over`.
pub fn wrong_token(run: &RunRow) -> FenceReason {
    if run.attempt > 1 {
        FenceReason::TakenOver
    } else {
        FenceReason::NotHolder
    }
}

/// May `token` renew `run`? Returns the run it renews.
pub fn decide_renew<'a>(
    run: Option<&'a RunRow>,
    token: &Token,
    dead: &DeadHolders,
) -> Result<&'a RunRow> {
    let r = run.ok_or_else(|| Error::NotFound("no such run".into()))?;
    if &r.token != token {
        return Err(Error::Fenced(wrong_token(r)));
    }
    match r.state {
        RunState::Running => {}
        RunState::Succeeded | RunState::Failed => return Err(Error::Fenced(FenceReason::Released)),
        RunState::Interrupted | RunState::Claimed => {
            return Err(Error::Fenced(FenceReason::Finished))
        }
    }
    if dead.is_dead(&r.holder) {
        return Err(Error::Fenced(FenceReason::HolderDead));
    }
    Ok(r)
}

/// What a release does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReleaseDecision {
    /// Mark the run finished with the result.
    Write,
    /// Already released with this token: nothing to do (idempotent).
    AlreadyReleased,
}

pub fn decide_release(
    run: Option<&RunRow>,
    token: &Token,
    dead: &DeadHolders,
) -> Result<ReleaseDecision> {
    let r = run.ok_or_else(|| Error::NotFound("no such run".into()))?;
    if &r.token != token {
        return Err(Error::Fenced(wrong_token(r)));
    }
    match r.state {
        RunState::Succeeded | RunState::Failed => Ok(ReleaseDecision::AlreadyReleased),
        RunState::Interrupted | RunState::Claimed => Err(Error::Fenced(FenceReason::Finished)),
        RunState::Running if dead.is_dead(&r.holder) => Err(Error::Fenced(FenceReason::HolderDead)),
        RunState::Running => Ok(ReleaseDecision::Write),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_000_000;

    fn holder(n: &str, i: u64) -> Holder {
        Holder {
            node: n.into(),
            instance: i,
        }
    }

    fn spec(slot: i64) -> ClaimSpec {
        ClaimSpec {
            job: Job::parse("j").unwrap(),
            slot_ms: slot,
            token: Token::parse(&"a".repeat(32)).unwrap(),
            holder: holder("me", 1),
            lease_ms: 1000,
            max_late_ms: 500,
            overlap: Overlap::Allow,
            max_attempts: 2,
        }
    }

    fn row(slot: i64, state: RunState, attempt: u32, lease_until: i64, tok: char) -> RunRow {
        RunRow {
            slot_ms: slot,
            state,
            attempt,
            fencing: 7,
            token: Token::parse(&tok.to_string().repeat(32)).unwrap(),
            holder: holder("other", 1),
            lease_until_ms: lease_until,
            claimed_at_ms: NOW - 10,
            finished_at_ms: 0,
        }
    }

    fn none() -> DeadHolders {
        DeadHolders::none()
    }

    #[test]
    fn missing_run_in_time_is_inserted_as_attempt_one() {
        let s = spec(NOW - 500);
        let d = decide(NOW, &s, &none(), None, &[]);
        assert_eq!(d, Decision::Insert);
        let w = d.next_row(&s, None, NOW, 9).unwrap();
        assert_eq!((w.attempt, w.fencing, w.lease_until_ms), (1, 9, NOW + 1000));
        let a = d.answer(&s, None, Some(&w), NOW);
        assert_eq!(a.outcome, Outcome::Won);
        assert_eq!(a.valid_for_ms(), 1000);
    }

    #[test]
    fn missing_run_too_late_writes_nothing() {
        let s = spec(NOW - 501);
        let d = decide(NOW, &s, &none(), None, &[]);
        assert_eq!(d, Decision::Late);
        assert!(!d.writes());
        assert!(d.next_row(&s, None, NOW, 1).is_none());
    }

    #[test]
    fn slot_zero_is_never_late() {
        assert_eq!(decide(NOW, &spec(0), &none(), None, &[]), Decision::Insert);
    }

    #[test]
    fn future_slots_are_not_late() {
        assert_eq!(
            decide(NOW, &spec(NOW + 99_999), &none(), None, &[]),
            Decision::Insert
        );
    }

    #[test]
    fn overlap_skip_sees_live_runs_of_other_slots_only() {
        let mut s = spec(NOW);
        s.overlap = Overlap::Skip;
        let live = row(NOW - 100, RunState::Running, 1, NOW + 1, 'b');
        let lapsed = row(NOW - 100, RunState::Running, 1, NOW, 'b');
        let done = row(NOW - 100, RunState::Succeeded, 1, NOW + 1, 'b');
        assert_eq!(
            decide(NOW, &s, &none(), None, std::slice::from_ref(&live)),
            Decision::Overlap(holder("other", 1))
        );
        assert_eq!(
            decide(NOW, &s, &none(), None, &[lapsed, done]),
            Decision::Insert
        );
        let mut dead = none();
        dead.mark_dead(holder("other", 1));
        assert_eq!(
            decide(NOW, &s, &dead, None, std::slice::from_ref(&live)),
            Decision::Insert
        );
        s.overlap = Overlap::Allow;
        assert_eq!(decide(NOW, &s, &none(), None, &[live]), Decision::Insert);
    }

    #[test]
    fn resend_with_same_token_is_won_again_without_write() {
        let s = spec(NOW);
        let mut r = row(NOW, RunState::Running, 1, NOW + 5, 'a');
        r.holder = s.holder.clone();
        let d = decide(NOW, &s, &none(), Some(&r), &[]);
        assert_eq!(d, Decision::Resend);
        assert!(!d.writes());
        let a = d.answer(&s, Some(&r), None, NOW);
        assert_eq!(
            (a.outcome, a.attempt, a.valid_for_ms()),
            (Outcome::Won, 1, 5)
        );
    }

    #[test]
    fn live_current_lease_is_running() {
        let s = spec(NOW);
        let r = row(NOW, RunState::Running, 1, NOW + 1, 'b');
        let d = decide(NOW, &s, &none(), Some(&r), &[]);
        assert_eq!(d, Decision::Running);
        let a = d.answer(&s, Some(&r), None, NOW);
        assert_eq!(a.outcome, Outcome::Running);
        assert!(a.token.is_none());
        assert_eq!(a.holder, Some(holder("other", 1)));
    }

    #[test]
    fn lapsed_lease_is_taken_over_with_next_attempt() {
        let s = spec(NOW);
        let r = row(NOW, RunState::Running, 1, NOW, 'b');
        let d = decide(NOW, &s, &none(), Some(&r), &[]);
        assert_eq!(d, Decision::Takeover);
        let w = d.next_row(&s, Some(&r), NOW, 8).unwrap();
        assert_eq!((w.attempt, w.fencing, &w.token), (2, 8, &s.token));
    }

    #[test]
    fn dead_holder_is_taken_over_even_with_current_lease() {
        let s = spec(NOW);
        let r = row(NOW, RunState::Running, 1, NOW + 60_000, 'b');
        let mut dead = none();
        dead.set_current("other", 2); // it restarted
        assert_eq!(decide(NOW, &s, &dead, Some(&r), &[]), Decision::Takeover);
    }

    #[test]
    fn own_token_of_a_dead_holder_is_not_a_resend() {
        let s = spec(NOW);
        let r = row(NOW, RunState::Running, 1, NOW + 60_000, 'a');
        let mut dead = none();
        dead.mark_dead(holder("other", 1));
        assert_eq!(decide(NOW, &s, &dead, Some(&r), &[]), Decision::Takeover);
    }

    #[test]
    fn exhausted_attempts_interrupt_the_run() {
        let s = spec(NOW);
        let r = row(NOW, RunState::Running, 2, NOW - 1, 'b');
        let d = decide(NOW, &s, &none(), Some(&r), &[]);
        assert_eq!(d, Decision::Exhausted);
        let w = d.next_row(&s, Some(&r), NOW, 99).unwrap();
        assert_eq!(
            (w.state, w.attempt, w.fencing, w.finished_at_ms),
            (RunState::Interrupted, 2, 7, NOW)
        );
        let a = d.answer(&s, Some(&r), Some(&w), NOW);
        assert_eq!((a.outcome, a.reason), (Outcome::Done, Some("interrupted")));
    }

    #[test]
    fn finished_runs_are_done() {
        for st in [RunState::Succeeded, RunState::Failed, RunState::Interrupted] {
            let r = row(NOW, st, 1, NOW + 1, 'a');
            assert_eq!(
                decide(NOW, &spec(NOW), &none(), Some(&r), &[]),
                Decision::Done
            );
        }
    }

    #[test]
    fn slot_zero_lock_is_free_again_after_release_and_never_exhausts() {
        let s = spec(0);
        let done = row(0, RunState::Succeeded, 5, 0, 'b');
        assert_eq!(decide(NOW, &s, &none(), Some(&done), &[]), Decision::Relock);
        let w = Decision::Relock.next_row(&s, Some(&done), NOW, 8).unwrap();
        assert_eq!(
            (w.attempt, w.fencing),
            (1, 8),
            "a relock is a new run, not a takeover; fencing still rises"
        );
        let lapsed = row(0, RunState::Running, 9, NOW - 1, 'b');
        assert_eq!(
            decide(NOW, &s, &none(), Some(&lapsed), &[]),
            Decision::Takeover
        );
    }

    #[test]
    fn renew_rules() {
        let me = Token::parse(&"a".repeat(32)).unwrap();
        let r = row(NOW, RunState::Running, 1, NOW - 1, 'a');
        assert!(
            decide_renew(Some(&r), &me, &none()).is_ok(),
            "a lapsed lease nobody took is still ours"
        );
        assert!(matches!(
            decide_renew(None, &me, &none()),
            Err(Error::NotFound(_))
        ));
        let other = row(NOW, RunState::Running, 2, NOW + 1, 'b');
        assert!(matches!(
            decide_renew(Some(&other), &me, &none()),
            Err(Error::Fenced(FenceReason::TakenOver))
        ));
        let never = row(NOW, RunState::Running, 1, NOW + 1, 'b');
        assert!(matches!(
            decide_renew(Some(&never), &me, &none()),
            Err(Error::Fenced(FenceReason::NotHolder))
        ));
        let fin = row(NOW, RunState::Succeeded, 1, NOW + 1, 'a');
        assert!(matches!(
            decide_renew(Some(&fin), &me, &none()),
            Err(Error::Fenced(FenceReason::Released))
        ));
        let mut dead = none();
        dead.set_current("other", 2);
        assert!(matches!(
            decide_renew(Some(&r), &me, &dead),
            Err(Error::Fenced(FenceReason::HolderDead))
        ));
    }

    #[test]
    fn release_rules() {
        let me = Token::parse(&"a".repeat(32)).unwrap();
        let r = row(NOW, RunState::Running, 1, NOW + 1, 'a');
        assert_eq!(
            decide_release(Some(&r), &me, &none()).unwrap(),
            ReleaseDecision::Write
        );
        let fin = row(NOW, RunState::Failed, 1, NOW + 1, 'a');
        assert_eq!(
            decide_release(Some(&fin), &me, &none()).unwrap(),
            ReleaseDecision::AlreadyReleased
        );
        let int = row(NOW, RunState::Interrupted, 1, NOW + 1, 'a');
        assert!(matches!(
            decide_release(Some(&int), &me, &none()),
            Err(Error::Fenced(_))
        ));
        let other = row(NOW, RunState::Running, 1, NOW + 1, 'b');
        assert!(matches!(
            decide_release(Some(&other), &me, &none()),
            Err(Error::Fenced(FenceReason::NotHolder))
        ));
        let taken = row(NOW, RunState::Running, 3, NOW + 1, 'b');
        assert!(matches!(
            decide_release(Some(&taken), &me, &none()),
            Err(Error::Fenced(FenceReason::TakenOver))
        ));
        assert!(matches!(
            decide_release(None, &me, &none()),
            Err(Error::NotFound(_))
        ));
    }
}
