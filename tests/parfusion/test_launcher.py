"""The embedded launcher for real: detached up/status/down, foreground Ctrl-C, no orphans."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from parfusion.launcher import healthy
from parfusion.services import BY_NAME, SERVICES, env_key
from tests.conftest import free_port
from tests.stack import Stack, port_overrides, start_stack

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


def test_an_unreadable_config_stops_up_before_anything_starts(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "parfusion.cli", "up", "--detach"],
        cwd=tmp_path,
        env={
            **os.environ,
            "PARFUSION_HOME": str(tmp_path),
            "PARFUSION_CONFIG": str(tmp_path / "missing.yaml"),
        },
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"parfusion up: cannot read config {tmp_path / 'missing.yaml'}: No such file or directory"
    )
    assert not (tmp_path / "run").exists()  # nothing started, nothing recorded


def test_a_reader_that_leaves_early_gets_no_traceback(tmp_path: Path) -> None:
    """`parfusion status | head -1`: the pipe's reader is gone before the command writes."""
    read, write = os.pipe()
    os.close(read)
    env_overrides, _ = port_overrides()  # nothing listens there: every row is DOWN at once
    try:
        done = subprocess.run(
            [sys.executable, "-m", "parfusion.cli", "status"],
            cwd=tmp_path,
            env={**os.environ, "PARFUSION_HOME": str(tmp_path), **env_overrides},
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    finally:
        os.close(write)
    assert done.returncode == 0 and done.stderr == ""


def test_healthy_follows_port_override(monkeypatch: pytest.MonkeyPatch, home: Path) -> None:
    monkeypatch.setenv("PARFUSION_GPULANE_PORT", "1")
    assert healthy(BY_NAME["gpulane"], timeout=0.2) is False


def test_ports_move_together_end_to_end(tmp_path: Path) -> None:
    """A second stack as the README starts it: every PARFUSION_<SERVICE>_PORT / _METRICS_PORT
    moved and a fresh PARFUSION_HOME of its own (no configs/ in it). Peers and the CLI follow
    the ports; the shipped configuration and demo intents are read, runtime files written
    under the new home only."""
    home = tmp_path / "second"
    home.mkdir()
    names = ["allocator", "nodeagent", "bridge"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PARFUSION_")}
    env["PARFUSION_HOME"] = str(home)
    ports: dict[str, int] = {}
    for spec in SERVICES:
        ports[spec.name] = free_port()
        env[env_key(spec.name, "port")] = str(ports[spec.name])
        if spec.metrics_port:
            env[env_key(spec.name, "metrics_port")] = str(free_port())
    stack = Stack(home=home, env=env, ports=ports)
    try:
        stack.start(names)
        plan = _wait_for(stack, ("plan",), "telemetry fresh")
        assert "policy parfusion" in plan
        listed = stack._parfusion("intents")
        assert listed.returncode == 0 and "demo-online-inference" in listed.stdout
        assert (home / "run" / "allocator.db").exists() and not (home / "configs").exists()
        state = httpx.get(f"{stack.address('bridge')}/api/state", timeout=5).json()
        assert state["allocator"]["address"] == f"127.0.0.1:{ports['allocator']}"
        metrics = httpx.get(
            f"http://127.0.0.1:{env['PARFUSION_ALLOCATOR_METRICS_PORT']}/metrics", timeout=5
        )
        assert metrics.status_code == 200 and "parfusion_" in metrics.text
        status = stack._parfusion("status").stdout
        for name in names:
            assert f"127.0.0.1:{ports[name]}" in status
        check = stack._parfusion("check-env").stdout
        assert f"allocator:{ports['allocator']}" in check and "in use" in check
    finally:
        stack.close()


def _wait_for(stack: Stack, args: tuple[str, ...], text: str, timeout_s: float = 30.0) -> str:
    deadline = time.monotonic() + timeout_s
    out = ""
    while time.monotonic() < deadline:
        done = stack._parfusion(*args)
        out = done.stdout + done.stderr
        if done.returncode == 0 and text in out:
            return out
        time.sleep(0.5)
    raise AssertionError(f"`parfusion {' '.join(args)}` never showed {text!r}:\n{out}")
