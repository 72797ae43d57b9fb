import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from parfusion.v1 import intent_pb2 as _intent_pb2
from parfusion.v1 import telemetry_pb2 as _telemetry_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SubmitIntentRequest(_message.Message):
    __slots__ = ("intent",)
    INTENT_FIELD_NUMBER: _ClassVar[int]
    intent: _intent_pb2.ResourceIntent
    def __init__(self, intent: _Optional[_Union[_intent_pb2.ResourceIntent, _Mapping]] = ...) -> None: ...

class SubmitIntentResponse(_message.Message):
    __slots__ = ("intent", "already_existed")
    INTENT_FIELD_NUMBER: _ClassVar[int]
    ALREADY_EXISTED_FIELD_NUMBER: _ClassVar[int]
    intent: _intent_pb2.ResourceIntent
    already_existed: bool
    def __init__(self, intent: _Optional[_Union[_intent_pb2.ResourceIntent, _Mapping]] = ..., already_existed: _Optional[bool] = ...) -> None: ...

class GetIntentRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class GetIntentResponse(_message.Message):
    __slots__ = ("intent", "allocation")
    INTENT_FIELD_NUMBER: _ClassVar[int]
    ALLOCATION_FIELD_NUMBER: _ClassVar[int]
    intent: _intent_pb2.ResourceIntent
    allocation: _intent_pb2.Allocation
    def __init__(self, intent: _Optional[_Union[_intent_pb2.ResourceIntent, _Mapping]] = ..., allocation: _Optional[_Union[_intent_pb2.Allocation, _Mapping]] = ...) -> None: ...

class ListIntentsRequest(_message.Message):
    __slots__ = ("workload_class",)
    WORKLOAD_CLASS_FIELD_NUMBER: _ClassVar[int]
    workload_class: _intent_pb2.WorkloadClass
    def __init__(self, workload_class: _Optional[_Union[_intent_pb2.WorkloadClass, str]] = ...) -> None: ...

class ListIntentsResponse(_message.Message):
    __slots__ = ("intents",)
    INTENTS_FIELD_NUMBER: _ClassVar[int]
    intents: _containers.RepeatedCompositeFieldContainer[_intent_pb2.ResourceIntent]
    def __init__(self, intents: _Optional[_Iterable[_Union[_intent_pb2.ResourceIntent, _Mapping]]] = ...) -> None: ...

class DeleteIntentRequest(_message.Message):
    __slots__ = ("id",)
    ID_FIELD_NUMBER: _ClassVar[int]
    id: str
    def __init__(self, id: _Optional[str] = ...) -> None: ...

class DeleteIntentResponse(_message.Message):
    __slots__ = ("deleted",)
    DELETED_FIELD_NUMBER: _ClassVar[int]
    deleted: bool
    def __init__(self, deleted: _Optional[bool] = ...) -> None: ...

class GetPlanRequest(_message.Message):
    __slots__ = ("known_generation", "deltas", "omit_allocations")
    KNOWN_GENERATION_FIELD_NUMBER: _ClassVar[int]
    DELTAS_FIELD_NUMBER: _ClassVar[int]
    OMIT_ALLOCATIONS_FIELD_NUMBER: _ClassVar[int]
    known_generation: int
    deltas: bool
    omit_allocations: bool
    def __init__(self, known_generation: _Optional[int] = ..., deltas: _Optional[bool] = ..., omit_allocations: _Optional[bool] = ...) -> None: ...

class GetPlanResponse(_message.Message):
    __slots__ = ("node_plan", "gpu_plan", "node_stale", "last_telemetry_at", "policy", "generation", "unchanged", "base_generation", "removed_intent_ids")
    NODE_PLAN_FIELD_NUMBER: _ClassVar[int]
    GPU_PLAN_FIELD_NUMBER: _ClassVar[int]
    NODE_STALE_FIELD_NUMBER: _ClassVar[int]
    LAST_TELEMETRY_AT_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    UNCHANGED_FIELD_NUMBER: _ClassVar[int]
    BASE_GENERATION_FIELD_NUMBER: _ClassVar[int]
    REMOVED_INTENT_IDS_FIELD_NUMBER: _ClassVar[int]
    node_plan: _intent_pb2.NodePlan
    gpu_plan: _intent_pb2.GpuPlan
    node_stale: bool
    last_telemetry_at: _timestamp_pb2.Timestamp
    policy: str
    generation: int
    unchanged: bool
    base_generation: int
    removed_intent_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, node_plan: _Optional[_Union[_intent_pb2.NodePlan, _Mapping]] = ..., gpu_plan: _Optional[_Union[_intent_pb2.GpuPlan, _Mapping]] = ..., node_stale: _Optional[bool] = ..., last_telemetry_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., policy: _Optional[str] = ..., generation: _Optional[int] = ..., unchanged: _Optional[bool] = ..., base_generation: _Optional[int] = ..., removed_intent_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class WatchPlansRequest(_message.Message):
    __slots__ = ("include_current", "deltas")
    INCLUDE_CURRENT_FIELD_NUMBER: _ClassVar[int]
    DELTAS_FIELD_NUMBER: _ClassVar[int]
    include_current: bool
    deltas: bool
    def __init__(self, include_current: _Optional[bool] = ..., deltas: _Optional[bool] = ...) -> None: ...

