"""`parfusion check-env` (scripts/check_env.sh): what this machine offers PARFusion, read-only.

Nothing is changed: it reads /proc and /sys, asks NVML, and probes the service ports.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import sys
from pathlib import Path
from typing import Any

import psutil

from parfusion.services import SERVICES


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def _port_in_use(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


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
    controllers = _read("/sys/fs/cgroup/cgroup.controllers")
    rows.append(
        (
            "cgroup v2",
            f"unified hierarchy, controllers: {controllers or '(none)'}"
            if controllers is not None
            else "not mounted (plans stay dry-run)",
            controllers is not None,
        )
    )
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
    busy = [f"{s.name}:{p}" for s in SERVICES for p in s.ports if _port_in_use(p)]
    rows.append(
        ("ports", f"in use: {', '.join(busy)}" if busy else "all PARFusion ports free", not busy)
    )
    return rows


def run(_args: argparse.Namespace) -> int:
    rows = checks()
    width = max(len(r[0]) for r in rows)
    for what, finding, ok in rows:
        print(f"  {'ok ' if ok else '-- '} {what:<{width}}  {finding}")
    return 0 if rows[0][2] else 1


def register(commands: Any) -> None:
    commands.command(("check-env",), "what this machine offers PARFusion (read-only)", None, run)
