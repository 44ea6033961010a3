"""Builds protobuf requests from keyword arguments (shared by the sync and aio clients)."""

from __future__ import annotations

from typing import Optional, Union

from .v1 import claims_pb2

_OVERLAP = {
    None: claims_pb2.OVERLAP_UNSPECIFIED,
    "": claims_pb2.OVERLAP_UNSPECIFIED,
    "allow": claims_pb2.OVERLAP_ALLOW,
    "skip": claims_pb2.OVERLAP_SKIP,
}


def overlap_value(overlap: Union[None, str, int]) -> int:
    if isinstance(overlap, int):
        return overlap
    try:
        return _OVERLAP[overlap.lower() if isinstance(overlap, str) else overlap]
    except KeyError:
        raise ValueError(f"overlap must be 'allow' or 'skip', not {overlap!r}") from None


def claim_request(job: str, slot_ms: int = 0, *, token: Optional[str] = None, lease_ms: int = 0,
                  max_late_ms: int = 0, overlap: Union[None, str, int] = None,
                  max_attempts: int = 0, wait_ms: int = 0) -> claims_pb2.ClaimRequest:
    return claims_pb2.ClaimRequest(
        job=job, slot_ms=int(slot_ms), token=token or "", lease_ms=int(lease_ms),
        max_late_ms=int(max_late_ms), overlap=overlap_value(overlap),
        max_attempts=int(max_attempts), wait_ms=int(wait_ms))


def run_ref(claim_or_job, slot_ms, token, what: str):
    """Accepts either ``(claim)`` or ``(job, slot_ms, token)``."""
    from .models import Claim
    if isinstance(claim_or_job, Claim):
        if slot_ms is not None or token is not None:
            raise TypeError(f"{what}(claim) takes no slot_ms/token")
        if not claim_or_job.token:
            raise ValueError(f"cannot {what} a claim that was not won ({claim_or_job.outcome})")
        return claim_or_job.job, claim_or_job.slot_ms, claim_or_job.token
    if slot_ms is None or token is None:
        raise TypeError(f"{what}(job, slot_ms, token) needs all three (or a Claim)")
    return claim_or_job, int(slot_ms), token


def release_result(succeeded: bool) -> int:
    return claims_pb2.RELEASE_RESULT_SUCCEEDED if succeeded else claims_pb2.RELEASE_RESULT_FAILED
