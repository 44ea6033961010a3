"""anarchon: who owns a (job, slot), and who is alive — a client for the anarchon sidecar.

    from anarchon import Client

    c = Client("127.0.0.1:50051")
    with c.hold("nightly-report", slot_ms) as claim:
        if claim.won:
            do_the_work()          # released SUCCEEDED on exit, FAILED on an exception

``anarchon.aio.Client`` is the asyncio twin. The generated stubs live in
``anarchon.v1`` (``claims_pb2``, ``claims_pb2_grpc``, ``mesh_pb2``, ``mesh_pb2_grpc``).
"""

from .client import DEFAULT_TARGET, Client, PeerWatch
from .errors import (AnarchonError, DeadlineExceededError, FencedError, InvalidArgumentError,
                     LeaseLostError, NoLeasesError, NotFoundError, PermissionDeniedError,
                     ResourceExhaustedError, UnauthenticatedError, UnavailableError, REASON_KEY)
from .models import Claim, HeldClaim, History, Holder, Peer, PeerEvent, Peers, Renewal, Run

__all__ = [
    "Client", "PeerWatch", "DEFAULT_TARGET", "REASON_KEY",
    "Claim", "HeldClaim", "Renewal", "Holder", "Run", "History", "Peer", "Peers", "PeerEvent",
    "AnarchonError", "InvalidArgumentError", "FencedError", "NoLeasesError", "NotFoundError",
    "UnavailableError", "DeadlineExceededError", "UnauthenticatedError", "PermissionDeniedError",
    "ResourceExhaustedError", "LeaseLostError",
]
__version__ = "0.1.0"
