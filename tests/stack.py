"""Start real PARFusion services for end-to-end tests through the real launcher, on free ports.

Every port in configs/demo.yaml is remapped through PARFUSION_<SECTION>_<KEY> environment
overrides, including the cross-service addresses (allocator.nodeagent_address,
dashboard.bridge_url, ...), so a test stack never collides with a user's `make run`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from parfusion.services import BY_NAME, SERVICES, address_references, env_key
from tests.conftest import ROOT, quiet_port


def port_overrides(extra: Mapping[str, str] | None = None) -> tuple[dict[str, str], dict[str, int]]:
    """Environment that moves every service (and every reference to it) to a free port."""
    doc = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())
    remap: dict[int, int] = {}
    ports: dict[str, int] = {}
    for spec in SERVICES:
        for default in spec.ports:
            # below the ephemeral range: the services bind them a few seconds later, and one
            # picked from that range can be some outgoing connection's by then
            remap[default] = quiet_port(frozenset(remap.values()))
        ports[spec.name] = remap[spec.port]
    env: dict[str, str] = {}
    for spec in SERVICES:
        env[env_key(spec.name, "port")] = str(remap[spec.port])
        if spec.metrics_port:
            env[env_key(spec.name, "metrics_port")] = str(remap[spec.metrics_port])
    for ref in address_references(doc):
        env[env_key(ref.section, ref.key)] = ref.rewrite(
            "127.0.0.1", remap[BY_NAME[ref.service].port]
        )
    env.update(extra or {})
    return env, ports


@dataclass
class Stack:
    home: Path
    env: dict[str, str]
    ports: dict[str, int]
    started: list[str] = field(default_factory=list)

    def address(self, name: str) -> str:
        """host:port for gRPC services, http://host:port for HTTP ones."""
        port = self.ports[name]
        return (
            f"127.0.0.1:{port}" if BY_NAME[name].protocol == "grpc" else f"http://127.0.0.1:{port}"
        )

    def _parfusion(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "parfusion.cli", *args],
            cwd=self.home,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def start(self, names: Iterable[str]) -> None:
        names = list(names)
        done = self._parfusion("up", "--detach", "--only", ",".join(names))
        if done.returncode != 0:
            logs = "\n".join(
                f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                for p in (self.home / "logs").glob("*.log")
            )
            self.close()
            raise RuntimeError(f"parfusion up failed:\n{done.stdout}\n{done.stderr}\n{logs}")
        self.started += names

    def stop(self, name: str) -> None:
        self._parfusion("down", "--only", name)
        if name in self.started:
            self.started.remove(name)

    def close(self) -> None:
        self._parfusion("down")
        self.started.clear()


def start_stack(
    home: Path, names: Iterable[str], extra_env: Mapping[str, str] | None = None
) -> Stack:
    """Start ``names`` (in service-table order) under ``home``; call ``.close()`` when done."""
    overrides, ports = port_overrides(extra_env)
    env = {**os.environ, "PARFUSION_HOME": str(home), **overrides}
    if "PARFUSION_API_TOKEN" not in (extra_env or {}):
        env.pop("PARFUSION_API_TOKEN", None)
    stack = Stack(home=home, env=env, ports=ports)
    order = [s.name for s in SERVICES]
    stack.start(sorted(names, key=order.index))
    return stack
