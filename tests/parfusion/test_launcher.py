"""The embedded launcher for real: detached up/status/down, foreground Ctrl-C, no orphans."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from parfusion.launcher import healthy
from parfusion.services import BY_NAME
from tests.stack import port_overrides, start_stack

pytestmark = pytest.mark.integration

NAMES = ["gpulane", "bridge"]  # two real services, one gRPC and one HTTP, both quick to start


def _tree(pid: int) -> list[psutil.Process]:
    proc = psutil.Process(pid)
    return [proc, *proc.children(recursive=True)]


def _foreground_up(home: Path) -> tuple[subprocess.Popen[str], dict[str, int]]:
    env_overrides, ports = port_overrides()
    env = {**os.environ, "PARFUSION_HOME": str(home), **env_overrides}
    proc = subprocess.Popen(
        [sys.executable, "-m", "parfusion.cli", "up", "--only", ",".join(NAMES)],
        cwd=home,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    return proc, ports


def test_detached_up_status_down_leaves_nothing(home: Path) -> None:
    stack = start_stack(home, NAMES)
    try:
        state = json.loads((home / "run" / "launcher.json").read_text())
        pids = {name: int(pid) for name, pid in state["pids"].items()}
        assert set(pids) == set(NAMES)
        procs = [p for pid in pids.values() for p in _tree(pid)]
        status = stack._parfusion("status")
        for name in NAMES:
            assert f"{name}" in status.stdout and str(stack.ports[name]) in status.stdout
        assert status.stdout.count("SERVING") == len(NAMES)
        again = stack._parfusion("up", "--detach", "--only", "bridge")
        assert again.returncode == 1 and "already running" in again.stderr
        stack.stop("bridge")
        assert (
            not psutil.pid_exists(pids["bridge"])
            or psutil.Process(pids["bridge"]).status() == psutil.STATUS_ZOMBIE
        )
        assert set(json.loads((home / "run" / "launcher.json").read_text())["pids"]) == {"gpulane"}
    finally:
        stack.close()
    gone, alive = psutil.wait_procs(procs, timeout=5)
    assert not alive, f"orphans left: {alive}"
    assert not (home / "run" / "launcher.json").exists()


def test_foreground_ctrl_c_stops_every_service(home: Path) -> None:
    proc, ports = _foreground_up(home)
    lines: list[str] = []
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        lines.append(line)
        if "press Ctrl-C" in line or proc.poll() is not None:
            break
    out = "".join(lines)
    assert "press Ctrl-C" in out, out
    for name in NAMES:
        assert f"127.0.0.1:{ports[name]}" in out
    children = psutil.Process(proc.pid).children(recursive=True)
    assert len(children) >= len(NAMES)
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, rest
    assert "stopped" in rest
    _, alive = psutil.wait_procs(children, timeout=5)
    assert not alive, f"orphans left: {alive}"


def test_ctrl_c_while_starting_stops_what_started(home: Path) -> None:
    proc, _ = _foreground_up(home)
    assert proc.stdout is not None
    first = proc.stdout.readline()  # "starting gpulane ... ok ..." once it is healthy
    assert "ok" in first, first
    children = psutil.Process(proc.pid).children(recursive=True)
    assert children, "the first service should be running"
    proc.send_signal(signal.SIGINT)  # while the second one starts
    rest, _ = proc.communicate(timeout=30)
    assert proc.returncode == 130, rest
    assert "stopped" in rest and "press Ctrl-C" not in rest
    _, alive = psutil.wait_procs(children, timeout=5)
    assert not alive, f"orphans left: {alive}"
    assert not (home / "run" / "launcher.json").exists()  # nothing recorded as running


def test_unknown_service_is_a_clear_error(home: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "parfusion.cli", "up", "--only", "nosuch"],
        cwd=home,
        env={**os.environ, "PARFUSION_HOME": str(home)},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2 and "unknown service(s): nosuch" in done.stderr


def test_healthy_follows_port_override(monkeypatch: pytest.MonkeyPatch, home: Path) -> None:
    monkeypatch.setenv("PARFUSION_GPULANE_PORT", "1")
    assert healthy(BY_NAME["gpulane"], timeout=0.2) is False
