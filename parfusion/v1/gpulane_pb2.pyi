from parfusion.v1 import intent_pb2 as _intent_pb2
from parfusion.v1 import telemetry_pb2 as _telemetry_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ApplyMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    APPLY_MODE_UNSPECIFIED: _ClassVar[ApplyMode]
    APPLY_MODE_DRY_RUN: _ClassVar[ApplyMode]
    APPLY_MODE_APPLY: _ClassVar[ApplyMode]
APPLY_MODE_UNSPECIFIED: ApplyMode
APPLY_MODE_DRY_RUN: ApplyMode
APPLY_MODE_APPLY: ApplyMode

class GpuCommand(_message.Message):
    __slots__ = ("argv", "stdin", "env", "purpose", "intent_id")
    class EnvEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ARGV_FIELD_NUMBER: _ClassVar[int]
    STDIN_FIELD_NUMBER: _ClassVar[int]
    ENV_FIELD_NUMBER: _ClassVar[int]
    PURPOSE_FIELD_NUMBER: _ClassVar[int]
    INTENT_ID_FIELD_NUMBER: _ClassVar[int]
    argv: _containers.RepeatedScalarFieldContainer[str]
    stdin: str
    env: _containers.ScalarMap[str, str]
    purpose: str
    intent_id: str
    def __init__(self, argv: _Optional[_Iterable[str]] = ..., stdin: _Optional[str] = ..., env: _Optional[_Mapping[str, str]] = ..., purpose: _Optional[str] = ..., intent_id: _Optional[str] = ...) -> None: ...

class LaneDecision(_message.Message):
    __slots__ = ("intent_id", "lane", "gpu_indexes", "share_percent", "cuda_stream_priority", "concurrency", "mig_profile", "available", "reason")
    INTENT_ID_FIELD_NUMBER: _ClassVar[int]
    LANE_FIELD_NUMBER: _ClassVar[int]
    GPU_INDEXES_FIELD_NUMBER: _ClassVar[int]
    SHARE_PERCENT_FIELD_NUMBER: _ClassVar[int]
    CUDA_STREAM_PRIORITY_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    MIG_PROFILE_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    intent_id: str
    lane: str
    gpu_indexes: _containers.RepeatedScalarFieldContainer[int]
    share_percent: float
    cuda_stream_priority: int
    concurrency: int
    mig_profile: str
    available: bool
    reason: str
    def __init__(self, intent_id: _Optional[str] = ..., lane: _Optional[str] = ..., gpu_indexes: _Optional[_Iterable[int]] = ..., share_percent: _Optional[float] = ..., cuda_stream_priority: _Optional[int] = ..., concurrency: _Optional[int] = ..., mig_profile: _Optional[str] = ..., available: _Optional[bool] = ..., reason: _Optional[str] = ...) -> None: ...

class ApplyGpuPlanRequest(_message.Message):
    __slots__ = ("plan", "mode")
    PLAN_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    plan: _intent_pb2.GpuPlan
    mode: ApplyMode
    def __init__(self, plan: _Optional[_Union[_intent_pb2.GpuPlan, _Mapping]] = ..., mode: _Optional[_Union[ApplyMode, str]] = ...) -> None: ...

class ApplyGpuPlanResponse(_message.Message):
    __slots__ = ("generation", "mode", "decisions", "commands", "recorded_path", "notes", "changed")
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    COMMANDS_FIELD_NUMBER: _ClassVar[int]
    RECORDED_PATH_FIELD_NUMBER: _ClassVar[int]
    NOTES_FIELD_NUMBER: _ClassVar[int]
    CHANGED_FIELD_NUMBER: _ClassVar[int]
    generation: int
    mode: ApplyMode
    decisions: _containers.RepeatedCompositeFieldContainer[LaneDecision]
    commands: _containers.RepeatedCompositeFieldContainer[GpuCommand]
    recorded_path: str
    notes: _containers.RepeatedScalarFieldContainer[str]
    changed: bool
    def __init__(self, generation: _Optional[int] = ..., mode: _Optional[_Union[ApplyMode, str]] = ..., decisions: _Optional[_Iterable[_Union[LaneDecision, _Mapping]]] = ..., commands: _Optional[_Iterable[_Union[GpuCommand, _Mapping]]] = ..., recorded_path: _Optional[str] = ..., notes: _Optional[_Iterable[str]] = ..., changed: _Optional[bool] = ...) -> None: ...

class GetGpuTelemetryRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetGpuTelemetryResponse(_message.Message):
    __slots__ = ("telemetry",)
    TELEMETRY_FIELD_NUMBER: _ClassVar[int]
    telemetry: _telemetry_pb2.GpuTelemetry
    def __init__(self, telemetry: _Optional[_Union[_telemetry_pb2.GpuTelemetry, _Mapping]] = ...) -> None: ...

class PreviewCommandsRequest(_message.Message):
    __slots__ = ("plan",)
    PLAN_FIELD_NUMBER: _ClassVar[int]
    plan: _intent_pb2.GpuPlan
    def __init__(self, plan: _Optional[_Union[_intent_pb2.GpuPlan, _Mapping]] = ...) -> None: ...

class PreviewCommandsResponse(_message.Message):
    __slots__ = ("decisions", "commands", "notes")
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    COMMANDS_FIELD_NUMBER: _ClassVar[int]
    NOTES_FIELD_NUMBER: _ClassVar[int]
    decisions: _containers.RepeatedCompositeFieldContainer[LaneDecision]
    commands: _containers.RepeatedCompositeFieldContainer[GpuCommand]
    notes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, decisions: _Optional[_Iterable[_Union[LaneDecision, _Mapping]]] = ..., commands: _Optional[_Iterable[_Union[GpuCommand, _Mapping]]] = ..., notes: _Optional[_Iterable[str]] = ...) -> None: ...
