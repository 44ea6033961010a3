"""The blocking client."""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Callable, Iterator, Optional, Sequence, Tuple, Union

import grpc

from . import _requests as rq
from .errors import AnarchonError, FencedError, LeaseLostError, UnavailableError, from_rpc_error
from .models import Claim, HeldClaim, History, Peer, PeerEvent, Peers, Renewal, Run, monotonic
from .v1 import claims_pb2, claims_pb2_grpc, mesh_pb2, mesh_pb2_grpc

log = logging.getLogger("anarchon")

DEFAULT_TARGET = "127.0.0.1:50051"


def _metadata(token: Optional[str]) -> Tuple[Tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),) if token else ()


def _channel_options(target: str, options: Sequence[Tuple[str, object]]) -> list:
    """The channel's options. For a ``unix:PATH`` target (the sidecar's
    ``--listen-unix`` socket), gRPC's C core would send the socket's path as
    the ``:authority``, which the sidecar's HTTP/2 server refuses as
    malformed; such a channel says ``localhost`` unless told otherwise."""
    options = list(options)
    if target.startswith("unix:") and not any(k == "grpc.default_authority" for k, _ in options):
        options.append(("grpc.default_authority", "localhost"))
    return options


class Client:
    """A connection to one anarchon sidecar.

    ``target`` is ``host:port``, or ``unix:PATH`` for the sidecar's
    ``--listen-unix`` socket. ``token`` is the bearer token the sidecar requires (``--auth-token-file``),
    if any. ``credentials`` (``grpc.ssl_channel_credentials(...)``) switches to
    TLS. ``timeout`` is the default deadline in seconds of unary calls (None:
    no deadline; a ``claim`` with ``wait_ms`` gets ``wait_ms`` added).
    """

    def __init__(self, target: str = DEFAULT_TARGET, token: Optional[str] = None, *,
                 credentials: Optional[grpc.ChannelCredentials] = None,
                 options: Sequence[Tuple[str, object]] = (), timeout: Optional[float] = None) -> None:
        self.target = target
        options = _channel_options(target, options)
        if credentials is not None:
            self._channel = grpc.secure_channel(target, credentials, options=list(options))
        else:
            self._channel = grpc.insecure_channel(target, options=list(options))
        self._claims = claims_pb2_grpc.ClaimsStub(self._channel)
        self._mesh = mesh_pb2_grpc.MeshStub(self._channel)
        self._md = _metadata(token)
        self._timeout = timeout

    # -- plumbing -----------------------------------------------------------
    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _unary(self, method, request, timeout):
        try:
            return method(request, timeout=timeout, metadata=self._md)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

    def _deadline(self, timeout, wait_ms: int = 0):
        t = self._timeout if timeout is None else timeout
        return None if t is None else t + wait_ms / 1000.0

    # -- claims ---------------------------------------------------------------
    def claim(self, job: str, slot_ms: int = 0, *, token: Optional[str] = None, lease_ms: int = 0,
              max_late_ms: int = 0, overlap: Union[None, str, int] = None, max_attempts: int = 0,
              wait_ms: int = 0, timeout: Optional[float] = None) -> Claim:
        """Asks who owns ``(job, slot_ms)``. Contention is an outcome, never an error.

        ``token``: resend a claim whose answer was lost. ``overlap``: ``"allow"``
        or ``"skip"``. ``wait_ms > 0`` blocks until the run can be won or the
        wait ends. Zero values take the sidecar's defaults.
        """
        req = rq.claim_request(job, slot_ms, token=token, lease_ms=lease_ms, max_late_ms=max_late_ms,
                               overlap=overlap, max_attempts=max_attempts, wait_ms=wait_ms)
        sent = monotonic()
        pb = self._unary(self._claims.Claim, req, self._deadline(timeout, wait_ms))
        return Claim(job, req.slot_ms, pb, sent)

    def renew(self, claim_or_job: Union[Claim, str], slot_ms: Optional[int] = None,
              token: Optional[str] = None, *, lease_ms: int = 0,
              timeout: Optional[float] = None) -> Renewal:
        """Extends the lease: ``renew(claim)`` or ``renew(job, slot_ms, token)``.

        Raises :class:`FencedError` when the token no longer holds the run.
        A :class:`Claim` passed in has its lease fields updated.
        """
        job, slot, tok = rq.run_ref(claim_or_job, slot_ms, token, "renew")
        sent = monotonic()
        pb = self._unary(self._claims.Renew,
                         claims_pb2.RenewRequest(job=job, slot_ms=slot, token=tok, lease_ms=int(lease_ms)),
                         self._deadline(timeout))
        r = Renewal._from(pb, sent)
        if isinstance(claim_or_job, Claim):
            claim_or_job.lease_until_ms = r.lease_until_ms
            claim_or_job.valid_for_ms = r.valid_for_ms
            claim_or_job.deadline = r.deadline
        return r

    def release(self, claim_or_job: Union[Claim, str], slot_ms: Optional[int] = None,
                token: Optional[str] = None, *, succeeded: bool = True,
                timeout: Optional[float] = None) -> None:
        """Finishes a held run: ``release(claim)`` or ``release(job, slot_ms, token)``.

        Idempotent for the same token; a token that does not hold the run
        raises :class:`FencedError`.
        """
        job, slot, tok = rq.run_ref(claim_or_job, slot_ms, token, "release")
        self._unary(self._claims.Release,
                    claims_pb2.ReleaseRequest(job=job, slot_ms=slot, token=tok,
                                              result=rq.release_result(succeeded)),
                    self._deadline(timeout))
        if isinstance(claim_or_job, HeldClaim):
            claim_or_job.released = True

    def history(self, job: str, *, limit: int = 0, before_slot_ms: Optional[int] = None,
                timeout: Optional[float] = None) -> History:
        """Runs of ``job``, newest slot first."""
        req = claims_pb2.HistoryRequest(job=job, limit=int(limit))
        if before_slot_ms is not None:
            req.before_slot_ms = int(before_slot_ms)
        pb = self._unary(self._claims.History, req, self._deadline(timeout))
        return History([Run._from(r) for r in pb.runs], pb.backend, pb.retention, pb.complete, pb.note)

    @contextlib.contextmanager
    def hold(self, job: str, slot_ms: int = 0, *, token: Optional[str] = None, lease_ms: int = 0,
             max_late_ms: int = 0, overlap: Union[None, str, int] = None, max_attempts: int = 0,
             wait_ms: int = 0, on_lost: Optional[Callable[[HeldClaim], None]] = None) -> Iterator[HeldClaim]:
        """Claims ``(job, slot_ms)`` on a Hold stream and keeps the lease while the block runs.

        Yields a :class:`HeldClaim`. If it was not won (``claim.won`` is
        false) the block runs with nothing held and nothing is released.
        Otherwise the sidecar renews the lease every lease/3 and:

        * the block ends normally -> the run is released SUCCEEDED;
        * the block raises -> the run is released FAILED and the exception
          propagates;
        * the lease is lost (LOST_LEASE, or the stream to the sidecar broke)
          -> ``claim.lost`` becomes true, ``claim.lost_event`` is set,
          ``on_lost(claim)`` is called from the stream thread, the next
          ``claim.check()`` inside the block raises :class:`LeaseLostError`,
          and leaving the block raises it too (even if the block finished):
          the work must not be published. Nothing is released.

        Python cannot safely interrupt a running block from another thread,
        so long work should call ``claim.check()`` between steps (or watch
        ``claim.lost_event``). The asyncio client cancels the block instead.
        """
        req = rq.claim_request(job, slot_ms, token=token, lease_ms=lease_ms, max_late_ms=max_late_ms,
                               overlap=overlap, max_attempts=max_attempts, wait_ms=wait_ms)
        sent = monotonic()
        call = self._claims.Hold(req, metadata=self._md)
        try:
            first = next(call)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None
        except StopIteration:
            raise UnavailableError("the Hold stream ended before its first event") from None
        if first.kind != claims_pb2.HOLD_EVENT_KIND_CLAIMED:
            call.cancel()
            raise AnarchonError(f"unexpected first Hold event {first.kind}")
        held = HeldClaim(job, req.slot_ms, first.claim, sent)
        if not held.won:
            call.cancel()
            yield held
            return

        closing = threading.Event()
        reader = threading.Thread(target=_follow, args=(call, held, closing, on_lost),
                                  name=f"anarchon-hold-{job}", daemon=True)
        reader.start()
        try:
            try:
                yield held
            except BaseException:
                if not held.lost and not held.released:
                    try:
                        self.release(held, succeeded=False)
                    except Exception as rel:  # the block's exception matters more
                        log.warning("could not release %s/%s as FAILED: %s", job, held.slot_ms, rel)
                raise
            if held.lost:
                raise LeaseLostError(f"lease lost ({held.lost_reason})", reason=held.lost_reason)
            if not held.released:
                try:
                    self.release(held, succeeded=True)
                except FencedError as e:
                    held._lose("fenced")
                    raise LeaseLostError("lease lost before release (fenced)", reason="fenced",
                                         code=e.code, details=e.details) from e
        finally:
            closing.set()
            call.cancel()
            reader.join(timeout=5)

    # -- mesh -----------------------------------------------------------------
    def peers(self, *, timeout: Optional[float] = None) -> Peers:
        """A snapshot: this sidecar's own runtime and every peer it knows."""
        pb = self._unary(self._mesh.ListPeers, mesh_pb2.ListPeersRequest(), self._deadline(timeout))
        return Peers(Peer._from(pb.self), [Peer._from(p) for p in pb.peers])

    def watch_peers(self, *, include_expired: bool = False) -> "PeerWatch":
        """An iterator of :class:`PeerEvent`: one SNAPSHOT per known runtime, then
        one event per change. Stop it with ``cancel()`` or use it as a context
        manager."""
        call = self._mesh.WatchPeers(mesh_pb2.WatchPeersRequest(include_expired=include_expired),
                                     metadata=self._md)
        return PeerWatch(call)


