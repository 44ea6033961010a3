"""The asyncio client against real sidecars."""

import asyncio
import os
import signal

import pytest

from anarchon import FencedError, InvalidArgumentError, LeaseLostError
from anarchon.aio import Client

from conftest import now_ms


def run(coro):
    return asyncio.run(coro)


def test_aio_claim_renew_release_history(addr_a, addr_b, job):
    async def go():
        async with Client(addr_a, timeout=10) as a, Client(addr_b, timeout=10) as b:
            slot = now_ms()
            c = await a.claim(job, slot, lease_ms=3000)
            assert c.won and c.attempt == 1
            assert (await b.claim(job, slot)).outcome == "RUNNING"
            r = await a.renew(c)
            assert r.attempt == 1 and r.valid_for_ms > 0
            await a.release(c, succeeded=True)
            with pytest.raises(FencedError):
                await a.renew(c)
            assert (await b.claim(job, slot)).outcome == "DONE"
            assert (await a.history(job)).runs[0].state == "SUCCEEDED"
            with pytest.raises(InvalidArgumentError):
                await a.claim("", 0)
    run(go())


def test_aio_hold_success_and_failure(addr_a, job):
    async def go():
        async with Client(addr_a, timeout=10) as a:
            async with a.hold(job, 1 + now_ms(), lease_ms=600) as claim:
                assert claim.won
                await asyncio.sleep(0.5)
            assert claim.renewals >= 1 and not claim.lost
            with pytest.raises(RuntimeError):
                async with a.hold(job, 2 + now_ms()) as claim2:
                    assert claim2.won
                    raise RuntimeError("boom")
            states = [r.state for r in (await a.history(job)).runs]
            assert states == ["FAILED", "SUCCEEDED"]
    run(go())


def test_aio_hold_lost_lease_cancels_the_block(addr_a, addr_b, job):
    pid = int(os.environ["ANARCHON_A_PID"])

    async def go():
        async with Client(addr_a, timeout=10) as a, Client(addr_b, timeout=10) as b:
            with pytest.raises(LeaseLostError) as e:
                async with a.hold(job, 0, lease_ms=600) as claim:
                    assert claim.won
                    while claim.renewals == 0:
                        await asyncio.sleep(0.01)
                    os.kill(pid, signal.SIGSTOP)
                    try:
                        await asyncio.sleep(1.0)
                        taken = await b.claim(job, 0)
                    finally:
                        os.kill(pid, signal.SIGCONT)
                    assert taken.won and taken.attempt == 2
                    await asyncio.sleep(30)  # cancelled by the loss long before this
                    pytest.fail("the block was not cancelled")
            assert e.value.reason == "fenced" and claim.lost
    run(go())


def test_aio_peers_and_watch(addr_a, addr_b):
    async def go():
        async with Client(addr_a, timeout=10) as a, Client(addr_b, timeout=10) as b:
            other = (await b.peers()).self.node
            assert any(p.node == other for p in (await a.peers()).peers)
            async for ev in a.watch_peers():
                assert ev.kind == "SNAPSHOT"
                if ev.peer.node == other:
                    break
    run(go())
