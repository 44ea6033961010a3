//! The store conformance suite: every behaviour of the claim contract,
//! written once against `&dyn Store`. `conformance!` in
//! `tests/conformance.rs` stamps each test onto every backend.
//!
//! Backends without leases (`info().leases == false`) are checked for their
//! declared refusal (`no_leases`) and their once semantics instead.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use anarchon::claim::*;
use anarchon::error::{Error, FenceReason};
use anarchon::store::{Leases, Store};

use super::{holder, job, spec};

fn none() -> DeadHolders {
    DeadHolders::none()
}

fn now() -> i64 {
    host_now_ms()
}

fn renew_spec(j: &Job, slot_ms: i64, token: &Token, lease_ms: i64) -> RenewSpec {
    RenewSpec {
        job: j.clone(),
        slot_ms,
        token: token.clone(),
        lease_ms,
    }
}

pub async fn win(s: &dyn Store) {
    let j = job("win");
    let sp = spec(&j, now(), &holder("a", 1));
    let a = s.claim(&sp, &none()).await.unwrap();
    assert_eq!(a.outcome, Outcome::Won, "{a:?}");
    assert_eq!(a.token.as_ref(), Some(&sp.token));
    assert_eq!(a.attempt, 1);
    assert!(a.fencing >= 1);
    if s.info().leases {
        assert!(a.lease_until_ms > a.now_ms);
        let v = a.valid_for_ms();
        assert!(v > 29_000 && v <= 30_000, "valid_for {v}");
        assert_eq!(a.holder, Some(holder("a", 1)));
    }
}

pub async fn resend_same_token(s: &dyn Store) {
    let j = job("resend");
    let sp = spec(&j, now(), &holder("a", 1));
    let first = s.claim(&sp, &none()).await.unwrap();
    assert_eq!(first.outcome, Outcome::Won);
    let again = s.claim(&sp, &none()).await.unwrap();
    if s.info().backend == "rabbitmq" {
        // A gate queue cannot compare tokens: a resend finds it full.
        assert_eq!(again.outcome, Outcome::Lost, "{again:?}");
        assert!(again.token.is_none());
        return;
    }
    assert_eq!(
        again.outcome,
        Outcome::Won,
        "a resend must be told it still holds the run"
    );
    assert_eq!(
        (again.attempt, again.fencing),
        (first.attempt, first.fencing)
    );
    assert_eq!(again.token, first.token);
}

pub async fn second_claimer_is_excluded(s: &dyn Store) {
    let j = job("excl");
    let slot = now();
    let a = s
        .claim(&spec(&j, slot, &holder("a", 1)), &none())
        .await
        .unwrap();
    assert_eq!(a.outcome, Outcome::Won);
    let b = s
        .claim(&spec(&j, slot, &holder("b", 1)), &none())
        .await
        .unwrap();
    if s.info().leases {
        assert_eq!(b.outcome, Outcome::Running, "{b:?}");
        assert_eq!(b.holder, Some(holder("a", 1)));
    } else {
        assert_eq!(b.outcome, Outcome::Lost, "{b:?}");
    }
    assert!(
        b.token.is_none(),
        "a loser must never see the holder's token"
    );
}

pub async fn takeover_after_lapsed_lease(s: &dyn Store) {
    let j = job("lapse");
    let slot = now();
    // The lease is long enough that the early claim below lands inside it
    // even on a loaded CI machine, and the test checks that it did by the
    // client's own clock: the lease starts after `sent`, so an answer that
    // came back before `sent + LEASE` was decided while the lease held.
    const LEASE: Duration = Duration::from_millis(400);
    let mut a = spec(&j, slot, &holder("a", 1));
    a.lease_ms = LEASE.as_millis() as i64;
    let sent = std::time::Instant::now();
    let first = s.claim(&a, &none()).await.unwrap();
    // The store started the lease no later than its answer arrived.
    let lapsed_at = std::time::Instant::now() + LEASE + Duration::from_millis(30);
    assert_eq!(first.outcome, Outcome::Won);
    let b = spec(&j, slot, &holder("b", 1));
    if !s.info().leases {
        tokio::time::sleep_until(lapsed_at.into()).await;
        let lost = s.claim(&b, &none()).await.unwrap();
        assert_eq!(
            lost.outcome,
            Outcome::Lost,
            "once backends never hand a slot over"
        );
        return;
    }
    // Before the lease lapses: RUNNING.
    let early = s.claim(&b, &none()).await.unwrap();
    let answered = sent.elapsed();
    assert!(
        answered < LEASE,
        "the early claim took {answered:?}, longer than the {LEASE:?} lease: \
         the machine is too loaded for this case to say anything"
    );
    assert_eq!(early.outcome, Outcome::Running, "{early:?}");
    tokio::time::sleep_until(lapsed_at.into()).await;
    let won = s.claim(&b, &none()).await.unwrap();
    assert_eq!(won.outcome, Outcome::Won, "{won:?}");
    assert_eq!(won.attempt, 2);
    assert!(won.fencing > first.fencing, "fencing must rise on takeover");
    // The old holder is fenced.
    let renew = renew_spec(&j, slot, &a.token, 1000);
    assert!(matches!(
        leases(s).renew(&renew, &none()).await,
        Err(Error::Fenced(FenceReason::TakenOver))
    ));
}

