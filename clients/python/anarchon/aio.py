"""The asyncio client (``grpc.aio``). Same calls as :class:`anarchon.Client`, awaited.

The one difference is ``hold``: when the lease is lost, the task running the
``async with`` block is cancelled, so the loss really does raise inside the
block (at its next ``await``); leaving the block then raises
:class:`~anarchon.errors.LeaseLostError` instead of ``CancelledError``.
"""

from __future__ import annotations

import asyncio
import logging
from typing import AsyncIterator, Optional, Sequence, Tuple, Union

import grpc
import grpc.aio

from . import _requests as rq
from .client import DEFAULT_TARGET, _channel_options, _metadata
from .errors import AnarchonError, FencedError, LeaseLostError, UnavailableError, from_rpc_error
from .models import Claim, HeldClaim, History, Peer, PeerEvent, Peers, Renewal, Run, monotonic
from .v1 import claims_pb2, claims_pb2_grpc, mesh_pb2, mesh_pb2_grpc

log = logging.getLogger("anarchon")


class Client:
    """An asyncio connection to one sidecar; see :class:`anarchon.Client`."""

    def __init__(self, target: str = DEFAULT_TARGET, token: Optional[str] = None, *,
                 credentials: Optional[grpc.ChannelCredentials] = None,
                 options: Sequence[Tuple[str, object]] = (), timeout: Optional[float] = None) -> None:
        self.target = target
        options = _channel_options(target, options)
        if credentials is not None:
            self._channel = grpc.aio.secure_channel(target, credentials, options=list(options))
        else:
            self._channel = grpc.aio.insecure_channel(target, options=list(options))
        self._claims = claims_pb2_grpc.ClaimsStub(self._channel)
        self._mesh = mesh_pb2_grpc.MeshStub(self._channel)
        self._md = _metadata(token)
        self._timeout = timeout

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def _unary(self, method, request, timeout):
        try:
            return await method(request, timeout=timeout, metadata=self._md)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

    def _deadline(self, timeout, wait_ms: int = 0):
        t = self._timeout if timeout is None else timeout
        return None if t is None else t + wait_ms / 1000.0

    async def claim(self, job: str, slot_ms: int = 0, *, token: Optional[str] = None, lease_ms: int = 0,
                    max_late_ms: int = 0, overlap: Union[None, str, int] = None, max_attempts: int = 0,
                    wait_ms: int = 0, timeout: Optional[float] = None) -> Claim:
        req = rq.claim_request(job, slot_ms, token=token, lease_ms=lease_ms, max_late_ms=max_late_ms,
                               overlap=overlap, max_attempts=max_attempts, wait_ms=wait_ms)
        sent = monotonic()
        pb = await self._unary(self._claims.Claim, req, self._deadline(timeout, wait_ms))
        return Claim(job, req.slot_ms, pb, sent)

    async def renew(self, claim_or_job: Union[Claim, str], slot_ms: Optional[int] = None,
                    token: Optional[str] = None, *, lease_ms: int = 0,
                    timeout: Optional[float] = None) -> Renewal:
        job, slot, tok = rq.run_ref(claim_or_job, slot_ms, token, "renew")
        sent = monotonic()
        pb = await self._unary(self._claims.Renew,
                               claims_pb2.RenewRequest(job=job, slot_ms=slot, token=tok, lease_ms=int(lease_ms)),
                               self._deadline(timeout))
        r = Renewal._from(pb, sent)
        if isinstance(claim_or_job, Claim):
            claim_or_job.lease_until_ms = r.lease_until_ms
            claim_or_job.valid_for_ms = r.valid_for_ms
            claim_or_job.deadline = r.deadline
        return r

    async def release(self, claim_or_job: Union[Claim, str], slot_ms: Optional[int] = None,
                      token: Optional[str] = None, *, succeeded: bool = True,
                      timeout: Optional[float] = None) -> None:
        job, slot, tok = rq.run_ref(claim_or_job, slot_ms, token, "release")
        await self._unary(self._claims.Release,
                          claims_pb2.ReleaseRequest(job=job, slot_ms=slot, token=tok,
                                                    result=rq.release_result(succeeded)),
                          self._deadline(timeout))
        if isinstance(claim_or_job, HeldClaim):
            claim_or_job.released = True

    async def history(self, job: str, *, limit: int = 0, before_slot_ms: Optional[int] = None,
                      timeout: Optional[float] = None) -> History:
        req = claims_pb2.HistoryRequest(job=job, limit=int(limit))
        if before_slot_ms is not None:
            req.before_slot_ms = int(before_slot_ms)
        pb = await self._unary(self._claims.History, req, self._deadline(timeout))
        return History([Run._from(r) for r in pb.runs], pb.backend, pb.retention, pb.complete, pb.note)

    def hold(self, job: str, slot_ms: int = 0, *, token: Optional[str] = None, lease_ms: int = 0,
             max_late_ms: int = 0, overlap: Union[None, str, int] = None, max_attempts: int = 0,
             wait_ms: int = 0, cancel_on_lost: bool = True) -> "AsyncHold":
        """``async with client.hold(job, slot) as claim:`` — see :class:`AsyncHold`."""
        req = rq.claim_request(job, slot_ms, token=token, lease_ms=lease_ms, max_late_ms=max_late_ms,
                               overlap=overlap, max_attempts=max_attempts, wait_ms=wait_ms)
        return AsyncHold(self, req, cancel_on_lost)

    async def peers(self, *, timeout: Optional[float] = None) -> Peers:
        pb = await self._unary(self._mesh.ListPeers, mesh_pb2.ListPeersRequest(), self._deadline(timeout))
        return Peers(Peer._from(pb.self), [Peer._from(p) for p in pb.peers])

    async def watch_peers(self, *, include_expired: bool = False) -> AsyncIterator[PeerEvent]:
        """Async iterator of :class:`PeerEvent`; break out of the loop to stop it."""
        call = self._mesh.WatchPeers(mesh_pb2.WatchPeersRequest(include_expired=include_expired),
                                     metadata=self._md)
        try:
            async for ev in call:
                yield PeerEvent._from(ev)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        finally:
            call.cancel()