def _follow(call, held: HeldClaim, closing: threading.Event,
            on_lost: Optional[Callable[[HeldClaim], None]]) -> None:
    """Reads the Hold stream after CLAIMED (runs on its own thread)."""
    try:
        for ev in call:
            if ev.kind == claims_pb2.HOLD_EVENT_KIND_RENEWED:
                held._renewed(ev, monotonic())
            elif ev.kind == claims_pb2.HOLD_EVENT_KIND_LOST_LEASE:
                _lose(held, ev.reason or "lost", on_lost)
                return
            elif ev.kind == claims_pb2.HOLD_EVENT_KIND_RELEASED:
                held.released = True
                return
        if not (closing.is_set() or held.released):
            _lose(held, "stream_ended", on_lost)
    except grpc.RpcError as e:
        if not (closing.is_set() or held.released):
            log.warning("hold stream for %s/%s broke: %s", held.job, held.slot_ms, e)
            _lose(held, "stream_broken", on_lost)


def _lose(held: HeldClaim, reason: str, on_lost) -> None:
    held._lose(reason)
    if on_lost is not None:
        try:
            on_lost(held)
        except Exception:  # pragma: no cover - the callback's own problem
            log.exception("on_lost callback failed")


class PeerWatch:
    """Iterator over peer events; ``cancel()`` ends it (iteration then stops)."""

    def __init__(self, call) -> None:
        self._call = call
        self._cancelled = False

    def __iter__(self) -> "PeerWatch":
        return self

    def __next__(self) -> PeerEvent:
        try:
            return PeerEvent._from(next(self._call))
        except grpc.RpcError as e:
            if self._cancelled and e.code() == grpc.StatusCode.CANCELLED:
                raise StopIteration from None
            raise from_rpc_error(e) from None

    def cancel(self) -> None:
        self._cancelled = True
        self._call.cancel()

    def __enter__(self) -> "PeerWatch":
        return self

    def __exit__(self, *exc) -> None:
        self.cancel()
