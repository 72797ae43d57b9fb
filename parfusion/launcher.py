"""The embedded launcher: `parfusion up` starts every service as a local process on loopback,
waits for each to be healthy, prints the addresses and stops them all on Ctrl-C. `--detach`
leaves them running under run/launcher.json until `parfusion down`. Ports and peer addresses
come from one resolution (parfusion.endpoints): PARFUSION_ALLOCATOR_PORT=51051 moves the
allocator and every service that dials it, and `parfusion status` looks there too.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from parfusion.endpoints import endpoint, peer_environment
from parfusion.healthcheck import check_grpc, check_http
from parfusion.services import SERVICES, ServiceSpec, available_services
from services.common.config import ConfigError, load_config, project_home

PR_SET_PDEATHSIG = 1
STATE_FILE = "launcher.json"


@dataclass
class Started:
    spec: ServiceSpec
    proc: subprocess.Popen[bytes]
    log_path: Path


def _die_with_parent() -> None:
    # Foreground mode: a launcher killed with -9 must not leave services behind.
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


def healthy(spec: ServiceSpec, timeout: float = 1.0) -> bool:
    """Serving where this configuration says it listens (parfusion.endpoints)."""
    address = endpoint(spec).address
    if spec.protocol == "grpc":
        return check_grpc(address, timeout=timeout)
    return check_http(f"{address}/healthz", timeout=timeout)


def start_service(
    spec: ServiceSpec, home: Path, detach: bool, extra_env: dict[str, str] | None = None
) -> Started:
    log_dir = home / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{spec.name}.log"
    env = {**os.environ, "PARFUSION_HOME": str(home), "PYTHONUNBUFFERED": "1", **(extra_env or {})}
    with log_path.open("ab") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", spec.module],
            cwd=home,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=None if detach else _die_with_parent,
        )
    return Started(spec, proc, log_path)


def wait_healthy(
    started: Started, timeout_s: float, cancelled: Callable[[], bool] = lambda: False
) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if started.proc.poll() is not None or cancelled():
            return False
        if healthy(started.spec):
            return True
        time.sleep(0.2)
    return False


def stop_pid(pid: int, grace_s: float = 6.0) -> None:
    """SIGTERM the service's process group, then SIGKILL what is left after the grace period."""
    try:
        pgid = os.getpgid(pid)
    except ProcessLookupError:
        return
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        _reap()
        time.sleep(0.1)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _reap() -> None:
    try:
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    except ChildProcessError:
        pass


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _state_path(home: Path) -> Path:
    return home / "run" / STATE_FILE


def _read_state(home: Path) -> dict[str, Any]:
    try:
        return dict(json.loads(_state_path(home).read_text()))
    except (OSError, ValueError):
        return {}


def _write_state(home: Path, pids: dict[str, int]) -> None:
    path = _state_path(home)
    if not pids:
        path.unlink(missing_ok=True)
        return
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"pids": pids}))
    os.replace(tmp, path)


