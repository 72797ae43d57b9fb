"""compose.yaml and the Dockerfile agree with the service table (they cannot drift)."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import yaml

from parfusion.compose import COMPOSE_FILE, ROOT, compose_text
from parfusion.services import SERVICES


def _compose() -> dict:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def test_compose_file_is_rendered_from_the_table() -> None:
    assert COMPOSE_FILE.read_text() == compose_text(), "run `python -m parfusion.compose`"


def test_compose_services_commands_ports_match_launcher_table() -> None:
    services = _compose()["services"]
    assert list(services) == [s.name for s in SERVICES]
    for spec in SERVICES:
        svc = services[spec.name]
        assert svc["command"] == ["python", "-m", f"services.{spec.name}", "--host", "0.0.0.0"]
        published = {int(p.rsplit(":", 1)[1]) for p in svc["ports"]}
        assert published == set(spec.ports)
        assert all(p.startswith("127.0.0.1:") for p in svc["ports"]), "publish on loopback only"
        test = svc["healthcheck"]["test"]
        assert test[0] == "CMD" and test[1:4] == ["python", "-m", "parfusion.healthcheck"]
        assert str(spec.port) in test[-1]
        assert svc.get("depends_on", {}) == {
            d: {"condition": "service_healthy"} for d in spec.depends_on
        }


def test_cross_service_addresses_use_container_names() -> None:
    env = _compose()["services"]["allocator"]["environment"]
    assert env["PARFUSION_ALLOCATOR_NODEAGENT_ADDRESS"] == "nodeagent:50052"
    assert env["PARFUSION_HOST"] == "0.0.0.0"
    for svc in _compose()["services"].values():
        assert not any(
            "127.0.0.1" in str(v)
            for k, v in svc["environment"].items()
            if k.endswith(("_ADDRESS", "_URL"))
        )


def test_dockerfile_exposes_every_port_and_copies_every_package() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11", text, re.M)
    exposed = {int(p) for line in re.findall(r"^EXPOSE (.+)$", text, re.M) for p in line.split()}
    assert exposed == {p for s in SERVICES for p in s.ports}
    for package in ("parfusion", "services", "experiments", "configs", "proto"):
        assert re.search(rf"^COPY {package} ", text, re.M), package


@pytest.mark.skipif(
    shutil.which("docker-compose") is None, reason="docker-compose (Debian package) not installed"
)
def test_docker_compose_validates_the_file() -> None:
    done = subprocess.run(
        ["docker-compose", "-f", str(COMPOSE_FILE), "config", "-q"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
