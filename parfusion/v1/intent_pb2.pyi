import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class WorkloadClass(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WORKLOAD_CLASS_UNSPECIFIED: _ClassVar[WorkloadClass]
    WORKLOAD_CLASS_ONLINE: _ClassVar[WorkloadClass]
    WORKLOAD_CLASS_BATCH: _ClassVar[WorkloadClass]
    WORKLOAD_CLASS_ROBOT: _ClassVar[WorkloadClass]
    WORKLOAD_CLASS_URGENT: _ClassVar[WorkloadClass]

class DegradationLevel(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DEGRADATION_LEVEL_UNSPECIFIED: _ClassVar[DegradationLevel]
    DEGRADATION_LEVEL_NORMAL: _ClassVar[DegradationLevel]
    DEGRADATION_LEVEL_FP16: _ClassVar[DegradationLevel]
    DEGRADATION_LEVEL_INT8: _ClassVar[DegradationLevel]

class AllocationState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ALLOCATION_STATE_UNSPECIFIED: _ClassVar[AllocationState]
    ALLOCATION_STATE_ADMITTED: _ClassVar[AllocationState]
    ALLOCATION_STATE_THROTTLED: _ClassVar[AllocationState]
    ALLOCATION_STATE_DEGRADED: _ClassVar[AllocationState]
    ALLOCATION_STATE_PREEMPTED: _ClassVar[AllocationState]
WORKLOAD_CLASS_UNSPECIFIED: WorkloadClass
WORKLOAD_CLASS_ONLINE: WorkloadClass
WORKLOAD_CLASS_BATCH: WorkloadClass
WORKLOAD_CLASS_ROBOT: WorkloadClass
WORKLOAD_CLASS_URGENT: WorkloadClass
DEGRADATION_LEVEL_UNSPECIFIED: DegradationLevel
DEGRADATION_LEVEL_NORMAL: DegradationLevel
DEGRADATION_LEVEL_FP16: DegradationLevel
DEGRADATION_LEVEL_INT8: DegradationLevel
ALLOCATION_STATE_UNSPECIFIED: AllocationState
ALLOCATION_STATE_ADMITTED: AllocationState
ALLOCATION_STATE_THROTTLED: AllocationState
ALLOCATION_STATE_DEGRADED: AllocationState
ALLOCATION_STATE_PREEMPTED: AllocationState

class Slo(_message.Message):
    __slots__ = ("deadline_ms", "target_percentile", "max_miss_ratio")
    DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    TARGET_PERCENTILE_FIELD_NUMBER: _ClassVar[int]
    MAX_MISS_RATIO_FIELD_NUMBER: _ClassVar[int]
    deadline_ms: float
    target_percentile: float
    max_miss_ratio: float
    def __init__(self, deadline_ms: _Optional[float] = ..., target_percentile: _Optional[float] = ..., max_miss_ratio: _Optional[float] = ...) -> None: ...

class Parallelism(_message.Message):
    __slots__ = ("min", "max", "preferred")
    MIN_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    PREFERRED_FIELD_NUMBER: _ClassVar[int]
    min: int
    max: int
    preferred: int
    def __init__(self, min: _Optional[int] = ..., max: _Optional[int] = ..., preferred: _Optional[int] = ...) -> None: ...

class Speedup(_message.Message):
    __slots__ = ("parallel_fraction", "base_service_ms")
    PARALLEL_FRACTION_FIELD_NUMBER: _ClassVar[int]
    BASE_SERVICE_MS_FIELD_NUMBER: _ClassVar[int]
    parallel_fraction: float
    base_service_ms: float
    def __init__(self, parallel_fraction: _Optional[float] = ..., base_service_ms: _Optional[float] = ...) -> None: ...

class Demand(_message.Message):
    __slots__ = ("arrival_rate_per_s", "work_units")
    ARRIVAL_RATE_PER_S_FIELD_NUMBER: _ClassVar[int]
    WORK_UNITS_FIELD_NUMBER: _ClassVar[int]
    arrival_rate_per_s: float
    work_units: float
    def __init__(self, arrival_rate_per_s: _Optional[float] = ..., work_units: _Optional[float] = ...) -> None: ...

class GpuIntent(_message.Message):
    __slots__ = ("lane", "share", "memory_bytes", "stream_priority_hint", "concurrency")
    LANE_FIELD_NUMBER: _ClassVar[int]
    SHARE_FIELD_NUMBER: _ClassVar[int]
    MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    STREAM_PRIORITY_HINT_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    lane: str
    share: float
    memory_bytes: int
    stream_priority_hint: int
    concurrency: int
    def __init__(self, lane: _Optional[str] = ..., share: _Optional[float] = ..., memory_bytes: _Optional[int] = ..., stream_priority_hint: _Optional[int] = ..., concurrency: _Optional[int] = ...) -> None: ...

class ResourceIntent(_message.Message):
    __slots__ = ("id", "name", "workload_class", "priority", "slo", "parallelism", "speedup", "demand", "gpu", "degradation", "preemptible", "elastic", "node", "labels", "created_at")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_CLASS_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    SLO_FIELD_NUMBER: _ClassVar[int]
    PARALLELISM_FIELD_NUMBER: _ClassVar[int]
    SPEEDUP_FIELD_NUMBER: _ClassVar[int]
    DEMAND_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    DEGRADATION_FIELD_NUMBER: _ClassVar[int]
    PREEMPTIBLE_FIELD_NUMBER: _ClassVar[int]
    ELASTIC_FIELD_NUMBER: _ClassVar[int]
    NODE_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    id: str
    name: str
    workload_class: WorkloadClass
    priority: int
    slo: Slo
    parallelism: Parallelism
    speedup: Speedup
    demand: Demand
    gpu: GpuIntent
    degradation: _containers.RepeatedScalarFieldContainer[DegradationLevel]
    preemptible: bool
    elastic: bool
    node: str
    labels: _containers.ScalarMap[str, str]
    created_at: _timestamp_pb2.Timestamp
    def __init__(self, id: _Optional[str] = ..., name: _Optional[str] = ..., workload_class: _Optional[_Union[WorkloadClass, str]] = ..., priority: _Optional[int] = ..., slo: _Optional[_Union[Slo, _Mapping]] = ..., parallelism: _Optional[_Union[Parallelism, _Mapping]] = ..., speedup: _Optional[_Union[Speedup, _Mapping]] = ..., demand: _Optional[_Union[Demand, _Mapping]] = ..., gpu: _Optional[_Union[GpuIntent, _Mapping]] = ..., degradation: _Optional[_Iterable[_Union[DegradationLevel, str]]] = ..., preemptible: _Optional[bool] = ..., elastic: _Optional[bool] = ..., node: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class CgroupPlan(_message.Message):
    __slots__ = ("path", "cpu_weight", "cpu_max", "cpuset_cpus")
    PATH_FIELD_NUMBER: _ClassVar[int]
    CPU_WEIGHT_FIELD_NUMBER: _ClassVar[int]
    CPU_MAX_FIELD_NUMBER: _ClassVar[int]
    CPUSET_CPUS_FIELD_NUMBER: _ClassVar[int]
    path: str
    cpu_weight: int
    cpu_max: str
    cpuset_cpus: str
    def __init__(self, path: _Optional[str] = ..., cpu_weight: _Optional[int] = ..., cpu_max: _Optional[str] = ..., cpuset_cpus: _Optional[str] = ...) -> None: ...

class Allocation(_message.Message):
    __slots__ = ("intent_id", "intent_name", "workload_class", "workers", "cpu_set", "nice", "cgroup", "gpu_lane", "gpu_indexes", "gpu_share_percent", "stream_priority", "gpu_concurrency", "degradation", "predicted_p99_ms", "slack_ms", "deadline_risk", "nmu", "state", "reason", "preempted_units", "sched_policy", "base_service_ms", "parallel_fraction", "arrival_rate_per_s", "deadline_ms", "units")
    INTENT_ID_FIELD_NUMBER: _ClassVar[int]
    INTENT_NAME_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_CLASS_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    CPU_SET_FIELD_NUMBER: _ClassVar[int]
    NICE_FIELD_NUMBER: _ClassVar[int]
    CGROUP_FIELD_NUMBER: _ClassVar[int]
    GPU_LANE_FIELD_NUMBER: _ClassVar[int]
    GPU_INDEXES_FIELD_NUMBER: _ClassVar[int]
    GPU_SHARE_PERCENT_FIELD_NUMBER: _ClassVar[int]
    STREAM_PRIORITY_FIELD_NUMBER: _ClassVar[int]
    GPU_CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    DEGRADATION_FIELD_NUMBER: _ClassVar[int]
    PREDICTED_P99_MS_FIELD_NUMBER: _ClassVar[int]
    SLACK_MS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_RISK_FIELD_NUMBER: _ClassVar[int]
    NMU_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    PREEMPTED_UNITS_FIELD_NUMBER: _ClassVar[int]
    SCHED_POLICY_FIELD_NUMBER: _ClassVar[int]
    BASE_SERVICE_MS_FIELD_NUMBER: _ClassVar[int]
    PARALLEL_FRACTION_FIELD_NUMBER: _ClassVar[int]
    ARRIVAL_RATE_PER_S_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_MS_FIELD_NUMBER: _ClassVar[int]
    UNITS_FIELD_NUMBER: _ClassVar[int]
    intent_id: str
    intent_name: str
    workload_class: WorkloadClass
    workers: int
    cpu_set: _containers.RepeatedScalarFieldContainer[int]
    nice: int
    cgroup: CgroupPlan
    gpu_lane: str
    gpu_indexes: _containers.RepeatedScalarFieldContainer[int]
    gpu_share_percent: float
    stream_priority: int
    gpu_concurrency: int
    degradation: DegradationLevel
    predicted_p99_ms: float
    slack_ms: float
    deadline_risk: float
    nmu: float
    state: AllocationState
    reason: str
    preempted_units: int
    sched_policy: str
    base_service_ms: float
    parallel_fraction: float
    arrival_rate_per_s: float
    deadline_ms: float
    units: int
    def __init__(self, intent_id: _Optional[str] = ..., intent_name: _Optional[str] = ..., workload_class: _Optional[_Union[WorkloadClass, str]] = ..., workers: _Optional[int] = ..., cpu_set: _Optional[_Iterable[int]] = ..., nice: _Optional[int] = ..., cgroup: _Optional[_Union[CgroupPlan, _Mapping]] = ..., gpu_lane: _Optional[str] = ..., gpu_indexes: _Optional[_Iterable[int]] = ..., gpu_share_percent: _Optional[float] = ..., stream_priority: _Optional[int] = ..., gpu_concurrency: _Optional[int] = ..., degradation: _Optional[_Union[DegradationLevel, str]] = ..., predicted_p99_ms: _Optional[float] = ..., slack_ms: _Optional[float] = ..., deadline_risk: _Optional[float] = ..., nmu: _Optional[float] = ..., state: _Optional[_Union[AllocationState, str]] = ..., reason: _Optional[str] = ..., preempted_units: _Optional[int] = ..., sched_policy: _Optional[str] = ..., base_service_ms: _Optional[float] = ..., parallel_fraction: _Optional[float] = ..., arrival_rate_per_s: _Optional[float] = ..., deadline_ms: _Optional[float] = ..., units: _Optional[int] = ...) -> None: ...

class NodePlan(_message.Message):
    __slots__ = ("node", "generation", "policy", "created_at", "cpu_units", "allocations", "contention", "node_stale", "decision_ms")
    NODE_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    CPU_UNITS_FIELD_NUMBER: _ClassVar[int]
    ALLOCATIONS_FIELD_NUMBER: _ClassVar[int]
    CONTENTION_FIELD_NUMBER: _ClassVar[int]
    NODE_STALE_FIELD_NUMBER: _ClassVar[int]
    DECISION_MS_FIELD_NUMBER: _ClassVar[int]
    node: str
    generation: int
    policy: str
    created_at: _timestamp_pb2.Timestamp
    cpu_units: int
    allocations: _containers.RepeatedCompositeFieldContainer[Allocation]
    contention: float
    node_stale: bool
    decision_ms: float
    def __init__(self, node: _Optional[str] = ..., generation: _Optional[int] = ..., policy: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., cpu_units: _Optional[int] = ..., allocations: _Optional[_Iterable[_Union[Allocation, _Mapping]]] = ..., contention: _Optional[float] = ..., node_stale: _Optional[bool] = ..., decision_ms: _Optional[float] = ...) -> None: ...

class GpuAssignment(_message.Message):
    __slots__ = ("intent_id", "intent_name", "lane", "gpu_indexes", "share_percent", "stream_priority", "concurrency", "memory_limit_bytes", "degradation")
    INTENT_ID_FIELD_NUMBER: _ClassVar[int]
    INTENT_NAME_FIELD_NUMBER: _ClassVar[int]
    LANE_FIELD_NUMBER: _ClassVar[int]
    GPU_INDEXES_FIELD_NUMBER: _ClassVar[int]
    SHARE_PERCENT_FIELD_NUMBER: _ClassVar[int]
    STREAM_PRIORITY_FIELD_NUMBER: _ClassVar[int]
    CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    MEMORY_LIMIT_BYTES_FIELD_NUMBER: _ClassVar[int]
    DEGRADATION_FIELD_NUMBER: _ClassVar[int]
    intent_id: str
    intent_name: str
    lane: str
    gpu_indexes: _containers.RepeatedScalarFieldContainer[int]
    share_percent: float
    stream_priority: int
    concurrency: int
    memory_limit_bytes: int
    degradation: DegradationLevel
    def __init__(self, intent_id: _Optional[str] = ..., intent_name: _Optional[str] = ..., lane: _Optional[str] = ..., gpu_indexes: _Optional[_Iterable[int]] = ..., share_percent: _Optional[float] = ..., stream_priority: _Optional[int] = ..., concurrency: _Optional[int] = ..., memory_limit_bytes: _Optional[int] = ..., degradation: _Optional[_Union[DegradationLevel, str]] = ...) -> None: ...

class GpuPlan(_message.Message):
    __slots__ = ("node", "generation", "policy", "created_at", "assignments", "gpu_intent_enabled")
    NODE_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENTS_FIELD_NUMBER: _ClassVar[int]
    GPU_INTENT_ENABLED_FIELD_NUMBER: _ClassVar[int]
    node: str
    generation: int
    policy: str
    created_at: _timestamp_pb2.Timestamp
    assignments: _containers.RepeatedCompositeFieldContainer[GpuAssignment]
    gpu_intent_enabled: bool
    def __init__(self, node: _Optional[str] = ..., generation: _Optional[int] = ..., policy: _Optional[str] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., assignments: _Optional[_Iterable[_Union[GpuAssignment, _Mapping]]] = ..., gpu_intent_enabled: _Optional[bool] = ...) -> None: ...