pub async fn takeover_of_dead_holder(s: &dyn Store) {
    if !s.info().leases {
        return no_leases(s).await;
    }
    let j = job("dead");
    let slot = now();
    let a = spec(&j, slot, &holder("a", 1));
    assert_eq!(s.claim(&a, &none()).await.unwrap().outcome, Outcome::Won);
    let b = spec(&j, slot, &holder("b", 1));
    assert_eq!(
        s.claim(&b, &none()).await.unwrap().outcome,
        Outcome::Running
    );
    let mut dead = none();
    dead.mark_dead(holder("a", 1));
    let won = s.claim(&b, &dead).await.unwrap();
    assert_eq!((won.outcome, won.attempt), (Outcome::Won, 2), "{won:?}");
    // A restarted holder (a newer instance known) is dead too.
    let c = spec(&j, slot, &holder("c", 1));
    let mut restarted = none();
    restarted.set_current("b", 2);
    let won = s.claim(&c, &restarted).await.unwrap();
    assert_eq!((won.outcome, won.attempt), (Outcome::Won, 3), "{won:?}");
    // The old holders are fenced.
    let renew = renew_spec(&j, slot, &b.token, 1000);
    assert!(matches!(
        leases(s).renew(&renew, &none()).await,
        Err(Error::Fenced(_))
    ));
}

pub async fn attempts_exhausted(s: &dyn Store) {
    if !s.info().leases {
        return no_leases(s).await;
    }
    let j = job("exhaust");
    let slot = now();
    let mk = |n: &str| {
        let mut x = spec(&j, slot, &holder(n, 1));
        x.lease_ms = 40;
        x.max_attempts = 2;
        x
    };
    assert_eq!(s.claim(&mk("a"), &none()).await.unwrap().attempt, 1);
    tokio::time::sleep(Duration::from_millis(60)).await;
    let second = s.claim(&mk("b"), &none()).await.unwrap();
    assert_eq!((second.outcome, second.attempt), (Outcome::Won, 2));
    tokio::time::sleep(Duration::from_millis(60)).await;
    let third = s.claim(&mk("c"), &none()).await.unwrap();
    assert_eq!(third.outcome, Outcome::Done, "{third:?}");
    assert_eq!(third.reason, Some("interrupted"));
    let h = s.history(&j, 10, None).await.unwrap();
    assert_eq!(h.runs.len(), 1);
    assert_eq!(h.runs[0].state, RunState::Interrupted);
    assert_eq!(h.runs[0].attempt, 2);
    // And it stays done.
    assert_eq!(
        s.claim(&mk("d"), &none()).await.unwrap().outcome,
        Outcome::Done
    );
}

pub async fn late_writes_nothing(s: &dyn Store) {
    let j = job("late");
    let slot = now() - 10 * 60_000;
    let a = s
        .claim(&spec(&j, slot, &holder("a", 1)), &none())
        .await
        .unwrap();
    assert_eq!(a.outcome, Outcome::Late, "{a:?}");
    assert!(a.token.is_none());
    let h = s.history(&j, 10, None).await.unwrap();
    assert!(h.runs.is_empty(), "LATE must write nothing: {:?}", h.runs);
    // A wider max_late admits the same slot.
    let mut wide = spec(&j, slot, &holder("a", 1));
    wide.max_late_ms = 3_600_000;
    assert_eq!(s.claim(&wide, &none()).await.unwrap().outcome, Outcome::Won);
}

