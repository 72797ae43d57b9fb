"""compose.yaml and the Dockerfile agree with the service table (they cannot drift)."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import yaml

from parfusion.compose import COMPOSE_FILE, ROOT, STATE_DIR, compose_text, state_volume
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
        # the host side defaults to the same port: ${PARFUSION_<SERVICE>_PORT:-<port>}
        defaults = {int(re.search(r":-(\d+)\}", p).group(1)) for p in svc["ports"]}
        assert defaults == set(spec.ports)
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


def test_state_lives_in_one_named_volume_per_stateful_service() -> None:
    compose = _compose()
    stateful = [s for s in SERVICES if s.state]
    assert {"allocator", "bridge"} <= {s.name for s in stateful}
    assert set(compose["volumes"]) == {state_volume(s) for s in stateful}
    for spec in SERVICES:
        volumes = compose["services"][spec.name].get("volumes", [])
        # a bind mount of a host folder is what broke a fresh clone (root-owned, uid 10001)
        assert volumes == ([f"{state_volume(spec)}:{STATE_DIR}"] if spec.state else [])


def test_one_service_builds_the_image_the_others_run() -> None:
    services = _compose()["services"]
    builders = [name for name, svc in services.items() if "build" in svc]
    assert builders == [SERVICES[0].name]
    assert len({svc["image"] for svc in services.values()}) == 1


def test_dockerfile_exposes_every_port_and_installs_into_a_venv() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.11", text, re.M)
    assert re.search(r"^RUN python -m venv /opt/venv", text, re.M)
    exposed = {int(p) for line in re.findall(r"^EXPOSE (.+)$", text, re.M) for p in line.split()}
    assert exposed == {p for s in SERVICES for p in s.ports}
    for package in ("parfusion", "services", "experiments", "configs"):
        assert re.search(rf"^COPY {package} ", text, re.M), package
    # the run stage: state folder empty and owned by the non-root user that runs everything
    run_stage = text.rsplit("\nFROM ", 1)[1]
    assert re.search(r"^USER parfusion$", run_stage, re.M)
    assert "chown parfusion:parfusion run" in run_stage


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
