"""Every call of the blocking client against real sidecars."""

import os
import signal
import threading
import time

import pytest

import anarchon
from anarchon import (FencedError, InvalidArgumentError, LeaseLostError, NotFoundError,
                      UnauthenticatedError)

from conftest import now_ms


def test_claim_won_has_every_field(a, job):
    slot = now_ms()
    c = a.claim(job, slot)
    assert c.outcome == "WON" and c.won and bool(c)
    assert len(c.token) == 32 and int(c.token, 16) >= 0
    assert c.attempt == 1
    assert c.fencing >= 1
    assert c.lease_until_ms > c.now_ms > 0
    assert 0 < c.valid_for_ms <= 30000
    assert c.holder is not None and c.holder.node and c.holder.instance >= 1
    assert c.backend == "sqlite"
    assert c.job == job and c.slot_ms == slot
    assert not c.expired


def test_contention_is_an_outcome_not_an_error(a, b, job):
    first = a.claim(job, 0)
    second = b.claim(job, 0)
    assert first.won
    assert second.outcome == "RUNNING" and not second.won
    assert second.token == ""  # never another holder's token
    assert second.holder == first.holder


def test_resend_with_same_token_is_won_again(a, job):
    first = a.claim(job, 0)
    again = a.claim(job, 0, token=first.token)
    assert again.won and again.token == first.token and again.attempt == first.attempt


def test_late_slot(a, job):
    c = a.claim(job, 1000, max_late_ms=1000)
    assert c.outcome == "LATE" and c.reason == "too_late" and not c.won


def test_overlap_skip(a, job):
    assert a.claim(job, now_ms()).won
    c = a.claim(job, now_ms() + 1, overlap="skip")
    assert c.outcome == "OVERLAP"


def test_invalid_job_names_the_field(a):
    with pytest.raises(InvalidArgumentError) as e:
        a.claim("bad job name!", 0)
    assert e.value.reason == "job"
    assert e.value.code.name == "INVALID_ARGUMENT"


def test_renew_extends_the_lease(a, job):
    c = a.claim(job, 0, lease_ms=2000)
    before = c.lease_until_ms
    time.sleep(0.05)
    r = a.renew(c, lease_ms=5000)
    assert r.attempt == 1 and r.fencing == c.fencing
    assert r.lease_until_ms > before and 4000 < r.valid_for_ms <= 5000
    assert c.lease_until_ms == r.lease_until_ms  # the claim follows
    r2 = a.renew(job, 0, c.token)
    assert r2.lease_until_ms >= r.lease_until_ms - 5000


def test_renew_after_release_is_fenced(a, job):
    c = a.claim(job, now_ms())
    a.release(c)
    with pytest.raises(FencedError) as e:
        a.renew(c)
    assert e.value.reason == "fenced"
    assert e.value.code.name == "FAILED_PRECONDITION"


def test_renew_unknown_run_is_not_found(a, job):
    with pytest.raises(NotFoundError):
        a.renew(job, 12345, "0" * 32)


def test_release_succeeded_then_done(a, b, job):
    slot = now_ms()
    c = a.claim(job, slot)
    a.release(c, succeeded=True)
    a.release(job, slot, c.token, succeeded=True)  # idempotent
    after = b.claim(job, slot)
    assert after.outcome == "DONE" and after.reason == "succeeded"
    runs = a.history(job).runs
    assert runs[0].state == "SUCCEEDED" and runs[0].slot_ms == slot


def test_release_failed(a, job):
    slot = now_ms()
    c = a.claim(job, slot)
    a.release(c, succeeded=False)
    assert a.history(job).runs[0].state == "FAILED"


def test_release_of_a_lock_frees_it(a, b, job):
    c = a.claim(job, 0)
    a.release(c)
    again = b.claim(job, 0)
    # A new run of the lock (attempt 1), not a takeover; fencing still rises.
    assert again.won and again.attempt == 1 and again.fencing > c.fencing


def test_release_with_a_wrong_token_is_fenced(a, job):
    a.claim(job, 0)
    with pytest.raises(FencedError):
        a.release(job, 0, "f" * 32)


def test_history_pages(a, job):
    base = now_ms()
    for i in range(3):
        a.release(a.claim(job, base + i))
    h = a.history(job, limit=2)
    assert [r.slot_ms for r in h.runs] == [base + 2, base + 1]
    assert h.backend == "sqlite" and h.complete
    older = a.history(job, before_slot_ms=base + 1)
    assert [r.slot_ms for r in older.runs] == [base]


def test_claim_wait_ms_blocks_until_released(a, b, job):
    c = a.claim(job, 0)
    threading.Timer(0.3, lambda: a.release(c)).start()
    t0 = time.monotonic()
    w = b.claim(job, 0, wait_ms=5000)
    assert w.won and 0.2 < time.monotonic() - t0 < 4


