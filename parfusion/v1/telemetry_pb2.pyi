import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Pressure(_message.Message):
    __slots__ = ("some_avg10", "full_avg10", "available")
    SOME_AVG10_FIELD_NUMBER: _ClassVar[int]
    FULL_AVG10_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    some_avg10: float
    full_avg10: float
    available: bool
    def __init__(self, some_avg10: _Optional[float] = ..., full_avg10: _Optional[float] = ..., available: _Optional[bool] = ...) -> None: ...

class LatencySummary(_message.Message):
    __slots__ = ("intent_id", "count", "p50_ms", "p95_ms", "p99_ms", "mean_ms", "deadline_misses", "service_mean_ms", "service_p99_ms", "window_count", "recent_service_ms", "sample_parallelism")
    INTENT_ID_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    P50_MS_FIELD_NUMBER: _ClassVar[int]
    P95_MS_FIELD_NUMBER: _ClassVar[int]
    P99_MS_FIELD_NUMBER: _ClassVar[int]
    MEAN_MS_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_MISSES_FIELD_NUMBER: _ClassVar[int]
    SERVICE_MEAN_MS_FIELD_NUMBER: _ClassVar[int]
    SERVICE_P99_MS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_COUNT_FIELD_NUMBER: _ClassVar[int]
    RECENT_SERVICE_MS_FIELD_NUMBER: _ClassVar[int]
    SAMPLE_PARALLELISM_FIELD_NUMBER: _ClassVar[int]
    intent_id: str
    count: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    mean_ms: float
    deadline_misses: int
    service_mean_ms: float
    service_p99_ms: float
    window_count: int
    recent_service_ms: _containers.RepeatedScalarFieldContainer[float]
    sample_parallelism: int
    def __init__(self, intent_id: _Optional[str] = ..., count: _Optional[int] = ..., p50_ms: _Optional[float] = ..., p95_ms: _Optional[float] = ..., p99_ms: _Optional[float] = ..., mean_ms: _Optional[float] = ..., deadline_misses: _Optional[int] = ..., service_mean_ms: _Optional[float] = ..., service_p99_ms: _Optional[float] = ..., window_count: _Optional[int] = ..., recent_service_ms: _Optional[_Iterable[float]] = ..., sample_parallelism: _Optional[int] = ...) -> None: ...

class PoolStatus(_message.Message):
    __slots__ = ("intent_id", "kind", "workers", "pids", "cpu_set", "nice", "queued", "items_per_s", "sched_policy")
    INTENT_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    PIDS_FIELD_NUMBER: _ClassVar[int]
    CPU_SET_FIELD_NUMBER: _ClassVar[int]
    NICE_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    ITEMS_PER_S_FIELD_NUMBER: _ClassVar[int]
    SCHED_POLICY_FIELD_NUMBER: _ClassVar[int]
    intent_id: str
    kind: str
    workers: int
    pids: _containers.RepeatedScalarFieldContainer[int]
    cpu_set: _containers.RepeatedScalarFieldContainer[int]
    nice: int
    queued: int
    items_per_s: float
    sched_policy: str
    def __init__(self, intent_id: _Optional[str] = ..., kind: _Optional[str] = ..., workers: _Optional[int] = ..., pids: _Optional[_Iterable[int]] = ..., cpu_set: _Optional[_Iterable[int]] = ..., nice: _Optional[int] = ..., queued: _Optional[int] = ..., items_per_s: _Optional[float] = ..., sched_policy: _Optional[str] = ...) -> None: ...

class Disturbance(_message.Message):
    __slots__ = ("cpu_pressure", "gpu_pressure", "network_pressure", "duration_s", "source")
    CPU_PRESSURE_FIELD_NUMBER: _ClassVar[int]
    GPU_PRESSURE_FIELD_NUMBER: _ClassVar[int]
    NETWORK_PRESSURE_FIELD_NUMBER: _ClassVar[int]
    DURATION_S_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    cpu_pressure: float
    gpu_pressure: float
    network_pressure: float
    duration_s: float
    source: str
    def __init__(self, cpu_pressure: _Optional[float] = ..., gpu_pressure: _Optional[float] = ..., network_pressure: _Optional[float] = ..., duration_s: _Optional[float] = ..., source: _Optional[str] = ...) -> None: ...

