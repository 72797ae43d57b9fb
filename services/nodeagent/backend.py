"""The node backend contract and its registry: what the agent's gRPC surface drives.

A backend turns a NodePlan into something running (``real``: PARFusion-owned worker pools on
the arena cores; ``modeled``: a safe simulated node) and reports what really happened as a
NodeTelemetry. The servicer in server.py only converts requests and checks ownership; which
backend runs is configuration (``nodeagent.backend``), chosen once at start-up.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from parfusion.v1 import intent_pb2, nodeagent_pb2, telemetry_pb2
from services.common.config import ConfigError, ServiceSettings
from services.common.errors import InvalidArgument
from services.common.registry import choose, lazy

# Plan generations are uint64 on the wire; the agent reports generation + 1 for a plan sent
# without one, so it accepts at most 2^63 - 1 and wraps its own count below that: a generation
# it accepted can never make a later telemetry reply overflow.
MAX_PLAN_GENERATION = 2**63 - 1


def check_generation(given: int) -> None:
    """Refuse a plan generation the agent could not count past (before anything is applied)."""
    if given > MAX_PLAN_GENERATION:
        raise InvalidArgument(
            f"{given} is above the largest plan generation {MAX_PLAN_GENERATION}",
            field="plan.generation",
        )


def next_generation(given: int, current: int) -> int:
    """The generation a backend records for an applied plan (``given``, or one past ``current``)."""
    check_generation(given)
    return given or current % MAX_PLAN_GENERATION + 1


@dataclass(frozen=True)
class BackendOptions:
    """Everything a backend may need, from the nodeagent section of the config."""

    node_name: str = "node-0"
    run_dir: Path = Path("run")
    arena_cores: int = 0  # 0 = all cores; otherwise the k most idle cores measured at start
    max_workers: int = 8  # cap on worker processes across all pools
    max_load_fraction: float = 0.7  # cap on synthetic CPU load, fraction of the arena
    cgroup_mode: str = "dry-run"  # "dry-run" or "delegated"
    cgroup_delegated_path: str = ""
    allow_real_stress: bool = False
    cgroup_root: Path | None = None  # cgroup v2 mount to inspect; None = detect from mountinfo
    default_service_ms: float = 12.0  # online kernel size when the plan carries none
    idle_sample_s: float = 0.3  # how long the arena measurement samples per-core idle time
    latency_window_s: float = 10.0  # the real pools' percentile window (latency.LatencyBook)

    @classmethod
    def from_settings(cls, settings: ServiceSettings) -> BackendOptions:
        mode = settings.get_str("cgroup_mode", "dry-run")
        if mode not in ("dry-run", "delegated"):
            raise ConfigError(f"nodeagent.cgroup_mode: expected dry-run or delegated, got {mode!r}")
        fraction = settings.get_float("max_load_fraction", 0.7)
        if not 0.0 < fraction <= 1.0:
            raise ConfigError(f"nodeagent.max_load_fraction: expected (0, 1], got {fraction}")
        window = settings.get_float("latency_window_s", 10.0)
        if not 0.5 <= window <= 3600.0:
            raise ConfigError(f"nodeagent.latency_window_s: expected 0.5 to 3600 s, got {window}")
        return cls(
            node_name=settings.node_name,
            run_dir=settings.run_dir,
            arena_cores=max(0, settings.get_int("arena_cores", 0)),
            max_workers=max(1, settings.get_int("max_workers", 8)),
            max_load_fraction=fraction,
            cgroup_mode=mode,
            cgroup_delegated_path=settings.get_str("cgroup_delegated_path", ""),
            allow_real_stress=settings.get_bool("allow_real_stress", False),
            default_service_ms=settings.get_float("default_service_ms", 12.0),
            latency_window_s=window,
        )


class NodeBackend(Protocol):
    """One node's enforcement and observation.

    Contract: ``apply`` is all-or-nothing (a plan it cannot honour raises a DomainError and
    leaves the previous plan running); ``telemetry`` never blocks for long (it is pulled every
    allocator tick) and drains ``recent_service_ms`` so each sample is reported once;
    ``sampled_only`` leaves out the latency summaries of intents with no new samples and
    ``changed_pools_only`` may leave out pools not changed since the last draining read (never
    one that did): the loop's delta telemetry sends no others; ``pool_ids`` names every pool;
    ``owned_pids`` lists exactly the processes this backend started (ControlProcess refuses
    every other PID); ``stop`` ends every such process.
    """

    name: str

    def apply(self, plan: intent_pb2.NodePlan) -> list[nodeagent_pb2.AppliedAllocation]: ...

    def cgroup_plan_path(self) -> str: ...

    def telemetry(
        self, drain: bool = True, sampled_only: bool = False, changed_pools_only: bool = False
    ) -> telemetry_pb2.NodeTelemetry: ...

    def inject_disturbance(self, disturbance: telemetry_pb2.Disturbance) -> tuple[bool, float]: ...

    def pool_ids(self) -> set[str]: ...

    def owned_pids(self) -> set[int]: ...

    def stop(self) -> None: ...


BackendFactory = Callable[[BackendOptions], NodeBackend]


BACKENDS: dict[str, BackendFactory] = {
    "real": lazy("services.nodeagent.real:RealBackend"),
    "modeled": lazy("services.nodeagent.modeled:served"),
}


def create_backend(name: str, options: BackendOptions) -> NodeBackend:
    """The configured backend; an unknown name is a ConfigError listing the known ones."""
    backend: NodeBackend = choose(BACKENDS, name, "nodeagent.backend")(options)
    return backend
