from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PeerState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PEER_STATE_UNSPECIFIED: _ClassVar[PeerState]
    PEER_STATE_ALIVE: _ClassVar[PeerState]
    PEER_STATE_UNREACHABLE: _ClassVar[PeerState]
    PEER_STATE_EXPIRED: _ClassVar[PeerState]
    PEER_STATE_LEFT: _ClassVar[PeerState]

class Link(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    LINK_UNSPECIFIED: _ClassVar[Link]
    LINK_DIRECT: _ClassVar[Link]
    LINK_RELAYED: _ClassVar[Link]
    LINK_NONE: _ClassVar[Link]

class PeerEventKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PEER_EVENT_KIND_UNSPECIFIED: _ClassVar[PeerEventKind]
    PEER_EVENT_KIND_SNAPSHOT: _ClassVar[PeerEventKind]
    PEER_EVENT_KIND_JOINED: _ClassVar[PeerEventKind]
    PEER_EVENT_KIND_ALIVE: _ClassVar[PeerEventKind]
    PEER_EVENT_KIND_UNREACHABLE: _ClassVar[PeerEventKind]
    PEER_EVENT_KIND_EXPIRED: _ClassVar[PeerEventKind]
    PEER_EVENT_KIND_RESTARTED: _ClassVar[PeerEventKind]
    PEER_EVENT_KIND_LEFT: _ClassVar[PeerEventKind]
PEER_STATE_UNSPECIFIED: PeerState
PEER_STATE_ALIVE: PeerState
PEER_STATE_UNREACHABLE: PeerState
PEER_STATE_EXPIRED: PeerState
PEER_STATE_LEFT: PeerState
LINK_UNSPECIFIED: Link
LINK_DIRECT: Link
LINK_RELAYED: Link
LINK_NONE: Link
PEER_EVENT_KIND_UNSPECIFIED: PeerEventKind
PEER_EVENT_KIND_SNAPSHOT: PeerEventKind
PEER_EVENT_KIND_JOINED: PeerEventKind
PEER_EVENT_KIND_ALIVE: PeerEventKind
PEER_EVENT_KIND_UNREACHABLE: PeerEventKind
PEER_EVENT_KIND_EXPIRED: PeerEventKind
PEER_EVENT_KIND_RESTARTED: PeerEventKind
PEER_EVENT_KIND_LEFT: PeerEventKind

class Peer(_message.Message):
    __slots__ = ("node", "instance", "restarts", "address", "state", "link", "beat", "beat_age_ms", "labels", "node_name")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NODE_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    RESTARTS_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    LINK_FIELD_NUMBER: _ClassVar[int]
    BEAT_FIELD_NUMBER: _ClassVar[int]
    BEAT_AGE_MS_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    NODE_NAME_FIELD_NUMBER: _ClassVar[int]
    node: str
    instance: int
    restarts: int
    address: str
    state: PeerState
    link: Link
    beat: int
    beat_age_ms: int
    labels: _containers.ScalarMap[str, str]
    node_name: str
    def __init__(self, node: _Optional[str] = ..., instance: _Optional[int] = ..., restarts: _Optional[int] = ..., address: _Optional[str] = ..., state: _Optional[_Union[PeerState, str]] = ..., link: _Optional[_Union[Link, str]] = ..., beat: _Optional[int] = ..., beat_age_ms: _Optional[int] = ..., labels: _Optional[_Mapping[str, str]] = ..., node_name: _Optional[str] = ...) -> None: ...

class WatchPeersRequest(_message.Message):
    __slots__ = ("include_expired",)
    INCLUDE_EXPIRED_FIELD_NUMBER: _ClassVar[int]
    include_expired: bool
    def __init__(self, include_expired: _Optional[bool] = ...) -> None: ...

class PeerEvent(_message.Message):
    __slots__ = ("kind", "peer")
    KIND_FIELD_NUMBER: _ClassVar[int]
    PEER_FIELD_NUMBER: _ClassVar[int]
    kind: PeerEventKind
    peer: Peer
    def __init__(self, kind: _Optional[_Union[PeerEventKind, str]] = ..., peer: _Optional[_Union[Peer, _Mapping]] = ...) -> None: ...

class ListPeersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListPeersResponse(_message.Message):
    __slots__ = ("self", "peers", "duplicate_node_key", "duplicate_instance", "store_identity", "refused")
    SELF_FIELD_NUMBER: _ClassVar[int]
    PEERS_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_NODE_KEY_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_INSTANCE_FIELD_NUMBER: _ClassVar[int]
    STORE_IDENTITY_FIELD_NUMBER: _ClassVar[int]
    REFUSED_FIELD_NUMBER: _ClassVar[int]
    self: Peer
    peers: _containers.RepeatedCompositeFieldContainer[Peer]
    duplicate_node_key: bool
    duplicate_instance: int
    store_identity: str
    refused: _containers.RepeatedCompositeFieldContainer[RefusedPeer]
    def __init__(self_, self: _Optional[_Union[Peer, _Mapping]] = ..., peers: _Optional[_Iterable[_Union[Peer, _Mapping]]] = ..., duplicate_node_key: _Optional[bool] = ..., duplicate_instance: _Optional[int] = ..., store_identity: _Optional[str] = ..., refused: _Optional[_Iterable[_Union[RefusedPeer, _Mapping]]] = ...) -> None: ...

class RefusedPeer(_message.Message):
    __slots__ = ("node", "address", "reason", "store_identity", "age_ms")
    NODE_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    STORE_IDENTITY_FIELD_NUMBER: _ClassVar[int]
    AGE_MS_FIELD_NUMBER: _ClassVar[int]
    node: str
    address: str
    reason: str
    store_identity: str
    age_ms: int
    def __init__(self, node: _Optional[str] = ..., address: _Optional[str] = ..., reason: _Optional[str] = ..., store_identity: _Optional[str] = ..., age_ms: _Optional[int] = ...) -> None: ...

class Mark(_message.Message):
    __slots__ = ("node", "instance", "beat", "signature", "public_key", "address", "labels", "age_ms", "left")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NODE_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    BEAT_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    AGE_MS_FIELD_NUMBER: _ClassVar[int]
    LEFT_FIELD_NUMBER: _ClassVar[int]
    node: str
    instance: int
    beat: int
    signature: bytes
    public_key: bytes
    address: str
    labels: _containers.ScalarMap[str, str]
    age_ms: int
    left: bool
    def __init__(self, node: _Optional[str] = ..., instance: _Optional[int] = ..., beat: _Optional[int] = ..., signature: _Optional[bytes] = ..., public_key: _Optional[bytes] = ..., address: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., age_ms: _Optional[int] = ..., left: _Optional[bool] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("node", "instance", "public_key", "proof", "nonce", "address", "mesh_secret", "store_identity", "gossip")
    NODE_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    PROOF_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    MESH_SECRET_FIELD_NUMBER: _ClassVar[int]
    STORE_IDENTITY_FIELD_NUMBER: _ClassVar[int]
    GOSSIP_FIELD_NUMBER: _ClassVar[int]
    node: str
    instance: int
    public_key: bytes
    proof: bytes
    nonce: bytes
    address: str
    mesh_secret: str
    store_identity: str
    gossip: int
    def __init__(self, node: _Optional[str] = ..., instance: _Optional[int] = ..., public_key: _Optional[bytes] = ..., proof: _Optional[bytes] = ..., nonce: _Optional[bytes] = ..., address: _Optional[str] = ..., mesh_secret: _Optional[str] = ..., store_identity: _Optional[str] = ..., gossip: _Optional[int] = ...) -> None: ...

class SyncFrame(_message.Message):
    __slots__ = ("hello", "marks", "nudge")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    MARKS_FIELD_NUMBER: _ClassVar[int]
    NUDGE_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    marks: Marks
    nudge: Nudge
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., marks: _Optional[_Union[Marks, _Mapping]] = ..., nudge: _Optional[_Union[Nudge, _Mapping]] = ...) -> None: ...

class Nudge(_message.Message):
    __slots__ = ("runs",)
    RUNS_FIELD_NUMBER: _ClassVar[int]
    runs: _containers.RepeatedCompositeFieldContainer[RunRef]
    def __init__(self, runs: _Optional[_Iterable[_Union[RunRef, _Mapping]]] = ...) -> None: ...

class RunRef(_message.Message):
    __slots__ = ("job", "slot_ms")
    JOB_FIELD_NUMBER: _ClassVar[int]
    SLOT_MS_FIELD_NUMBER: _ClassVar[int]
    job: str
    slot_ms: int
    def __init__(self, job: _Optional[str] = ..., slot_ms: _Optional[int] = ...) -> None: ...

class Marks(_message.Message):
    __slots__ = ("marks", "subscribe", "unsubscribe", "subscriptions_reset", "want")
    MARKS_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBE_FIELD_NUMBER: _ClassVar[int]
    UNSUBSCRIBE_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTIONS_RESET_FIELD_NUMBER: _ClassVar[int]
    WANT_FIELD_NUMBER: _ClassVar[int]
    marks: _containers.RepeatedCompositeFieldContainer[Mark]
    subscribe: _containers.RepeatedScalarFieldContainer[str]
    unsubscribe: _containers.RepeatedScalarFieldContainer[str]
    subscriptions_reset: bool
    want: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, marks: _Optional[_Iterable[_Union[Mark, _Mapping]]] = ..., subscribe: _Optional[_Iterable[str]] = ..., unsubscribe: _Optional[_Iterable[str]] = ..., subscriptions_reset: _Optional[bool] = ..., want: _Optional[_Iterable[str]] = ...) -> None: ...