/// A slot more than `max_future_ms` (default 1 day) ahead of the store's
/// clock is `INVALID_ARGUMENT` naming `slot_ms`, and nothing is written:
/// `i64::MAX`, and the slot that would poison a Redis `stream-id` job (every
/// later, smaller slot would be `LATE` for ever).
pub async fn far_future_slot_is_refused_and_writes_nothing(s: &dyn Store) {
    let j = job("future");
    let day = 24 * 3_600_000;
    for slot in [i64::MAX, 9_999_999_999_999, now() + day + 60_000] {
        match s.claim(&spec(&j, slot, &holder("a", 1)), &none()).await {
            Err(Error::InvalidArgument { field, .. }) => assert_eq!(field, "slot_ms"),
            other => panic!("slot {slot} must be refused, got {other:?}"),
        }
    }
    // Nothing was written: the job's present slot is won as usual (a written
    // far slot would make it LATE on stream-id), and history is empty of them.
    let a = s
        .claim(&spec(&j, now(), &holder("a", 1)), &none())
        .await
        .unwrap();
    assert_eq!(a.outcome, Outcome::Won, "{a:?}");
    let h = s.history(&j, 10, None).await.unwrap();
    assert!(h.runs.iter().all(|r| r.slot_ms <= now()), "{:?}", h.runs);
    // A slot inside the bound is claimed as usual.
    let k = job("future-ok");
    let b = s
        .claim(&spec(&k, now() + 3_600_000, &holder("a", 1)), &none())
        .await
        .unwrap();
    assert_eq!(b.outcome, Outcome::Won, "{b:?}");
}

pub async fn overlap_skip(s: &dyn Store) {
    if !s.info().leases {
        return no_leases(s).await;
    }
    let j = job("overlap");
    let t = now();
    assert_eq!(
        s.claim(&spec(&j, t - 1000, &holder("a", 1)), &none())
            .await
            .unwrap()
            .outcome,
        Outcome::Won
    );
    let mut skip = spec(&j, t, &holder("b", 1));
    skip.overlap = Overlap::Skip;
    let o = s.claim(&skip, &none()).await.unwrap();
    assert_eq!(o.outcome, Outcome::Overlap, "{o:?}");
    assert_eq!(
        s.history(&j, 10, None).await.unwrap().runs.len(),
        1,
        "OVERLAP writes nothing"
    );
    // ALLOW starts it anyway.
    let allow = spec(&j, t, &holder("b", 1));
    assert_eq!(
        s.claim(&allow, &none()).await.unwrap().outcome,
        Outcome::Won
    );
    // SKIP ignores a running run whose holder is dead.
    let mut skip2 = spec(&j, t + 1000, &holder("c", 1));
    skip2.overlap = Overlap::Skip;
    let mut dead = none();
    dead.mark_dead(holder("a", 1));
    dead.mark_dead(holder("b", 1));
    assert_eq!(s.claim(&skip2, &dead).await.unwrap().outcome, Outcome::Won);
}

pub async fn renew_extends(s: &dyn Store) {
    let j = job("renew");
    let slot = now();
    let mut a = spec(&j, slot, &holder("a", 1));
    a.lease_ms = 1000;
    let won = s.claim(&a, &none()).await.unwrap();
    let r = renew_spec(&j, slot, &a.token, 20_000);
    if !s.info().leases {
        return no_leases(s).await;
    }
    let renewed = leases(s).renew(&r, &none()).await.unwrap();
    assert_eq!(renewed.attempt, won.attempt);
    assert!(
        renewed.lease_until_ms >= won.lease_until_ms + 18_000,
        "{renewed:?}"
    );
    // Unknown run: NOT_FOUND.
    let missing = RenewSpec {
        slot_ms: slot + 1,
        ..r
    };
    assert!(matches!(
        leases(s).renew(&missing, &none()).await,
        Err(Error::NotFound(_))
    ));
}

