"""Typed errors. Contention is never an error: it is a ``Claim.outcome``.

Every error raised by a call carries the gRPC ``code``, the server's
``details`` text and, when the sidecar sent one, the machine-readable
``reason`` from the ``anarchon-reason`` response metadata key (``"fenced"``,
``"no_leases"``, or the name of the offending field for ``INVALID_ARGUMENT``).
"""

from __future__ import annotations

from typing import Optional

import grpc

REASON_KEY = "anarchon-reason"


class AnarchonError(Exception):
    """Base class of every error raised by this package."""

    def __init__(self, message: str, *, code: Optional[grpc.StatusCode] = None,
                 reason: Optional[str] = None, details: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.details = details


class InvalidArgumentError(AnarchonError):
    """Bad input (``INVALID_ARGUMENT``); ``reason`` names the field."""


class FencedError(AnarchonError):
    """The token no longer holds its run (taken over, finished, holder restarted)."""


class NoLeasesError(AnarchonError):
    """The backend has no leases (once backends): ``Renew`` is meaningless."""


class NotFoundError(AnarchonError):
    """No such run."""


class UnavailableError(AnarchonError):
    """The sidecar or its store cannot be reached. Retry later."""


class DeadlineExceededError(AnarchonError):
    """The call's deadline passed."""


class UnauthenticatedError(AnarchonError):
    """Missing or wrong bearer token."""


class PermissionDeniedError(AnarchonError):
    """The caller may not do this."""


class ResourceExhaustedError(AnarchonError):
    """A configured limit was hit (e.g. a slow peer watcher was cut off)."""


class LeaseLostError(AnarchonError):
    """A held run's lease was lost: stop working, the result is not yours to publish.

    ``reason`` is the sidecar's (``"fenced"``, ``"unavailable"``) or
    ``"stream_broken"`` when the Hold stream to the sidecar broke.
    """


_BY_CODE = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgumentError,
    grpc.StatusCode.NOT_FOUND: NotFoundError,
    grpc.StatusCode.UNAVAILABLE: UnavailableError,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceededError,
    grpc.StatusCode.UNAUTHENTICATED: UnauthenticatedError,
    grpc.StatusCode.PERMISSION_DENIED: PermissionDeniedError,
    grpc.StatusCode.RESOURCE_EXHAUSTED: ResourceExhaustedError,
}


def reason_of(metadata) -> Optional[str]:
    """Reads the ``anarchon-reason`` value out of trailing metadata."""
    for key, value in metadata or ():
        if key == REASON_KEY:
            return value.decode() if isinstance(value, bytes) else value
    return None


def from_status(code: grpc.StatusCode, details: str, metadata) -> AnarchonError:
    reason = reason_of(metadata)
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        first = (details or "").split(":", 1)[0].strip()
        reason = reason or (first if first in ("fenced", "no_leases") else None)
        cls = {"fenced": FencedError, "no_leases": NoLeasesError}.get(reason or "", AnarchonError)
    else:
        cls = _BY_CODE.get(code, AnarchonError)
    name = code.name if code is not None else "UNKNOWN"
    return cls(f"{name}: {details}", code=code, reason=reason, details=details or "")


def from_rpc_error(err: grpc.RpcError) -> AnarchonError:
    """Maps a ``grpc.RpcError`` (sync or aio) to a typed :class:`AnarchonError`."""
    try:
        code = err.code()
        details = err.details()
        metadata = err.trailing_metadata()
    except Exception:  # pragma: no cover - not a call error
        return AnarchonError(str(err))
    if hasattr(metadata, "__await__"):  # pragma: no cover - aio passes resolved values
        metadata = None
    return from_status(code, details, metadata)