def _select(only: str | None) -> list[ServiceSpec]:
    specs = available_services()
    if not only:
        return specs
    wanted = {n.strip() for n in only.split(",") if n.strip()}
    unknown = wanted - {s.name for s in SERVICES}
    if unknown:
        raise ValueError(
            f"unknown service(s): {', '.join(sorted(unknown))}; known: {', '.join(s.name for s in SERVICES)}"
        )
    missing = wanted - {s.name for s in specs}
    if missing:
        raise ValueError(f"not in this build: {', '.join(sorted(missing))}")
    return [s for s in specs if s.name in wanted]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def up(args: argparse.Namespace) -> int:
    home = project_home()
    try:
        load_config()  # every service reads it: one clear line now, not a usage error each
    except ConfigError as exc:
        print(f"parfusion up: {exc}", file=sys.stderr)
        return 2
    try:
        specs = _select(args.only)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    (home / "run").mkdir(parents=True, exist_ok=True)
    previous = {
        n: int(pid) for n, pid in _read_state(home).get("pids", {}).items() if _alive(int(pid))
    }
    running = [s.name for s in specs if s.name in previous]
    if running:
        print(f"already running: {', '.join(running)}; `parfusion down` stops it.", file=sys.stderr)
        return 1
    busy = [s for s in specs if healthy(s, timeout=0.3)]
    if busy:
        print(
            f"already serving: {', '.join(f'{s.name}={endpoint(s).address}' for s in busy)}",
            file=sys.stderr,
        )
        return 1
    # Every peer address follows the ports and host this configuration gives its target.
    peers = peer_environment()
    started: list[Started] = []

    def stop_all() -> None:
        for s in reversed(started):
            stop_pid(s.proc.pid)
            try:
                s.proc.wait(timeout=1)
            except subprocess.TimeoutExpired:
                pass
        _write_state(home, previous)

    stopping = False

    def _signal(_sig: int, _frame: Any) -> None:
        nonlocal stopping
        stopping = True

    # A flag, not KeyboardInterrupt: a Ctrl-C at any moment (mid-fork included) is a clean
    # stop of whatever has started so far, never an exception thrown through Popen.
    signal.signal(signal.SIGINT, _signal)
    signal.signal(signal.SIGTERM, _signal)

    def interrupted() -> int:
        print("\ninterrupted; stopping ...", flush=True)
        stop_all()
        print("stopped")
        return 130

    for spec in specs:
        if stopping:
            return interrupted()
        print(f"starting {spec.name:<10} ...", end=" ", flush=True)
        s = start_service(spec, home, detach=args.detach, extra_env=peers)
        started.append(s)
        if not wait_healthy(s, args.timeout, cancelled=lambda: stopping):
            if stopping:
                return interrupted()
            print("FAILED")
            print(f"--- {s.log_path} (last lines) ---\n{_tail(s.log_path)}", file=sys.stderr)
            stop_all()
            return 1
        print(f"ok  {endpoint(spec).address:<24} pid {s.proc.pid}")
        _write_state(home, {**previous, **{x.spec.name: x.proc.pid for x in started}})
    if stopping:
        return interrupted()
    _print_addresses(specs)
    if args.detach:
        print("running in the background; stop with `parfusion down` (or scripts/stop_demo.sh)")
        return 0
    print("press Ctrl-C to stop", flush=True)
    try:
        while not stopping:
            for s in started:
                if s.proc.poll() is not None and not getattr(s, "reported", False):
                    print(
                        f"{s.spec.name} exited with code {s.proc.returncode}; see {s.log_path}",
                        file=sys.stderr,
                    )
                    s.reported = True  # type: ignore[attr-defined]
            time.sleep(0.3)
    finally:
        print("\nstopping ...", flush=True)
        stop_all()
        print("stopped")
    return 0


def _print_addresses(specs: list[ServiceSpec]) -> None:
    print("\nPARFusion services:")
    for s in specs:
        ep = endpoint(s)
        print(f"  {s.name:<10} {s.protocol:<4} {ep.address:<24} metrics {ep.metrics_url}")
    for s in specs:
        if s.name == "dashboard":
            print(f"\nDashboard: {endpoint(s).address}/")


def down(args: argparse.Namespace) -> int:
    home = project_home()
    pids = {n: int(p) for n, p in _read_state(home).get("pids", {}).items()}
    try:
        names = [s.name for s in _select(args.only)] if args.only else list(pids)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    targets = [(n, pids[n]) for n in names if n in pids]
    if not targets:
        print("nothing to stop (not started with `parfusion up --detach`)")
        return 0
    order = [s.name for s in SERVICES]
    for name, pid in sorted(
        targets, key=lambda t: order.index(t[0]) if t[0] in order else 0, reverse=True
    ):
        if _alive(pid):
            print(f"stopping {name} (pid {pid})")
            stop_pid(pid)
    _write_state(home, {n: p for n, p in pids.items() if n not in dict(targets) and _alive(p)})
    print("stopped")
    return 0


def status(_args: argparse.Namespace) -> int:
    home = project_home()
    pids = _read_state(home).get("pids", {})
    all_ok = True
    for s in SERVICES:
        if not s.exists():
            print(f"  {s.name:<10} not in this build")
            continue
        ok = healthy(s, timeout=0.5)
        all_ok &= ok
        pid = pids.get(s.name)
        print(
            f"  {s.name:<10} {'SERVING' if ok else 'DOWN':<8} {endpoint(s).address:<24} {f'pid {pid}' if pid else ''}"
        )
    return 0 if all_ok else 1


def register(commands: Any) -> None:
    def configure_up(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--detach",
            action="store_true",
            help="leave the services running; stop with `parfusion down`",
        )
        p.add_argument("--only", help="comma-separated service names (default: all)")
        p.add_argument(
            "--timeout",
            type=float,
            default=30.0,
            help="seconds to wait for each service to be healthy",
        )

    commands.command(("up",), "start every PARFusion service on 127.0.0.1", configure_up, up)

    def configure_down(p: argparse.ArgumentParser) -> None:
        p.add_argument("--only", help="comma-separated service names (default: all started ones)")

    commands.command(
        ("down",), "stop services started with `parfusion up --detach`", configure_down, down
    )
    commands.command(("status",), "health of every service", None, status)