pub async fn stale_token_is_fenced(s: &dyn Store) {
    let j = job("fenced");
    let slot = now();
    let a = spec(&j, slot, &holder("a", 1));
    assert_eq!(s.claim(&a, &none()).await.unwrap().outcome, Outcome::Won);
    let stranger = Token::generate();
    let rel = ReleaseSpec {
        job: j.clone(),
        slot_ms: slot,
        token: stranger.clone(),
        result: ReleaseResult::Succeeded,
    };
    if !s.info().leases {
        return no_leases(s).await;
    }
    // A token that never held the run is not a takeover.
    assert!(matches!(
        s.release(&rel, &none()).await,
        Err(Error::Fenced(FenceReason::NotHolder))
    ));
    let r = RenewSpec {
        job: j.clone(),
        slot_ms: slot,
        token: stranger,
        lease_ms: 1000,
    };
    assert!(matches!(
        leases(s).renew(&r, &none()).await,
        Err(Error::Fenced(FenceReason::NotHolder))
    ));
    // The holder restarted: its own token is fenced through the new instance.
    let mut restarted = none();
    restarted.set_current("a", 2);
    let own = RenewSpec {
        token: a.token.clone(),
        ..r
    };
    assert!(matches!(
        leases(s).renew(&own, &restarted).await,
        Err(Error::Fenced(FenceReason::HolderDead))
    ));
    let own_rel = ReleaseSpec {
        token: a.token.clone(),
        ..rel
    };
    assert!(matches!(
        s.release(&own_rel, &restarted).await,
        Err(Error::Fenced(_))
    ));
    // Nothing changed: the real holder can still release.
    s.release(&own_rel, &none()).await.unwrap();
}

pub async fn release_is_idempotent(s: &dyn Store) {
    let j = job("release");
    let slot = now();
    let a = spec(&j, slot, &holder("a", 1));
    assert_eq!(s.claim(&a, &none()).await.unwrap().outcome, Outcome::Won);
    let rel = ReleaseSpec {
        job: j.clone(),
        slot_ms: slot,
        token: a.token.clone(),
        result: ReleaseResult::Succeeded,
    };
    s.release(&rel, &none()).await.unwrap();
    s.release(&rel, &none()).await.unwrap();
    let after = s
        .claim(&spec(&j, slot, &holder("b", 1)), &none())
        .await
        .unwrap();
    if s.info().leases {
        assert_eq!(after.outcome, Outcome::Done, "{after:?}");
        let r = renew_spec(&j, slot, &a.token, 1000);
        assert!(matches!(
            leases(s).renew(&r, &none()).await,
            Err(Error::Fenced(_))
        ));
        let h = s.history(&j, 5, None).await.unwrap();
        assert_eq!(h.runs[0].state, RunState::Succeeded);
        assert!(h.runs[0].finished_at_ms > 0);
    } else {
        assert_eq!(after.outcome, Outcome::Lost, "{after:?}");
    }
}

pub async fn history_newest_first(s: &dyn Store) {
    let j = job("hist");
    let base = now() - 5_000;
    for i in 0..5 {
        let a = s
            .claim(&spec(&j, base + i * 1000, &holder("a", 1)), &none())
            .await
            .unwrap();
        assert_eq!(a.outcome, Outcome::Won);
    }
    let h = s.history(&j, 3, None).await.unwrap();
    if !s.info().full_history && h.runs.is_empty() {
        assert!(h.note.is_some(), "a backend without history must say so");
        return;
    }
    let slots: Vec<i64> = h.runs.iter().map(|r| r.slot_ms).collect();
    assert_eq!(slots, vec![base + 4000, base + 3000, base + 2000]);
    let page2 = s.history(&j, 10, Some(base + 2000)).await.unwrap();
    let slots: Vec<i64> = page2.runs.iter().map(|r| r.slot_ms).collect();
    assert_eq!(slots, vec![base + 1000, base]);
}

