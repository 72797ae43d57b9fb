"""`parfusion check-env` (scripts/check_env.sh): what this machine offers PARFusion, read-only.

Nothing is changed: it reads /proc and /sys, asks NVML, and probes the ports this
configuration will use (parfusion.endpoints: the same resolution as `parfusion up`, so
PARFUSION_ALLOCATOR_PORT=51051 is checked as 51051). cgroup v2 is found by the node agent's own
detection (services.nodeagent.cgroupfs.detect), so both report the same mount; the malloc row
comes from the services' own choice (services.common.malloc.planned_malloc).
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psutil

from parfusion.endpoints import Endpoint, endpoints
from services.common.malloc import planned_malloc
from services.nodeagent.cgroupfs import CgroupDetection, detect


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def _port_in_use(host: str, port: int) -> bool:
    try:
        infos = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)
    except OSError:
        return False
    family, kind, proto, _, addr = infos[0]
    with socket.socket(family, kind, proto) as s:
        s.settimeout(0.2)
        return s.connect_ex(addr) == 0


def cgroup_row(found: CgroupDetection) -> tuple[str, str, bool]:
    """What the node agent will see: the cgroup2 mount (unified or hybrid) and its controllers."""
    if not found.unified:
        return ("cgroup v2", "no cgroup2 mount (plans stay dry-run)", False)
    layout = "unified" if found.mount_point == "/sys/fs/cgroup" else "hybrid (v1 beside it)"
    controllers = " ".join(found.controllers) or "(none)"
    return ("cgroup v2", f"{layout} at {found.mount_point}, controllers: {controllers}", True)


def ports_row(where: Mapping[str, Endpoint]) -> tuple[str, str, bool]:
    """Every port this configuration binds, each probed on the address its peers dial."""
    planned = [(name, ep.host, p) for name, ep in where.items() for p in ep.ports]
    busy = [f"{name}:{p}" for name, host, p in planned if _port_in_use(host, p)]
    listed = ", ".join(f"{name}:{p}" for name, _, p in planned)
    if busy:
        return ("ports", f"in use: {', '.join(busy)} (of {listed})", False)
    return ("ports", f"free: {listed}", True)


def malloc_row(environ: Mapping[str, str] | None = None) -> tuple[str, str, bool]:
    """What the allocator and the node agent will run on (services/common/malloc.py)."""
    try:
        malloc, detail = planned_malloc(environ)
    except SystemExit as exc:  # an unknown PARFUSION_MALLOC: the services refuse it too
        return "malloc", str(exc), False
    if malloc == "jemalloc":
        return "malloc", f"jemalloc ({detail}) for the allocator and the node agent", True
    return "malloc", f"CPython's allocator: {detail}", False


def _nvml() -> str:
    try:
        import pynvml
    except ImportError:
        return "nvidia-ml-py not installed"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return f"unavailable ({exc}); GPU list will be empty"
    try:
        count = pynvml.nvmlDeviceGetCount()
        return f"driver {pynvml.nvmlSystemGetDriverVersion()}, {count} GPU(s)"
    finally:
        pynvml.nvmlShutdown()


def checks() -> list[tuple[str, str, bool]]:
    """(what, finding, ok) rows; ok=False marks what limits PARFusion, not always an error."""
    rows: list[tuple[str, str, bool]] = []
    py_ok = sys.version_info >= (3, 11)
    rows.append(("python", sys.version.split()[0], py_ok))
    rows.append(
        ("cpu cores", f"{os.cpu_count()} logical, affinity {len(os.sched_getaffinity(0))}", True)
    )
    mem = psutil.virtual_memory()
    rows.append(
        (
            "memory",
            f"{mem.total / 2**30:.1f} GiB total, {mem.available / 2**30:.1f} GiB available",
            True,
        )
    )
    rows.append(cgroup_row(detect()))
    rows.append(malloc_row())
    psi = _read("/proc/pressure/cpu")
    rows.append(("PSI", "available" if psi else "not available (/proc/pressure)", bool(psi)))
    autogroup = _read("/proc/sys/kernel/sched_autogroup_enabled")
    rows.append(
        (
            "autogroup",
            f"sched_autogroup_enabled={autogroup} (nice only ranks within one session; pools stay in the agent's)"
            if autogroup is not None
            else "not present",
            True,
        )
    )
    nvml = _nvml()
    rows.append(("NVML", nvml, "GPU(s)" in nvml))
    rows.append(
        (
            "GPU load",
            "enabled"
            if os.environ.get("PARFUSION_ENABLE_GPU_LOAD") == "1"
            else "off (PARFUSION_ENABLE_GPU_LOAD unset)",
            True,
        )
    )
    for tool in ("chromium", "docker", "docker-compose", "grpcurl"):
        found = shutil.which(tool) or (
            str(Path(sys.executable).with_name(tool))
            if Path(sys.executable).with_name(tool).exists()
            else None
        )
        rows.append((tool, found or "not found", found is not None))
    docker_sock = Path("/var/run/docker.sock").exists()
    rows.append(
        (
            "docker engine",
            "socket present" if docker_sock else "no engine: use `make run` (embedded launcher)",
            docker_sock,
        )
    )
    rows.append(ports_row({n: ep for n, ep in endpoints().items() if ep.spec.exists()}))
    return rows


def run(_args: argparse.Namespace) -> int:
    rows = checks()
    width = max(len(r[0]) for r in rows)
    for what, finding, ok in rows:
        print(f"  {'ok ' if ok else '-- '} {what:<{width}}  {finding}")
    return 0 if rows[0][2] else 1


def register(commands: Any) -> None:
    commands.command(("check-env",), "what this machine offers PARFusion (read-only)", None, run)