class AsyncHold:
    """The async Hold context: releases SUCCEEDED on normal exit, FAILED on an
    exception; on a lost lease cancels the block's task (``cancel_on_lost``)
    and raises :class:`LeaseLostError` from the block. Yields a
    :class:`HeldClaim` (check ``claim.won``: a claim that was not won runs the
    block with nothing held)."""

    def __init__(self, client: Client, req, cancel_on_lost: bool) -> None:
        self._client = client
        self._req = req
        self._cancel_on_lost = cancel_on_lost
        self._call = None
        self._reader: Optional[asyncio.Task] = None
        self._task: Optional[asyncio.Task] = None
        self._closing = False
        self._cancelled_by_us = False
        self.claim: Optional[HeldClaim] = None

    async def __aenter__(self) -> HeldClaim:
        c = self._client
        sent = monotonic()
        self._call = c._claims.Hold(self._req, metadata=c._md)
        try:
            first = await self._call.read()
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        if first is grpc.aio.EOF:
            raise UnavailableError("the Hold stream ended before its first event")
        if first.kind != claims_pb2.HOLD_EVENT_KIND_CLAIMED:
            self._call.cancel()
            raise AnarchonError(f"unexpected first Hold event {first.kind}")
        held = HeldClaim(self._req.job, self._req.slot_ms, first.claim, sent)
        self.claim = held
        if not held.won:
            self._call.cancel()
            return held
        self._task = asyncio.current_task()
        self._reader = asyncio.ensure_future(self._follow(held))
        return held

    async def _follow(self, held: HeldClaim) -> None:
        reason = None
        try:
            while True:
                ev = await self._call.read()
                if ev is grpc.aio.EOF:
                    reason = "stream_ended"
                    break
                if ev.kind == claims_pb2.HOLD_EVENT_KIND_RENEWED:
                    held._renewed(ev, monotonic())
                elif ev.kind == claims_pb2.HOLD_EVENT_KIND_LOST_LEASE:
                    reason = ev.reason or "lost"
                    break
                elif ev.kind == claims_pb2.HOLD_EVENT_KIND_RELEASED:
                    held.released = True
                    return
        except (grpc.RpcError, asyncio.CancelledError):
            reason = "stream_broken"
        if self._closing or held.released:
            return
        held._lose(reason)
        if self._cancel_on_lost and self._task is not None and not self._task.done():
            self._cancelled_by_us = True
            self._task.cancel()

    async def __aexit__(self, exc_type, exc, tb) -> bool:
        held = self.claim
        if held is None or not held.won:
            return False
        try:
            if self._cancelled_by_us and held.lost:
                # Our own cancellation: turn it into LeaseLostError.
                task = asyncio.current_task()
                if task is not None and hasattr(task, "uncancel"):
                    task.uncancel()
                if exc_type is None or issubclass(exc_type, asyncio.CancelledError):
                    raise LeaseLostError(f"lease lost ({held.lost_reason})", reason=held.lost_reason)
                return False
            if exc_type is not None:
                if not held.lost and not held.released:
                    try:
                        await self._client.release(held, succeeded=False)
                    except Exception as rel:
                        log.warning("could not release %s/%s as FAILED: %s", held.job, held.slot_ms, rel)
                return False
            if held.lost:
                raise LeaseLostError(f"lease lost ({held.lost_reason})", reason=held.lost_reason)
            if not held.released:
                try:
                    await self._client.release(held, succeeded=True)
                except FencedError as e:
                    held._lose("fenced")
                    raise LeaseLostError("lease lost before release (fenced)", reason="fenced") from e
            return False
        finally:
            self._closing = True
            self._call.cancel()
            if self._reader is not None:
                self._reader.cancel()
                try:
                    await self._reader
                except (asyncio.CancelledError, Exception):
                    pass
