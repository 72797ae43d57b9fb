"""check-env reads what the services will use: their configured ports and the agent's cgroup view."""

from __future__ import annotations

import ctypes.util
import socket
from pathlib import Path

from parfusion import envcheck
from parfusion.endpoints import endpoints
from services.nodeagent.cgroupfs import detect
from tests.conftest import free_port


def _mountinfo(tmp_path: Path, cgroup2_at: Path | None) -> Path:
    lines = ["31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755"]
    lines.append("32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu")
    if cgroup2_at is not None:
        lines.append(f"41 31 0:38 / {cgroup2_at} rw,relatime - cgroup2 cgroup2 rw")
    path = tmp_path / "mountinfo"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_hybrid_layout_is_cgroup_v2_as_the_agent_sees_it(tmp_path: Path) -> None:
    unified = tmp_path / "unified"
    unified.mkdir()
    (unified / "cgroup.controllers").write_text("cpu memory\n")
    found = detect(mountinfo=_mountinfo(tmp_path, unified))
    what, finding, ok = envcheck.cgroup_row(found)
    assert ok and found.unified
    assert f"hybrid (v1 beside it) at {unified}" in finding and "cpu memory" in finding
    missing = detect(mountinfo=_mountinfo(tmp_path, None))
    assert envcheck.cgroup_row(missing)[2] is False


def test_check_env_agrees_with_the_node_agent_here() -> None:
    rows = {what: (finding, ok) for what, finding, ok in envcheck.checks()}
    found = detect()
    assert rows["cgroup v2"][1] is found.unified
    if found.unified:
        assert found.mount_point in rows["cgroup v2"][0]


def test_ports_are_the_configured_ones(home: Path) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        taken = listener.getsockname()[1]
        env = {
            "PARFUSION_ALLOCATOR_PORT": str(taken),
            "PARFUSION_ALLOCATOR_METRICS_PORT": str(free_port()),
        }
        only = {"allocator": endpoints(env)["allocator"]}
        _, finding, ok = envcheck.ports_row(only)
        assert not ok and f"in use: allocator:{taken} " in finding
    _, finding, ok = envcheck.ports_row(only)
    assert ok and finding.startswith(f"free: allocator:{taken}, allocator:")


def test_the_malloc_row_is_the_services_own_choice() -> None:
    here = envcheck.malloc_row({})
    if ctypes.util.find_library("jemalloc"):
        assert here == (
            "malloc",
            "jemalloc (libjemalloc.so.2) for the allocator and the node agent",
            True,
        )
    else:
        assert here[1].startswith("CPython's allocator: libjemalloc.so.2 not installed")
    assert envcheck.malloc_row({"PARFUSION_MALLOC": "system"}) == (
        "malloc", "CPython's allocator: PARFUSION_MALLOC=system", False,
    )  # fmt: skip
    _, finding, ok = envcheck.malloc_row({"PARFUSION_MALLOC": "tcmalloc"})
    assert not ok and finding.startswith("PARFUSION_MALLOC='tcmalloc': expected")