pub async fn lock_slot_zero(s: &dyn Store) {
    if !s.info().leases {
        return once_slot_zero(s).await;
    }
    let j = job("lock");
    let a = spec(&j, 0, &holder("a", 1));
    let first = s.claim(&a, &none()).await.unwrap();
    assert_eq!(first.outcome, Outcome::Won, "slot 0 is never late");
    assert_eq!(
        s.claim(&spec(&j, 0, &holder("b", 1)), &none())
            .await
            .unwrap()
            .outcome,
        Outcome::Running
    );
    let rel = ReleaseSpec {
        job: j.clone(),
        slot_ms: 0,
        token: a.token.clone(),
        result: ReleaseResult::Succeeded,
    };
    s.release(&rel, &none()).await.unwrap();
    let next = s
        .claim(&spec(&j, 0, &holder("b", 1)), &none())
        .await
        .unwrap();
    assert_eq!(
        (next.outcome, next.attempt),
        (Outcome::Won, 1),
        "a released lock is free again, and re-taking it is a new run, not a takeover"
    );
    assert!(next.fencing > first.fencing, "fencing keeps rising");
    let h = s.history(&j, 5, None).await.unwrap();
    assert_eq!(
        (h.runs[0].attempt, h.runs[0].fencing),
        (1, next.fencing),
        "History shows a new run: {h:?}"
    );
    // A takeover of the lock (its holder died) is the next attempt.
    let mut dead = none();
    dead.mark_dead(holder("b", 1));
    let taken = s.claim(&spec(&j, 0, &holder("c", 1)), &dead).await.unwrap();
    assert_eq!((taken.outcome, taken.attempt), (Outcome::Won, 2));
    assert!(taken.fencing > next.fencing);
    let h = s.history(&j, 5, None).await.unwrap();
    assert_eq!(h.runs[0].attempt, 2, "History shows the takeover: {h:?}");
}

/// Once backends have no leases, so slot 0 is a slot like any other: the
/// first claim wins it, and it stays claimed — released or not — for as long
/// as the backend remembers claims (README, "Backends"). A release records
/// the result where the backend keeps one; it does not free the slot.
async fn once_slot_zero(s: &dyn Store) {
    let j = job("oncelock");
    let a = spec(&j, 0, &holder("a", 1));
    assert_eq!(s.claim(&a, &none()).await.unwrap().outcome, Outcome::Won);
    let rel = ReleaseSpec {
        job: j.clone(),
        slot_ms: 0,
        token: a.token.clone(),
        result: ReleaseResult::Succeeded,
    };
    // RabbitMQ cannot find a claim again, so it cannot record a release.
    let _ = s.release(&rel, &none()).await;
    let b = s
        .claim(&spec(&j, 0, &holder("b", 1)), &none())
        .await
        .unwrap();
    assert_eq!(
        b.outcome,
        Outcome::Lost,
        "a once backend does not free slot 0 on release: {b:?}"
    );
    no_leases(s).await;
}

/// A renew that names no lease keeps the lease the run was claimed with.
pub async fn renew_keeps_the_claimed_lease(s: &dyn Store) {
    if !s.info().leases {
        return no_leases(s).await;
    }
    let j = job("renewkeep");
    let slot = now();
    let mut a = spec(&j, slot, &holder("a", 1));
    a.lease_ms = 5_000;
    let won = s.claim(&a, &none()).await.unwrap();
    assert_eq!(won.valid_for_ms(), 5_000);
    let mut r = renew_spec(&j, slot, &a.token, 0);
    let renewed = leases(s).renew(&r, &none()).await.unwrap();
    let left = renewed.lease_until_ms - renewed.now_ms;
    assert_eq!(
        left, 5_000,
        "renew without a lease keeps the claim's: {renewed:?}"
    );
    // An explicit lease is used, and does not replace the claimed one.
    r.lease_ms = 20_000;
    let renewed = leases(s).renew(&r, &none()).await.unwrap();
    assert_eq!(renewed.lease_until_ms - renewed.now_ms, 20_000);
    r.lease_ms = 0;
    let renewed = leases(s).renew(&r, &none()).await.unwrap();
    assert_eq!(renewed.lease_until_ms - renewed.now_ms, 5_000);
}

