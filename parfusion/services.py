"""The one service table: the embedded launcher, compose.yaml and deploy/ are all derived from it."""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ServiceSpec:
    name: str
    protocol: str  # "grpc" or "http"
    port: int
    metrics_port: (
        int | None
    )  # gRPC services serve Prometheus on their own port; HTTP ones at /metrics
    depends_on: tuple[str, ...] = ()
    description: str = ""
    # What the service keeps under run/ across restarts; empty = nothing (stateless).
    # compose.yaml gives each stateful service its own named volume there.
    state: str = ""

    @property
    def module(self) -> str:
        return f"services.{self.name}"

    def command(self, host: str = "127.0.0.1") -> list[str]:
        return ["python", "-m", self.module, "--host", host]

    def healthcheck(self, host: str = "127.0.0.1") -> list[str]:
        if self.protocol == "grpc":
            return ["python", "-m", "parfusion.healthcheck", "grpc", f"{host}:{self.port}"]
        return [
            "python",
            "-m",
            "parfusion.healthcheck",
            "http",
            f"http://{host}:{self.port}/healthz",
        ]

    @property
    def ports(self) -> tuple[int, ...]:
        return (self.port,) if self.metrics_port is None else (self.port, self.metrics_port)

    @property
    def url(self) -> str:
        return (
            f"127.0.0.1:{self.port}" if self.protocol == "grpc" else f"http://127.0.0.1:{self.port}"
        )

    def exists(self) -> bool:
        """True once the service's package has a __main__ (services arrive one issue at a time)."""
        return importlib.util.find_spec(f"{self.module}.__main__") is not None


SERVICES: tuple[ServiceSpec, ...] = (
    ServiceSpec(
        "allocator",
        "grpc",
        50051,
        19101,
        (),
        "intent store, predictor, D-MUG, node loop",
        state="the intent store (SQLite, allocator.db)",
    ),
    ServiceSpec(
        "nodeagent",
        "grpc",
        50052,
        19102,
        ("allocator",),
        "worker pools, affinity/nice, cgroup v2, node telemetry",
        state="the cgroup plan record of the real backend (nodeagent/)",
    ),
    ServiceSpec(
        "gpulane",
        "grpc",
        50053,
        19103,
        ("allocator",),
        "GPU lanes, shares, stream priority, MPS/MIG previews, NVML",
        state="the GPU plan records (gpulane/plans.jsonl)",
    ),
    ServiceSpec(
        "extender",
        "http",
        18082,
        None,
        ("allocator",),
        "kube-scheduler extender /filter /prioritize /bind",
    ),
    ServiceSpec(
        "bridge",
        "http",
        18083,
        None,
        ("allocator",),
        "robot missions, safe-point preemption, urgent events",
        state="mission checkpoints (bridge/checkpoint.json)",
    ),
    ServiceSpec(
        "dashboard",
        "http",
        18080,
        None,
        ("allocator", "nodeagent", "gpulane", "bridge"),
        "HTMX cockpit",
    ),
)

BY_NAME = {s.name: s for s in SERVICES}


def available_services() -> list[ServiceSpec]:
    return [s for s in SERVICES if s.exists()]


_LOOPBACK_REF = re.compile(r"(?P<scheme>https?://)?127\.0\.0\.1:(?P<port>\d+)")


@dataclass(frozen=True)
class AddressReference:
    """A config value that points at another service (allocator.nodeagent_address, ...)."""

    section: str
    key: str
    value: str
    service: str

    def rewrite(self, host: str, port: int | None = None) -> str:
        target = BY_NAME[self.service]
        return _LOOPBACK_REF.sub(
            lambda m: f"{m.group('scheme') or ''}{host}:{port or target.port}", self.value
        )


def address_references(doc: Mapping[str, Any]) -> list[AddressReference]:
    """Every config value of the form [http://]127.0.0.1:<a service's default port>."""
    by_port = {s.port: s.name for s in SERVICES}
    refs: list[AddressReference] = []
    for section, values in doc.items():
        if not isinstance(values, dict):
            continue
        for key, value in values.items():
            if key in {"port", "metrics_port"} or not isinstance(value, str):
                continue
            m = _LOOPBACK_REF.fullmatch(value.strip())
            if m and int(m.group("port")) in by_port:
                refs.append(AddressReference(section, key, value, by_port[int(m.group("port"))]))
    return refs


def env_key(section: str, key: str) -> str:
    return f"PARFUSION_{section.upper()}_{key.upper()}"