class NodeTelemetry(_message.Message):
    __slots__ = ("node", "observed_at", "backend", "cpu_percent_per_core", "load1", "memory_total_bytes", "memory_used_bytes", "cpu_pressure", "memory_pressure", "io_pressure", "latencies", "pools", "arena_cpus", "plan_generation", "active_disturbance", "disturbance_remaining_s")
    NODE_FIELD_NUMBER: _ClassVar[int]
    OBSERVED_AT_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    CPU_PERCENT_PER_CORE_FIELD_NUMBER: _ClassVar[int]
    LOAD1_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    CPU_PRESSURE_FIELD_NUMBER: _ClassVar[int]
    MEMORY_PRESSURE_FIELD_NUMBER: _ClassVar[int]
    IO_PRESSURE_FIELD_NUMBER: _ClassVar[int]
    LATENCIES_FIELD_NUMBER: _ClassVar[int]
    POOLS_FIELD_NUMBER: _ClassVar[int]
    ARENA_CPUS_FIELD_NUMBER: _ClassVar[int]
    PLAN_GENERATION_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_DISTURBANCE_FIELD_NUMBER: _ClassVar[int]
    DISTURBANCE_REMAINING_S_FIELD_NUMBER: _ClassVar[int]
    node: str
    observed_at: _timestamp_pb2.Timestamp
    backend: str
    cpu_percent_per_core: _containers.RepeatedScalarFieldContainer[float]
    load1: float
    memory_total_bytes: int
    memory_used_bytes: int
    cpu_pressure: Pressure
    memory_pressure: Pressure
    io_pressure: Pressure
    latencies: _containers.RepeatedCompositeFieldContainer[LatencySummary]
    pools: _containers.RepeatedCompositeFieldContainer[PoolStatus]
    arena_cpus: _containers.RepeatedScalarFieldContainer[int]
    plan_generation: int
    active_disturbance: Disturbance
    disturbance_remaining_s: float
    def __init__(self, node: _Optional[str] = ..., observed_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., backend: _Optional[str] = ..., cpu_percent_per_core: _Optional[_Iterable[float]] = ..., load1: _Optional[float] = ..., memory_total_bytes: _Optional[int] = ..., memory_used_bytes: _Optional[int] = ..., cpu_pressure: _Optional[_Union[Pressure, _Mapping]] = ..., memory_pressure: _Optional[_Union[Pressure, _Mapping]] = ..., io_pressure: _Optional[_Union[Pressure, _Mapping]] = ..., latencies: _Optional[_Iterable[_Union[LatencySummary, _Mapping]]] = ..., pools: _Optional[_Iterable[_Union[PoolStatus, _Mapping]]] = ..., arena_cpus: _Optional[_Iterable[int]] = ..., plan_generation: _Optional[int] = ..., active_disturbance: _Optional[_Union[Disturbance, _Mapping]] = ..., disturbance_remaining_s: _Optional[float] = ...) -> None: ...

class GpuProcess(_message.Message):
    __slots__ = ("pid", "used_memory_bytes")
    PID_FIELD_NUMBER: _ClassVar[int]
    USED_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    pid: int
    used_memory_bytes: int
    def __init__(self, pid: _Optional[int] = ..., used_memory_bytes: _Optional[int] = ...) -> None: ...

class GpuDevice(_message.Message):
    __slots__ = ("index", "name", "uuid", "utilization_percent", "memory_total_bytes", "memory_used_bytes", "power_watts", "temperature_c", "processes", "idle")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    UTILIZATION_PERCENT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    POWER_WATTS_FIELD_NUMBER: _ClassVar[int]
    TEMPERATURE_C_FIELD_NUMBER: _ClassVar[int]
    PROCESSES_FIELD_NUMBER: _ClassVar[int]
    IDLE_FIELD_NUMBER: _ClassVar[int]
    index: int
    name: str
    uuid: str
    utilization_percent: float
    memory_total_bytes: int
    memory_used_bytes: int
    power_watts: float
    temperature_c: float
    processes: _containers.RepeatedCompositeFieldContainer[GpuProcess]
    idle: bool
    def __init__(self, index: _Optional[int] = ..., name: _Optional[str] = ..., uuid: _Optional[str] = ..., utilization_percent: _Optional[float] = ..., memory_total_bytes: _Optional[int] = ..., memory_used_bytes: _Optional[int] = ..., power_watts: _Optional[float] = ..., temperature_c: _Optional[float] = ..., processes: _Optional[_Iterable[_Union[GpuProcess, _Mapping]]] = ..., idle: _Optional[bool] = ...) -> None: ...

class LaneStatus(_message.Message):
    __slots__ = ("name", "configured_indexes", "present_indexes", "available", "reason", "allocated_share_percent")
    NAME_FIELD_NUMBER: _ClassVar[int]
    CONFIGURED_INDEXES_FIELD_NUMBER: _ClassVar[int]
    PRESENT_INDEXES_FIELD_NUMBER: _ClassVar[int]
    AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ALLOCATED_SHARE_PERCENT_FIELD_NUMBER: _ClassVar[int]
    name: str
    configured_indexes: _containers.RepeatedScalarFieldContainer[int]
    present_indexes: _containers.RepeatedScalarFieldContainer[int]
    available: bool
    reason: str
    allocated_share_percent: float
    def __init__(self, name: _Optional[str] = ..., configured_indexes: _Optional[_Iterable[int]] = ..., present_indexes: _Optional[_Iterable[int]] = ..., available: _Optional[bool] = ..., reason: _Optional[str] = ..., allocated_share_percent: _Optional[float] = ...) -> None: ...

class GpuTelemetry(_message.Message):
    __slots__ = ("observed_at", "nvml_available", "nvml_error", "driver_version", "devices", "lanes", "backend", "gpu_pressure")
    OBSERVED_AT_FIELD_NUMBER: _ClassVar[int]
    NVML_AVAILABLE_FIELD_NUMBER: _ClassVar[int]
    NVML_ERROR_FIELD_NUMBER: _ClassVar[int]
    DRIVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    LANES_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    GPU_PRESSURE_FIELD_NUMBER: _ClassVar[int]
    observed_at: _timestamp_pb2.Timestamp
    nvml_available: bool
    nvml_error: str
    driver_version: str
    devices: _containers.RepeatedCompositeFieldContainer[GpuDevice]
    lanes: _containers.RepeatedCompositeFieldContainer[LaneStatus]
    backend: str
    gpu_pressure: float
    def __init__(self, observed_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., nvml_available: _Optional[bool] = ..., nvml_error: _Optional[str] = ..., driver_version: _Optional[str] = ..., devices: _Optional[_Iterable[_Union[GpuDevice, _Mapping]]] = ..., lanes: _Optional[_Iterable[_Union[LaneStatus, _Mapping]]] = ..., backend: _Optional[str] = ..., gpu_pressure: _Optional[float] = ...) -> None: ...