pub async fn end_lease_hands_over(s: &dyn Store) {
    if !s.info().leases {
        return no_leases(s).await;
    }
    let j = job("endlease");
    let slot = now();
    let a = spec(&j, slot, &holder("a", 1));
    assert_eq!(s.claim(&a, &none()).await.unwrap().outcome, Outcome::Won);
    assert!(
        !leases(s)
            .end_lease(&j, slot, &Token::generate())
            .await
            .unwrap(),
        "a stranger ends nothing"
    );
    assert!(leases(s).end_lease(&j, slot, &a.token).await.unwrap());
    let b = s
        .claim(&spec(&j, slot, &holder("b", 1)), &none())
        .await
        .unwrap();
    assert_eq!((b.outcome, b.attempt), (Outcome::Won, 2), "{b:?}");
    // Leaving ends every lease of a holder.
    let j2 = job("leave");
    for slot in [slot, slot + 1] {
        assert_eq!(
            s.claim(&spec(&j2, slot, &holder("c", 7)), &none())
                .await
                .unwrap()
                .outcome,
            Outcome::Won
        );
    }
    assert_eq!(leases(s).end_leases_of(&holder("c", 7)).await.unwrap(), 2);
    let d = s
        .claim(&spec(&j2, slot + 1, &holder("d", 1)), &none())
        .await
        .unwrap();
    assert_eq!((d.outcome, d.attempt), (Outcome::Won, 2));
}

pub async fn prune_removes_old_runs(s: &dyn Store) {
    if !s.info().full_history {
        return;
    }
    let j = job("prune");
    let slot = now();
    let a = spec(&j, slot, &holder("a", 1));
    s.claim(&a, &none()).await.unwrap();
    let rel = ReleaseSpec {
        job: j.clone(),
        slot_ms: slot,
        token: a.token.clone(),
        result: ReleaseResult::Succeeded,
    };
    s.release(&rel, &none()).await.unwrap();
    // A cutoff in the past keeps it; one in the future removes it.
    leases(s).prune(now() - 3_600_000, 100).await.unwrap();
    assert_eq!(s.history(&j, 5, None).await.unwrap().runs.len(), 1);
    let mut removed = 0;
    while let Ok(n) = leases(s).prune(now() + 60_000, 100).await {
        removed += n;
        if n < 100 {
            break;
        }
    }
    assert!(removed >= 1);
    assert!(s.history(&j, 5, None).await.unwrap().runs.is_empty());
}

/// Pruning goes by both the slot and the claim time: a run is old once its
/// slot and its claim are both before the cutoff (a lock, slot 0, by its
/// claim alone). A late claim of an old slot and a claim of a slot ahead
/// are kept until both are old.
pub async fn prune_goes_by_slot_and_claim_time(s: &dyn Store) {
    if !s.info().full_history {
        return;
    }
    let j = job("prune-by");
    let t = now();
    let late = spec(&j, t - 30_000, &holder("a", 1));
    let ahead = spec(&j, t + 120_000, &holder("a", 1));
    let lock = spec(&j, 0, &holder("a", 1));
    for c in [&late, &ahead, &lock] {
        assert_eq!(s.claim(c, &none()).await.unwrap().outcome, Outcome::Won);
        let rel = ReleaseSpec {
            job: j.clone(),
            slot_ms: c.slot_ms,
            token: c.token.clone(),
            result: ReleaseResult::Succeeded,
        };
        s.release(&rel, &none()).await.unwrap();
    }
    let slots = || async {
        let mut v: Vec<i64> = s
            .history(&j, 10, None)
            .await
            .unwrap()
            .runs
            .iter()
            .map(|r| r.slot_ms)
            .collect();
        v.sort();
        v
    };
    // Claimed after the cutoff: every run stays, the late one's old slot
    // and the lock included.
    let prune_all = |cutoff: i64| async move {
        while let Ok(n) = leases(s).prune(cutoff, 100).await {
            if n < 100 {
                break;
            }
        }
    };
    prune_all(t - 1_000).await;
    assert_eq!(slots().await, vec![0, late.slot_ms, ahead.slot_ms]);
    // Both before the cutoff: the late run and the lock go; the slot ahead
    // stays until its slot is old too.
    prune_all(t + 60_000).await;
    assert_eq!(slots().await, vec![ahead.slot_ms]);
}