class WatchPlansResponse(_message.Message):
    __slots__ = ("node_plan", "gpu_plan", "base_generation", "removed_intent_ids")
    NODE_PLAN_FIELD_NUMBER: _ClassVar[int]
    GPU_PLAN_FIELD_NUMBER: _ClassVar[int]
    BASE_GENERATION_FIELD_NUMBER: _ClassVar[int]
    REMOVED_INTENT_IDS_FIELD_NUMBER: _ClassVar[int]
    node_plan: _intent_pb2.NodePlan
    gpu_plan: _intent_pb2.GpuPlan
    base_generation: int
    removed_intent_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, node_plan: _Optional[_Union[_intent_pb2.NodePlan, _Mapping]] = ..., gpu_plan: _Optional[_Union[_intent_pb2.GpuPlan, _Mapping]] = ..., base_generation: _Optional[int] = ..., removed_intent_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class PreviewPlanRequest(_message.Message):
    __slots__ = ("disturbance", "arrival_rate_scale", "policy")
    DISTURBANCE_FIELD_NUMBER: _ClassVar[int]
    ARRIVAL_RATE_SCALE_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    disturbance: _telemetry_pb2.Disturbance
    arrival_rate_scale: float
    policy: str
    def __init__(self, disturbance: _Optional[_Union[_telemetry_pb2.Disturbance, _Mapping]] = ..., arrival_rate_scale: _Optional[float] = ..., policy: _Optional[str] = ...) -> None: ...

class PreviewPlanResponse(_message.Message):
    __slots__ = ("preview", "preview_gpu", "current")
    PREVIEW_FIELD_NUMBER: _ClassVar[int]
    PREVIEW_GPU_FIELD_NUMBER: _ClassVar[int]
    CURRENT_FIELD_NUMBER: _ClassVar[int]
    preview: _intent_pb2.NodePlan
    preview_gpu: _intent_pb2.GpuPlan
    current: _intent_pb2.NodePlan
    def __init__(self, preview: _Optional[_Union[_intent_pb2.NodePlan, _Mapping]] = ..., preview_gpu: _Optional[_Union[_intent_pb2.GpuPlan, _Mapping]] = ..., current: _Optional[_Union[_intent_pb2.NodePlan, _Mapping]] = ...) -> None: ...

class SetPolicyRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class SetPolicyResponse(_message.Message):
    __slots__ = ("previous", "active")
    PREVIOUS_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    previous: str
    active: str
    def __init__(self, previous: _Optional[str] = ..., active: _Optional[str] = ...) -> None: ...

class ListPoliciesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class PolicyInfo(_message.Message):
    __slots__ = ("name", "kind", "description")
    NAME_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    name: str
    kind: str
    description: str
    def __init__(self, name: _Optional[str] = ..., kind: _Optional[str] = ..., description: _Optional[str] = ...) -> None: ...

class ListPoliciesResponse(_message.Message):
    __slots__ = ("policies", "active")
    POLICIES_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    policies: _containers.RepeatedCompositeFieldContainer[PolicyInfo]
    active: str
    def __init__(self, policies: _Optional[_Iterable[_Union[PolicyInfo, _Mapping]]] = ..., active: _Optional[str] = ...) -> None: ...

class ReportTelemetryRequest(_message.Message):
    __slots__ = ("node", "gpu")
    NODE_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    node: _telemetry_pb2.NodeTelemetry
    gpu: _telemetry_pb2.GpuTelemetry
    def __init__(self, node: _Optional[_Union[_telemetry_pb2.NodeTelemetry, _Mapping]] = ..., gpu: _Optional[_Union[_telemetry_pb2.GpuTelemetry, _Mapping]] = ...) -> None: ...

class ReportTelemetryResponse(_message.Message):
    __slots__ = ("plan_generation",)
    PLAN_GENERATION_FIELD_NUMBER: _ClassVar[int]
    plan_generation: int
    def __init__(self, plan_generation: _Optional[int] = ...) -> None: ...
