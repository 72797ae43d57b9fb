"""Real services for the dashboard's end-to-end tests, on free ports, as child processes.

Prefers the project's ``tests.stack`` (the real launcher with port overrides); when that helper
cannot start a stack here, each service is run directly as ``python -m services.<name> --port P``
with every cross-service address in configs/demo.yaml remapped through PARFUSION_* overrides.
Either way the processes are real and are stopped by ``close()``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Protocol

import yaml

from parfusion.healthcheck import check_grpc, check_http
from parfusion.services import BY_NAME, SERVICES
from tests.conftest import ROOT, free_port

ADDRESS = re.compile(r"127\.0\.0\.1:(\d+)")


class StackLike(Protocol):
    env: dict[str, str]

    def address(self, name: str) -> str: ...
    def stop(self, name: str) -> None: ...
    def close(self) -> None: ...


def remapped_env(extra: Mapping[str, str] | None = None) -> tuple[dict[str, str], dict[str, int]]:
    doc = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    remap = {p: free_port() for s in SERVICES for p in s.ports}
    env: dict[str, str] = {}
    for section, values in doc.items():
        if not isinstance(values, dict):
            continue
        for key, value in values.items():
            name = f"PARFUSION_{section.upper()}_{key.upper()}"
            if key in {"port", "metrics_port"} and isinstance(value, int) and value in remap:
                env[name] = str(remap[value])
            elif isinstance(value, str) and ADDRESS.search(value):
                env[name] = ADDRESS.sub(
                    lambda m: f"127.0.0.1:{remap.get(int(m.group(1)), int(m.group(1)))}", value
                )
    env.update(extra or {})
    return env, {s.name: remap[s.port] for s in SERVICES}


@dataclass
class LocalStack:
    home: Path
    env: dict[str, str]
    ports: dict[str, int]
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    _logs: list[IO[Any]] = field(default_factory=list)

    def address(self, name: str) -> str:
        port = self.ports[name]
        grpc = BY_NAME[name].protocol == "grpc"
        return f"127.0.0.1:{port}" if grpc else f"http://127.0.0.1:{port}"

    def healthy(self, name: str) -> bool:
        if BY_NAME[name].protocol == "grpc":
            return check_grpc(self.address(name), timeout=1.0)
        return check_http(self.address(name) + "/healthz", timeout=1.0)

    def start(self, names: Iterable[str], timeout_s: float = 60.0) -> None:
        (self.home / "logs").mkdir(parents=True, exist_ok=True)
        for name in names:
            log = open(self.home / "logs" / f"{name}.test.log", "ab")  # noqa: SIM115
            self._logs.append(log)
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", f"services.{name}", "--port", str(self.ports[name])],
                cwd=self.home,
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout_s
        for name in names:
            while not self.healthy(name):
                if self.procs[name].poll() is not None or time.monotonic() > deadline:
                    text = (self.home / "logs" / f"{name}.test.log").read_text(errors="replace")
                    self.close()
                    raise RuntimeError(f"{name} did not become healthy:\n{text[-3000:]}")
                time.sleep(0.2)

    def stop(self, name: str) -> None:
        proc = self.procs.pop(name, None)
        if proc is None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=8)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)

    def close(self) -> None:
        for name in list(self.procs):
            self.stop(name)
        for log in self._logs:
            log.close()


def start_services(
    home: Path, names: Iterable[str], extra_env: Mapping[str, str] | None = None
) -> StackLike:
    names = [n for n in (s.name for s in SERVICES) if n in set(names) and BY_NAME[n].exists()]
    try:
        from tests.stack import start_stack

        return start_stack(home, names, extra_env)  # type: ignore[no-any-return]
    except Exception:  # the shared helper is unavailable here; run the services directly
        pass
    overrides, ports = remapped_env(extra_env)
    env = {**os.environ, "PARFUSION_HOME": str(home), **overrides}
    env.pop("PARFUSION_API_TOKEN", None)
    stack = LocalStack(home=home, env=env, ports=ports)
    stack.start(names)
    return stack
