from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Outcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OUTCOME_UNSPECIFIED: _ClassVar[Outcome]
    OUTCOME_WON: _ClassVar[Outcome]
    OUTCOME_LOST: _ClassVar[Outcome]
    OUTCOME_RUNNING: _ClassVar[Outcome]
    OUTCOME_DONE: _ClassVar[Outcome]
    OUTCOME_LATE: _ClassVar[Outcome]
    OUTCOME_OVERLAP: _ClassVar[Outcome]

class Overlap(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    OVERLAP_UNSPECIFIED: _ClassVar[Overlap]
    OVERLAP_ALLOW: _ClassVar[Overlap]
    OVERLAP_SKIP: _ClassVar[Overlap]

class RunState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RUN_STATE_UNSPECIFIED: _ClassVar[RunState]
    RUN_STATE_RUNNING: _ClassVar[RunState]
    RUN_STATE_SUCCEEDED: _ClassVar[RunState]
    RUN_STATE_FAILED: _ClassVar[RunState]
    RUN_STATE_INTERRUPTED: _ClassVar[RunState]
    RUN_STATE_CLAIMED: _ClassVar[RunState]

class ReleaseResult(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RELEASE_RESULT_UNSPECIFIED: _ClassVar[ReleaseResult]
    RELEASE_RESULT_SUCCEEDED: _ClassVar[ReleaseResult]
    RELEASE_RESULT_FAILED: _ClassVar[ReleaseResult]

class HoldEventKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    HOLD_EVENT_KIND_UNSPECIFIED: _ClassVar[HoldEventKind]
    HOLD_EVENT_KIND_CLAIMED: _ClassVar[HoldEventKind]
    HOLD_EVENT_KIND_RENEWED: _ClassVar[HoldEventKind]
    HOLD_EVENT_KIND_LOST_LEASE: _ClassVar[HoldEventKind]
    HOLD_EVENT_KIND_RELEASED: _ClassVar[HoldEventKind]
OUTCOME_UNSPECIFIED: Outcome
OUTCOME_WON: Outcome
OUTCOME_LOST: Outcome
OUTCOME_RUNNING: Outcome
OUTCOME_DONE: Outcome
OUTCOME_LATE: Outcome
OUTCOME_OVERLAP: Outcome
OVERLAP_UNSPECIFIED: Overlap
OVERLAP_ALLOW: Overlap
OVERLAP_SKIP: Overlap
RUN_STATE_UNSPECIFIED: RunState
RUN_STATE_RUNNING: RunState
RUN_STATE_SUCCEEDED: RunState
RUN_STATE_FAILED: RunState
RUN_STATE_INTERRUPTED: RunState
RUN_STATE_CLAIMED: RunState
RELEASE_RESULT_UNSPECIFIED: ReleaseResult
RELEASE_RESULT_SUCCEEDED: ReleaseResult
RELEASE_RESULT_FAILED: ReleaseResult
HOLD_EVENT_KIND_UNSPECIFIED: HoldEventKind
HOLD_EVENT_KIND_CLAIMED: HoldEventKind
HOLD_EVENT_KIND_RENEWED: HoldEventKind
HOLD_EVENT_KIND_LOST_LEASE: HoldEventKind
HOLD_EVENT_KIND_RELEASED: HoldEventKind

class Holder(_message.Message):
    __slots__ = ("node", "instance")
    NODE_FIELD_NUMBER: _ClassVar[int]
    INSTANCE_FIELD_NUMBER: _ClassVar[int]
    node: str
    instance: int
    def __init__(self, node: _Optional[str] = ..., instance: _Optional[int] = ...) -> None: ...

class ClaimRequest(_message.Message):
    __slots__ = ("job", "slot_ms", "token", "lease_ms", "max_late_ms", "overlap", "max_attempts", "wait_ms")
    JOB_FIELD_NUMBER: _ClassVar[int]
    SLOT_MS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    MAX_LATE_MS_FIELD_NUMBER: _ClassVar[int]
    OVERLAP_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    job: str
    slot_ms: int
    token: str
    lease_ms: int
    max_late_ms: int
    overlap: Overlap
    max_attempts: int
    wait_ms: int
    def __init__(self, job: _Optional[str] = ..., slot_ms: _Optional[int] = ..., token: _Optional[str] = ..., lease_ms: _Optional[int] = ..., max_late_ms: _Optional[int] = ..., overlap: _Optional[_Union[Overlap, str]] = ..., max_attempts: _Optional[int] = ..., wait_ms: _Optional[int] = ...) -> None: ...

class ClaimResponse(_message.Message):
    __slots__ = ("outcome", "token", "attempt", "fencing", "lease_until_ms", "valid_for_ms", "holder", "backend", "reason", "now_ms")
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    FENCING_FIELD_NUMBER: _ClassVar[int]
    LEASE_UNTIL_MS_FIELD_NUMBER: _ClassVar[int]
    VALID_FOR_MS_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    NOW_MS_FIELD_NUMBER: _ClassVar[int]
    outcome: Outcome
    token: str
    attempt: int
    fencing: int
    lease_until_ms: int
    valid_for_ms: int
    holder: Holder
    backend: str
    reason: str
    now_ms: int
    def __init__(self, outcome: _Optional[_Union[Outcome, str]] = ..., token: _Optional[str] = ..., attempt: _Optional[int] = ..., fencing: _Optional[int] = ..., lease_until_ms: _Optional[int] = ..., valid_for_ms: _Optional[int] = ..., holder: _Optional[_Union[Holder, _Mapping]] = ..., backend: _Optional[str] = ..., reason: _Optional[str] = ..., now_ms: _Optional[int] = ...) -> None: ...

class RenewRequest(_message.Message):
    __slots__ = ("job", "slot_ms", "token", "lease_ms")
    JOB_FIELD_NUMBER: _ClassVar[int]
    SLOT_MS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    LEASE_MS_FIELD_NUMBER: _ClassVar[int]
    job: str
    slot_ms: int
    token: str
    lease_ms: int
    def __init__(self, job: _Optional[str] = ..., slot_ms: _Optional[int] = ..., token: _Optional[str] = ..., lease_ms: _Optional[int] = ...) -> None: ...

class RenewResponse(_message.Message):
    __slots__ = ("lease_until_ms", "attempt", "valid_for_ms", "fencing")
    LEASE_UNTIL_MS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    VALID_FOR_MS_FIELD_NUMBER: _ClassVar[int]
    FENCING_FIELD_NUMBER: _ClassVar[int]
    lease_until_ms: int
    attempt: int
    valid_for_ms: int
    fencing: int
    def __init__(self, lease_until_ms: _Optional[int] = ..., attempt: _Optional[int] = ..., valid_for_ms: _Optional[int] = ..., fencing: _Optional[int] = ...) -> None: ...

class ReleaseRequest(_message.Message):
    __slots__ = ("job", "slot_ms", "token", "result")
    JOB_FIELD_NUMBER: _ClassVar[int]
    SLOT_MS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    job: str
    slot_ms: int
    token: str
    result: ReleaseResult
    def __init__(self, job: _Optional[str] = ..., slot_ms: _Optional[int] = ..., token: _Optional[str] = ..., result: _Optional[_Union[ReleaseResult, str]] = ...) -> None: ...

class ReleaseResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HoldEvent(_message.Message):
    __slots__ = ("kind", "claim", "lease_until_ms", "valid_for_ms", "reason", "hold_valid_for_ms")
    KIND_FIELD_NUMBER: _ClassVar[int]
    CLAIM_FIELD_NUMBER: _ClassVar[int]
    LEASE_UNTIL_MS_FIELD_NUMBER: _ClassVar[int]
    VALID_FOR_MS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    HOLD_VALID_FOR_MS_FIELD_NUMBER: _ClassVar[int]
    kind: HoldEventKind
    claim: ClaimResponse
    lease_until_ms: int
    valid_for_ms: int
    reason: str
    hold_valid_for_ms: int
    def __init__(self, kind: _Optional[_Union[HoldEventKind, str]] = ..., claim: _Optional[_Union[ClaimResponse, _Mapping]] = ..., lease_until_ms: _Optional[int] = ..., valid_for_ms: _Optional[int] = ..., reason: _Optional[str] = ..., hold_valid_for_ms: _Optional[int] = ...) -> None: ...

class HistoryRequest(_message.Message):
    __slots__ = ("job", "limit", "before_slot_ms")
    JOB_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    BEFORE_SLOT_MS_FIELD_NUMBER: _ClassVar[int]
    job: str
    limit: int
    before_slot_ms: int
    def __init__(self, job: _Optional[str] = ..., limit: _Optional[int] = ..., before_slot_ms: _Optional[int] = ...) -> None: ...

class Run(_message.Message):
    __slots__ = ("slot_ms", "attempt", "state", "holder", "claimed_at_ms", "finished_at_ms", "lease_until_ms", "fencing")
    SLOT_MS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    HOLDER_FIELD_NUMBER: _ClassVar[int]
    CLAIMED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_MS_FIELD_NUMBER: _ClassVar[int]
    LEASE_UNTIL_MS_FIELD_NUMBER: _ClassVar[int]
    FENCING_FIELD_NUMBER: _ClassVar[int]
    slot_ms: int
    attempt: int
    state: RunState
    holder: Holder
    claimed_at_ms: int
    finished_at_ms: int
    lease_until_ms: int
    fencing: int
    def __init__(self, slot_ms: _Optional[int] = ..., attempt: _Optional[int] = ..., state: _Optional[_Union[RunState, str]] = ..., holder: _Optional[_Union[Holder, _Mapping]] = ..., claimed_at_ms: _Optional[int] = ..., finished_at_ms: _Optional[int] = ..., lease_until_ms: _Optional[int] = ..., fencing: _Optional[int] = ...) -> None: ...

class HistoryResponse(_message.Message):
    __slots__ = ("runs", "backend", "retention", "complete", "note")
    RUNS_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    RETENTION_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    runs: _containers.RepeatedCompositeFieldContainer[Run]
    backend: str
    retention: str
    complete: bool
    note: str
    def __init__(self, runs: _Optional[_Iterable[_Union[Run, _Mapping]]] = ..., backend: _Optional[str] = ..., retention: _Optional[str] = ..., complete: _Optional[bool] = ..., note: _Optional[str] = ...) -> None: ...