def test_hold_success_renews_and_releases_succeeded(a, b, job):
    slot = now_ms()
    with a.hold(job, slot, lease_ms=600) as claim:
        assert claim.won and claim.attempt == 1
        assert b.claim(job, slot).outcome == "RUNNING"
        assert claim.wait_renewal(timeout=3)
        assert claim.wait_renewal(timeout=3)
        time.sleep(0.7)  # longer than the lease: only renewals keep it
        claim.check()
        assert b.claim(job, slot).outcome == "RUNNING"
    assert claim.renewals >= 2 and not claim.lost
    assert a.history(job).runs[0].state == "SUCCEEDED"
    assert b.claim(job, slot).outcome == "DONE"


def test_hold_failure_releases_failed(a, job):
    slot = now_ms()
    with pytest.raises(ZeroDivisionError):
        with a.hold(job, slot) as claim:
            assert claim.won
            1 / 0
    assert a.history(job).runs[0].state == "FAILED"


def test_hold_not_won_runs_the_block_with_nothing_held(a, b, job):
    held = a.claim(job, 0)
    with b.hold(job, 0) as claim:
        assert not claim.won and claim.outcome == "RUNNING"
    assert a.renew(held).attempt == 1  # untouched


def test_hold_released_elsewhere_is_not_a_loss(a, job):
    with a.hold(job, 0, lease_ms=600) as claim:
        a.release(job, 0, claim.token)  # another client with the token
        time.sleep(0.5)
    assert not claim.lost


def test_hold_closed_without_release_ends_the_lease(addr_a, b, job):
    c = anarchon.Client(addr_a)
    ctx = c.hold(job, 0, lease_ms=30000)
    claim = ctx.__enter__()
    assert claim.won
    c.close()  # the worker "dies": the stream breaks without a Release
    deadline = time.monotonic() + 5
    while True:
        nxt = b.claim(job, 0)
        if nxt.won or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert nxt.won and nxt.attempt == 2


def pause(pid, seconds):
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        os.kill(pid, signal.SIGCONT)


def test_hold_lost_lease(a, b, job):
    """Pause sidecar A (SIGSTOP) so its renewals stop; the 600 ms lease lapses
    and B takes the run over (attempt 2); once A resumes, its next renewal is
    fenced and LOST_LEASE reaches the client."""
    pid = int(os.environ["ANARCHON_A_PID"])
    lost_calls = []
    with pytest.raises(LeaseLostError) as e:
        with a.hold(job, 0, lease_ms=600, on_lost=lost_calls.append) as claim:
            assert claim.won
            assert claim.wait_renewal(timeout=3)  # pause right after a write
            os.kill(pid, signal.SIGSTOP)
            try:
                time.sleep(1.0)
                assert claim.expired  # the local deadline passed without renewals
                taken = b.claim(job, 0)
            finally:
                os.kill(pid, signal.SIGCONT)
            assert taken.won and taken.attempt == 2
            assert claim.lost_event.wait(timeout=5)
            assert claim.lost and claim.lost_reason == "fenced"
            claim.check()  # raises inside the block
            pytest.fail("check() did not raise")
    assert e.value.reason == "fenced"
    assert lost_calls == [claim]
    runs = b.history(job).runs
    assert runs[0].attempt == 2 and runs[0].state == "RUNNING"


def test_hold_lost_lease_raises_on_exit_too(a, b, job):
    pid = int(os.environ["ANARCHON_A_PID"])
    with pytest.raises(LeaseLostError):
        with a.hold(job, 0, lease_ms=600) as claim:
            assert claim.wait_renewal(timeout=3)
            os.kill(pid, signal.SIGSTOP)
            try:
                time.sleep(1.0)
                assert b.claim(job, 0).won
            finally:
                os.kill(pid, signal.SIGCONT)
            claim.lost_event.wait(timeout=5)
            # the block ends without checking: leaving it raises


def test_peers_lists_self_and_the_other_sidecar(a, b):
    pa, pb = a.peers(), b.peers()
    assert pa.self.node and pa.self.state == "ALIVE"
    assert pa.self.node != pb.self.node
    other = [p for p in pa.peers if p.node == pb.self.node]
    assert other and other[0].state == "ALIVE" and other[0].instance == pb.self.instance


def test_watch_peers_snapshot_then_cancel(a, b):
    other = b.peers().self.node
    seen = []
    with a.watch_peers() as watch:
        for ev in watch:
            seen.append(ev)
            if ev.peer.node == other:
                break
    assert all(ev.kind == "SNAPSHOT" for ev in seen)
    assert seen[-1].peer.state == "ALIVE"
    assert list(watch) == []  # cancelled: iteration stops
    with a.watch_peers(include_expired=True) as watch:
        assert next(watch).kind == "SNAPSHOT"


# C requires a token, over TCP and over its Unix socket (--listen-unix).
@pytest.mark.parametrize("name", ["ANARCHON_C", "ANARCHON_C_UNIX"])
def test_bearer_token(name):
    addr, token = os.environ[name], os.environ["ANARCHON_C_TOKEN"]
    with anarchon.Client(addr, token=token, timeout=10) as c:
        assert c.claim(f"py-auth-{name}", now_ms()).won
        assert c.peers().self.node
    with anarchon.Client(addr, timeout=10) as c:
        with pytest.raises(UnauthenticatedError):
            c.claim(f"py-auth-{name}", 0)
