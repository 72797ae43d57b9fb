from parfusion.v1 import intent_pb2 as _intent_pb2
from parfusion.v1 import telemetry_pb2 as _telemetry_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ApplyNodePlanRequest(_message.Message):
    __slots__ = ("plan", "base_generation", "removed_intent_ids")
    PLAN_FIELD_NUMBER: _ClassVar[int]
    BASE_GENERATION_FIELD_NUMBER: _ClassVar[int]
    REMOVED_INTENT_IDS_FIELD_NUMBER: _ClassVar[int]
    plan: _intent_pb2.NodePlan
    base_generation: int
    removed_intent_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, plan: _Optional[_Union[_intent_pb2.NodePlan, _Mapping]] = ..., base_generation: _Optional[int] = ..., removed_intent_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class AppliedAllocation(_message.Message):
    __slots__ = ("intent_id", "workers", "cpu_set", "nice", "cgroup_mode", "note")
    INTENT_ID_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    CPU_SET_FIELD_NUMBER: _ClassVar[int]
    NICE_FIELD_NUMBER: _ClassVar[int]
    CGROUP_MODE_FIELD_NUMBER: _ClassVar[int]
    NOTE_FIELD_NUMBER: _ClassVar[int]
    intent_id: str
    workers: int
    cpu_set: _containers.RepeatedScalarFieldContainer[int]
    nice: int
    cgroup_mode: str
    note: str
    def __init__(self, intent_id: _Optional[str] = ..., workers: _Optional[int] = ..., cpu_set: _Optional[_Iterable[int]] = ..., nice: _Optional[int] = ..., cgroup_mode: _Optional[str] = ..., note: _Optional[str] = ...) -> None: ...

class ApplyNodePlanResponse(_message.Message):
    __slots__ = ("generation", "applied", "cgroup_plan_path", "resync_required")
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    APPLIED_FIELD_NUMBER: _ClassVar[int]
    CGROUP_PLAN_PATH_FIELD_NUMBER: _ClassVar[int]
    RESYNC_REQUIRED_FIELD_NUMBER: _ClassVar[int]
    generation: int
    applied: _containers.RepeatedCompositeFieldContainer[AppliedAllocation]
    cgroup_plan_path: str
    resync_required: bool
    def __init__(self, generation: _Optional[int] = ..., applied: _Optional[_Iterable[_Union[AppliedAllocation, _Mapping]]] = ..., cgroup_plan_path: _Optional[str] = ..., resync_required: _Optional[bool] = ...) -> None: ...

class GetNodeTelemetryRequest(_message.Message):
    __slots__ = ("drain_samples", "delta", "known_generation")
    DRAIN_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    DELTA_FIELD_NUMBER: _ClassVar[int]
    KNOWN_GENERATION_FIELD_NUMBER: _ClassVar[int]
    drain_samples: bool
    delta: bool
    known_generation: int
    def __init__(self, drain_samples: _Optional[bool] = ..., delta: _Optional[bool] = ..., known_generation: _Optional[int] = ...) -> None: ...

class GetNodeTelemetryResponse(_message.Message):
    __slots__ = ("telemetry", "generation", "base_generation", "removed_intent_ids")
    TELEMETRY_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    BASE_GENERATION_FIELD_NUMBER: _ClassVar[int]
    REMOVED_INTENT_IDS_FIELD_NUMBER: _ClassVar[int]
    telemetry: _telemetry_pb2.NodeTelemetry
    generation: int
    base_generation: int
    removed_intent_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, telemetry: _Optional[_Union[_telemetry_pb2.NodeTelemetry, _Mapping]] = ..., generation: _Optional[int] = ..., base_generation: _Optional[int] = ..., removed_intent_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class InjectDisturbanceRequest(_message.Message):
    __slots__ = ("disturbance",)
    DISTURBANCE_FIELD_NUMBER: _ClassVar[int]
    disturbance: _telemetry_pb2.Disturbance
    def __init__(self, disturbance: _Optional[_Union[_telemetry_pb2.Disturbance, _Mapping]] = ...) -> None: ...

class InjectDisturbanceResponse(_message.Message):
    __slots__ = ("accepted", "backend", "expires_in_s")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_IN_S_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    backend: str
    expires_in_s: float
    def __init__(self, accepted: _Optional[bool] = ..., backend: _Optional[str] = ..., expires_in_s: _Optional[float] = ...) -> None: ...

class ControlProcessRequest(_message.Message):
    __slots__ = ("pid", "cpu_set", "nice")
    PID_FIELD_NUMBER: _ClassVar[int]
    CPU_SET_FIELD_NUMBER: _ClassVar[int]
    NICE_FIELD_NUMBER: _ClassVar[int]
    pid: int
    cpu_set: _containers.RepeatedScalarFieldContainer[int]
    nice: int
    def __init__(self, pid: _Optional[int] = ..., cpu_set: _Optional[_Iterable[int]] = ..., nice: _Optional[int] = ...) -> None: ...

class ControlProcessResponse(_message.Message):
    __slots__ = ("pid", "cpu_set", "nice")
    PID_FIELD_NUMBER: _ClassVar[int]
    CPU_SET_FIELD_NUMBER: _ClassVar[int]
    NICE_FIELD_NUMBER: _ClassVar[int]
    pid: int
    cpu_set: _containers.RepeatedScalarFieldContainer[int]
    nice: int
    def __init__(self, pid: _Optional[int] = ..., cpu_set: _Optional[_Iterable[int]] = ..., nice: _Optional[int] = ...) -> None: ...
