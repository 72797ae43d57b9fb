"""`parfusion submit | intents | plan | policy` in-process against an allocator on a free port."""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from parfusion.cli import Commands
from parfusion.v1 import allocator_pb2, allocator_pb2_grpc
from services.allocator import commands
from services.allocator.server import RunningAllocator
from tests.conftest import ROOT, free_port


def run(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="parfusion")
    commands.register(Commands(parser))
    ns = parser.parse_args(argv)
    return int(ns._run(ns))


@pytest.fixture
def allocator(start: Callable[..., RunningAllocator]) -> RunningAllocator:
    return start()


def test_submit_yaml_then_idempotent(
    allocator: RunningAllocator, capsys: pytest.CaptureFixture[str]
) -> None:
    path = ROOT / "configs" / "intents" / "online-inference.yaml"
    assert run("submit", str(path), "--address", allocator.address) == 0
    assert capsys.readouterr().out.strip() == "demo-online-inference\tonline-inference\tstored"
    assert run("submit", str(path), "--address", allocator.address) == 0
    assert "unchanged (already stored)" in capsys.readouterr().out


def test_submit_json_camel_case_and_full_enum_names(
    allocator: RunningAllocator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "job.json"
    path.write_text(
        json.dumps(
            {
                "id": "job-7",
                "name": "job",
                "workloadClass": "WORKLOAD_CLASS_BATCH",
                "demand": {"workUnits": 5},
            }
        )
    )
    assert run("submit", str(path), "--address", allocator.address, "--json") == 0
    reply = json.loads(capsys.readouterr().out)
    assert (
        reply["intent"]["id"] == "job-7"
        and reply["intent"]["workload_class"] == "WORKLOAD_CLASS_BATCH"
    )


def test_submit_invalid_prints_code_and_details(
    allocator: RunningAllocator, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("name: web\nworkload_class: ONLINE\n")
    assert run("submit", str(path), "--address", allocator.address) == 1
    err = capsys.readouterr().err
    assert "INVALID_ARGUMENT" in err and "intent.slo.deadline_ms: required for ONLINE" in err
    path.write_text("name: web\nworkload_class: ONLINE\nbogus: 1\n")
    assert run("submit", str(path), "--address", allocator.address) == 2
    assert "bogus" in capsys.readouterr().err
    assert run("submit", str(tmp_path / "missing.yaml"), "--address", allocator.address) == 2


def test_intents_and_plan_tables(
    allocator: RunningAllocator, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ("online-inference", "batch-training"):
        run(
            "submit",
            str(ROOT / "configs" / "intents" / f"{name}.yaml"),
            "--address",
            allocator.address,
        )
    capsys.readouterr()
    assert run("intents", "--address", allocator.address) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:3] == ["ID", "NAME", "CLASS"]
    assert [line.split()[0] for line in out[1:]] == ["demo-online-inference", "demo-batch-training"]
    assert run("intents", "--class", "batch", "--address", allocator.address) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2
    allocator.handle.loop.tick()
    assert run("plan", "--address", allocator.address) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("policy parfusion  generation 1")
    assert {line.split()[0] for line in out[2:]} == {"online-inference", "batch-training"}


def test_plan_watch_prints_the_plan_then_what_changed(
    allocator: RunningAllocator, capsys: pytest.CaptureFixture[str]
) -> None:
    """`plan --watch`: the whole plan first, then a line per intent that joined, changed its
    decision or left; plans that change no decision print nothing; --count ends it."""
    run("submit", str(ROOT / "configs" / "intents" / "online-inference.yaml"),
        "--address", allocator.address)  # fmt: skip
    loop = allocator.handle.loop
    for _ in range(3):
        loop.tick()
    capsys.readouterr()
    done: list[int] = []
    watcher = threading.Thread(
        target=lambda: done.append(
            run("plan", "--watch", "--count", "4", "--address", allocator.address)
        )
    )
    watcher.start()
    deadline = time.monotonic() + 5
    while loop.feed.subscriber_count() == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    loop.tick()  # nothing new: no line
    path = ROOT / "configs" / "intents" / "batch-training.yaml"
    run("submit", str(path), "--address", allocator.address)
    loop.tick()
    with grpc.insecure_channel(allocator.address) as ch:
        stub = allocator_pb2_grpc.AllocatorServiceStub(ch)
        stub.DeleteIntent(allocator_pb2.DeleteIntentRequest(id="demo-batch-training"), timeout=5)
    loop.tick()
    watcher.join(10)
    assert done == [0]
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("policy parfusion  generation 3")
    assert out[2].split()[0] == "online-inference"
    lines = [line for line in out if "  generation " in line and line[2] == ":"]
    assert len(lines) == 2, out
    assert "generation 5  batch-training: joined" in lines[0]
    assert "generation 6  batch-training: left the plan" in lines[1]
    loop.tick()  # --json: one message a line, the whole plan first
    assert run("plan", "--watch", "--json", "--count", "1", "--address", allocator.address) == 0
    first = json.loads(capsys.readouterr().out.splitlines()[0])
    assert first["node_plan"]["generation"] == "7" and "base_generation" not in first
    for bad in ("-1", "2.5", str(10**10)):  # a count out of its bounds is refused by name
        with pytest.raises(SystemExit):
            run("plan", "--watch", "--count", bad, "--address", allocator.address)
        assert "--count" in capsys.readouterr().err


def test_plan_writes_an_unbounded_latency_as_infinity(
    allocator: RunningAllocator, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    flood = {
        "id": "flood", "name": "flood", "workload_class": "ONLINE",
        "slo": {"deadline_ms": 50}, "parallelism": {"min": 1, "max": 2},
        "speedup": {"parallel_fraction": 0.5, "base_service_ms": 100},
        "demand": {"arrival_rate_per_s": 500},
    }  # fmt: skip
    (tmp_path / "flood.json").write_text(json.dumps(flood))
    assert run("submit", str(tmp_path / "flood.json"), "--address", allocator.address) == 0
    allocator.handle.loop.tick()
    capsys.readouterr()
    assert run("plan", "--address", allocator.address) == 0
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("flood "))
    cells = row.split()
    assert cells[5:7] == ["∞", "−∞"], row  # P99_MS, SLACK_MS
    assert "pred p99 ∞ ms" in row and "1000000000" not in row


def test_policy_list_marks_active_and_switch(
    allocator: RunningAllocator, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run("policy", "--address", allocator.address) == 0
    rows = capsys.readouterr().out.splitlines()[1:]
    assert [r.split()[1] for r in rows if r.startswith("*")] == ["parfusion"]
    assert run("policy", "baseline", "--address", allocator.address) == 0
    assert capsys.readouterr().out.strip() == "active policy: baseline (was parfusion)"
    assert run("policy", "nope", "--address", allocator.address) == 1
    assert "INVALID_ARGUMENT: name:" in capsys.readouterr().err


def test_unreachable_allocator_is_unavailable(capsys: pytest.CaptureFixture[str]) -> None:
    assert run("intents", "--address", f"127.0.0.1:{free_port()}", "--timeout", "0.5") == 3
    assert capsys.readouterr().err.startswith("error: ")


def test_api_token_rides_along_from_the_environment(
    start: Callable[..., RunningAllocator],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("PARFUSION_API_TOKEN", "s3cret")
    running = start()
    path = ROOT / "configs" / "intents" / "robot-mission.yaml"
    assert run("submit", str(path), "--address", running.address) == 0
    monkeypatch.delenv("PARFUSION_API_TOKEN")
    assert run("submit", str(path), "--address", running.address) == 1
    assert "UNAUTHENTICATED" in capsys.readouterr().err
    assert run("intents", "--address", running.address) == 0  # reads need no token
