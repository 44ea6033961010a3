"""Plain Python values returned by the client (no protobuf objects leak out)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from .v1 import claims_pb2, mesh_pb2


def _enum_name(enum, value: int, prefix: str) -> str:
    try:
        name = enum.Name(value)
    except ValueError:
        return str(value)
    return name[len(prefix):] if name.startswith(prefix) else name


@dataclass(frozen=True)
class Holder:
    """The runtime that holds a run: a stable node id and the process generation."""

    node: str
    instance: int


def _holder(pb) -> Optional[Holder]:
    return Holder(pb.node, pb.instance) if pb.node else None


class Claim:
    """The answer to a claim.

    ``outcome`` is one of ``"WON"``, ``"LOST"``, ``"RUNNING"``, ``"DONE"``,
    ``"LATE"``, ``"OVERLAP"``. Only a ``WON`` claim has a ``token``.
    ``deadline`` is a safe local deadline (``time.monotonic()`` scale): the
    moment the request was sent plus ``valid_for_ms``.
    """

    __slots__ = ("job", "slot_ms", "outcome", "token", "attempt", "fencing",
                 "lease_until_ms", "valid_for_ms", "holder", "backend", "reason",
                 "now_ms", "deadline")

    def __init__(self, job: str, slot_ms: int, pb: "claims_pb2.ClaimResponse", sent_at: float) -> None:
        self.job = job
        self.slot_ms = slot_ms
        self.outcome: str = _enum_name(claims_pb2.Outcome, pb.outcome, "OUTCOME_")
        self.token: str = pb.token
        self.attempt: int = pb.attempt
        self.fencing: int = pb.fencing
        self.lease_until_ms: int = pb.lease_until_ms
        self.valid_for_ms: int = pb.valid_for_ms
        self.holder: Optional[Holder] = _holder(pb.holder)
        self.backend: str = pb.backend
        self.reason: str = pb.reason
        self.now_ms: int = pb.now_ms
        self.deadline: float = sent_at + pb.valid_for_ms / 1000.0

    @property
    def won(self) -> bool:
        return self.outcome == "WON"

    def __bool__(self) -> bool:  # ``if client.claim(...):`` reads naturally
        return self.won

    @property
    def expired(self) -> bool:
        """True once the safe local deadline has passed (the lease may be gone)."""
        return time.monotonic() > self.deadline

    def __repr__(self) -> str:
        extra = f" reason={self.reason}" if self.reason else ""
        return (f"Claim({self.outcome} job={self.job} slot_ms={self.slot_ms} "
                f"attempt={self.attempt} fencing={self.fencing} "
                f"valid_for_ms={self.valid_for_ms}{extra})")


class HeldClaim(Claim):
    """The claim yielded by ``Client.hold``; it follows the Hold stream.

    ``lease_until_ms``, ``valid_for_ms`` and ``deadline`` move forward at every
    renewal (``renewals`` counts them). When the lease is lost, ``lost``
    becomes true, ``lost_reason`` says why and ``lost_event`` is set;
    :meth:`check` then raises :class:`~anarchon.errors.LeaseLostError`.
    """

    __slots__ = ("renewals", "lost_reason", "lost_event", "released", "_cond", "_sent_at")

    def __init__(self, job: str, slot_ms: int, pb, sent_at: float) -> None:
        super().__init__(job, slot_ms, pb, sent_at)
        self._sent_at = sent_at
        self.renewals = 0
        self.lost_reason: Optional[str] = None
        self.lost_event = threading.Event()
        self.released = False
        self._cond = threading.Condition()

    @property
    def lost(self) -> bool:
        return self.lost_event.is_set()

    def check(self) -> None:
        """Raises :class:`LeaseLostError` if the lease was lost, or if the safe
        local deadline passed without a renewal (reason ``"expired"``: the
        sidecar went quiet, so the run may already be someone else's).
        Call it between steps of long work."""
        from .errors import LeaseLostError
        if self.lost:
            raise LeaseLostError(f"lease lost ({self.lost_reason})", reason=self.lost_reason)
        if self.expired and not self.released:
            raise LeaseLostError("lease deadline passed without a renewal", reason="expired")

    def wait_renewal(self, timeout: Optional[float] = None) -> bool:
        """Blocks until the next renewal (or loss); True if a renewal came."""
        with self._cond:
            seen = self.renewals
            self._cond.wait_for(lambda: self.renewals > seen or self.lost, timeout)
            return self.renewals > seen

    # Called from the stream reader.
    def _renewed(self, ev, received_at: float) -> None:
        with self._cond:
            self.lease_until_ms = ev.lease_until_ms
            self.valid_for_ms = ev.valid_for_ms
            if ev.hold_valid_for_ms > 0:
                # Counted from the send of the Hold request: safe even for an
                # event that sat in a buffer while this process was paused.
                self.deadline = self._sent_at + ev.hold_valid_for_ms / 1000.0
            else:
                self.deadline = received_at + ev.valid_for_ms / 1000.0
            self.renewals += 1
            self._cond.notify_all()

    def _lose(self, reason: str) -> None:
        with self._cond:
            if not self.lost:
                self.lost_reason = reason
                self.lost_event.set()
            self._cond.notify_all()


@dataclass(frozen=True)
class Renewal:
    """The answer to a renew."""

    lease_until_ms: int
    attempt: int
    valid_for_ms: int
    fencing: int
    deadline: float

    @classmethod
    def _from(cls, pb, sent_at: float) -> "Renewal":
        return cls(pb.lease_until_ms, pb.attempt, pb.valid_for_ms, pb.fencing,
                   sent_at + pb.valid_for_ms / 1000.0)


@dataclass(frozen=True)
class Run:
    """One run of a job, from ``history``. ``state``: RUNNING, SUCCEEDED, FAILED, INTERRUPTED, CLAIMED."""

    slot_ms: int
    attempt: int
    state: str
    holder: Optional[Holder]
    claimed_at_ms: int
    finished_at_ms: int
    lease_until_ms: int
    fencing: int

    @classmethod
    def _from(cls, pb) -> "Run":
        return cls(pb.slot_ms, pb.attempt, _enum_name(claims_pb2.RunState, pb.state, "RUN_STATE_"),
                   _holder(pb.holder), pb.claimed_at_ms, pb.finished_at_ms,
                   pb.lease_until_ms, pb.fencing)


@dataclass(frozen=True)
class History:
    runs: List[Run]
    backend: str
    retention: str
    complete: bool
    note: str


@dataclass(frozen=True)
class Peer:
    """A runtime as seen by this sidecar. ``state``: ALIVE, UNREACHABLE, EXPIRED, LEFT;
    ``link``: DIRECT, RELAYED, NONE (or SELF-like UNSPECIFIED for the sidecar itself)."""

    node: str
    instance: int
    restarts: int
    address: str
    state: str
    link: str
    beat: int
    beat_age_ms: int
    labels: Dict[str, str] = field(default_factory=dict)
    node_name: str = ""

    @classmethod
    def _from(cls, pb) -> "Peer":
        return cls(pb.node, pb.instance, pb.restarts, pb.address,
                   _enum_name(mesh_pb2.PeerState, pb.state, "PEER_STATE_"),
                   _enum_name(mesh_pb2.Link, pb.link, "LINK_"),
                   pb.beat, pb.beat_age_ms, dict(pb.labels), pb.node_name)


@dataclass(frozen=True)
class Peers:
    """The sidecar's own runtime and every peer it knows."""

    self: Peer
    peers: List[Peer]


@dataclass(frozen=True)
class PeerEvent:
    """``kind``: SNAPSHOT, JOINED, ALIVE, UNREACHABLE, EXPIRED, RESTARTED, LEFT."""

    kind: str
    peer: Peer

    @classmethod
    def _from(cls, pb) -> "PeerEvent":
        return cls(_enum_name(mesh_pb2.PeerEventKind, pb.kind, "PEER_EVENT_KIND_"), Peer._from(pb.peer))


def monotonic() -> float:
    return time.monotonic()