/// Once backends whose memory of a claim lapses after `memory_ms` (the
/// brokers' `slot_ttl_ms` / `duplicate_window_ms`): a claim that asks for
/// more lateness than the memory covers, or comes too far ahead of its slot,
/// is refused instead of being decided by a memory that would lapse before
/// the slot's late window closes. `conformance!(…, memory_ms = N)` stamps it.
pub async fn refuses_what_its_memory_cannot_cover(s: &dyn Store, memory_ms: i64) {
    assert!(
        !s.info().leases,
        "a lease store keeps runs, it has no memory window"
    );
    let j = job("window");
    let now = now();
    let mut wide = spec(&j, now, &holder("a", 1));
    wide.max_late_ms = memory_ms;
    assert!(matches!(
        s.claim(&wide, &none()).await,
        Err(Error::InvalidArgument {
            field: "max_late_ms",
            ..
        })
    ));
    let mut ahead = spec(&j, now + memory_ms, &holder("a", 1));
    ahead.max_late_ms = 1_000;
    assert!(matches!(
        s.claim(&ahead, &none()).await,
        Err(Error::InvalidArgument {
            field: "slot_ms",
            ..
        })
    ));
    // Within the horizon it is fine.
    let mut near = spec(&j, now + memory_ms / 2, &holder("a", 1));
    near.max_late_ms = 1_000;
    assert_eq!(s.claim(&near, &none()).await.unwrap().outcome, Outcome::Won);
}

/// Once backends declare no lease capability (the sidecar then refuses
/// `Renew` with `no_leases`), and their claims still win once.
pub async fn no_leases(s: &dyn Store) {
    assert!(!s.info().leases);
    assert!(
        s.leases().is_none(),
        "a once backend has no lease capability"
    );
    let j = job("noleases");
    let a = spec(&j, now(), &holder("a", 1));
    assert_eq!(s.claim(&a, &none()).await.unwrap().outcome, Outcome::Won);
}

/// The lease capability of a lease store (its declared `info().leases`
/// must agree with it).
pub fn leases(s: &dyn Store) -> &dyn Leases {
    assert!(s.info().leases, "{} declares no leases", s.info().backend);
    s.leases().expect("a lease store has the lease capability")
}

/// 50 claimers at once on one slot, released together by a barrier:
/// exactly one `WON`; every other one is told `RUNNING` (a lease store) or
/// `LOST` (a once store), as declared, and never sees the token.
pub async fn fifty_claimers_one_slot(s: Arc<dyn Store>) {
    let j = job("fifty");
    let loser = if s.info().leases {
        Outcome::Running
    } else {
        Outcome::Lost
    };
    let base = now();
    for i in 0..3 {
        let start = Arc::new(tokio::sync::Barrier::new(50));
        let mut tasks = Vec::new();
        for c in 0..50 {
            let (s, j, start) = (s.clone(), j.clone(), start.clone());
            tasks.push(tokio::spawn(async move {
                let sp = spec(&j, base + i, &holder(&format!("n{c}"), 1));
                start.wait().await;
                s.claim(&sp, &DeadHolders::none()).await.unwrap()
            }));
        }
        let mut answers = Vec::new();
        for t in tasks {
            answers.push(t.await.unwrap());
        }
        let count = |o: Outcome| answers.iter().filter(|a| a.outcome == o).count();
        assert_eq!(count(Outcome::Won), 1, "{answers:?}");
        assert_eq!(count(loser), 49, "{answers:?}");
        assert!(
            answers
                .iter()
                .filter(|a| a.outcome == loser)
                .all(|a| a.token.is_none()),
            "a loser saw the token: {answers:?}"
        );
    }
}

/// Many concurrent claimers, in-process: exactly one WON per slot.
pub async fn contest(s: Arc<dyn Store>) {
    let j = job("contest");
    let base = now();
    let slots = 40i64;
    let claimers = 16;
    let mut tasks = Vec::new();
    for c in 0..claimers {
        let s = s.clone();
        let j = j.clone();
        tasks.push(tokio::spawn(async move {
            let mut won = Vec::new();
            for i in 0..slots {
                let sp = spec(&j, base + i, &holder(&format!("n{c}"), 1));
                let a = s.claim(&sp, &DeadHolders::none()).await.unwrap();
                match a.outcome {
                    Outcome::Won => won.push(base + i),
                    Outcome::Running | Outcome::Lost => {}
                    other => panic!("unexpected outcome {other:?}"),
                }
            }
            won
        }));
    }
    let mut wins: HashMap<i64, u32> = HashMap::new();
    for t in tasks {
        for slot in t.await.unwrap() {
            *wins.entry(slot).or_default() += 1;
        }
    }
    let double = wins.values().filter(|&&n| n > 1).count();
    let missing = (0..slots)
        .filter(|i| !wins.contains_key(&(base + i)))
        .count();
    assert_eq!(
        (double, missing),
        (0, 0),
        "double wins and slots without a winner"
    );
}
