"""The lane controller: dry-run records on change only, apply-mode refusals and execution.

NVML is the fake library at the pynvml boundary; the command runner is replaced at the process
boundary (there is no nvidia-cuda-mps-control here) and records what apply mode would run.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from parfusion.v1 import gpulane_pb2
from services.common.errors import FailedPrecondition
from services.gpulane.backend import NvmlLaneLoad
from services.gpulane.controller import LaneController, LaneOptions
from services.gpulane.lanes import parse_lanes
from services.gpulane.nvml import Nvml
from services.gpulane.priority import PriorityRange
from services.gpulane.recorder import PlanRecorder
from services.gpulane.runner import CommandOutcome
from tests.gpulane.fake_nvml import FakeGpu, FakeNvml, h200_node
from tests.gpulane.plans import demo_plan

LANES = parse_lanes({"online": [0, 1], "batch": [2, 3, 4, 5], "robot": [6], "urgent": [7]})


class RecordingRunner:
    def __init__(
        self, programs: tuple[str, ...] = ("nvidia-cuda-mps-control",), servers: str = ""
    ) -> None:
        self.programs = programs
        self.servers = servers
        self.calls: list[tuple[tuple[str, ...], str]] = []

    def which(self, program: str) -> bool:
        return program in self.programs

    def run(self, argv, stdin="", env=None) -> CommandOutcome:
        self.calls.append((tuple(argv), stdin))
        out = self.servers if stdin == "get_server_list\n" else ""
        return CommandOutcome(tuple(argv), stdin, 0, out, "")


def controller(
    tmp_path: Path, fake: FakeNvml, mode: str = "dry-run", runner=None, **kw
) -> LaneController:
    return LaneController(
        LaneOptions(lanes=LANES, mode=mode, snapshot_ttl_s=0),
        nvml=Nvml(fake),
        recorder=PlanRecorder(tmp_path / "run", kw.pop("max_records", 200)),
        load_source=NvmlLaneLoad(),
        runner=runner or RecordingRunner(),
        priority_probe=lambda gpu: PriorityRange(0, -5, f"queried: GPU {gpu}"),
        **kw,
    )


def apply_req(plan, mode=gpulane_pb2.APPLY_MODE_UNSPECIFIED) -> gpulane_pb2.ApplyGpuPlanRequest:
    return gpulane_pb2.ApplyGpuPlanRequest(plan=plan, mode=mode)


def test_dry_run_records_only_on_change(tmp_path: Path) -> None:
    runner = RecordingRunner()
    c = controller(tmp_path, h200_node(), runner=runner)
    first = c.apply(apply_req(demo_plan(generation=1)))
    assert first.mode == gpulane_pb2.APPLY_MODE_DRY_RUN and first.changed
    assert Path(first.recorded_path) == tmp_path / "run" / "gpulane" / "last_plan.json"
    for gen in range(2, 20):  # the allocator resends the same plan every tick
        assert not c.apply(apply_req(demo_plan(generation=gen))).changed
    plan = demo_plan(generation=20)
    plan.assignments[0].share_percent = 30.0
    assert c.apply(apply_req(plan)).changed
    history = (tmp_path / "run" / "gpulane" / "plans.jsonl").read_text().splitlines()
    assert len(history) == 2
    last = json.loads(Path(first.recorded_path).read_text())
    assert last["generation"] == 20 and last["mode"] == "APPLY_MODE_DRY_RUN"
    assert any("set_default_active_thread_percentage" in cmd["stdin"] for cmd in last["commands"])
    assert runner.calls == []  # a dry run never runs anything


def test_history_is_bounded(tmp_path: Path) -> None:
    c = controller(tmp_path, h200_node(), max_records=10)
    for i in range(40):
        plan = demo_plan(generation=i)
        plan.assignments[0].share_percent = 10.0 + i
        c.apply(apply_req(plan))
    lines = (tmp_path / "run" / "gpulane" / "plans.jsonl").read_text().splitlines()
    assert 5 <= len(lines) <= 10
    assert json.loads(lines[-1])["generation"] == 39


def test_apply_without_nvml_refuses(tmp_path: Path) -> None:
    c = controller(tmp_path, FakeNvml(driver_missing=True))
    with pytest.raises(FailedPrecondition, match="needs NVML"):
        c.apply(apply_req(demo_plan(), gpulane_pb2.APPLY_MODE_APPLY))
    assert not (tmp_path / "run" / "gpulane" / "last_plan.json").exists()


def test_config_apply_mode_refuses_busy_gpu(tmp_path: Path) -> None:
    runner = RecordingRunner()
    c = controller(tmp_path, h200_node(gpu2=FakeGpu(utilization=80, pids=[999])), "apply", runner)
    with pytest.raises(FailedPrecondition, match=r"GPU 2 runs compute processes \(pid 999\)"):
        c.apply(apply_req(demo_plan()))
    assert runner.calls == []
    # an explicit dry run still previews and records
    assert c.apply(apply_req(demo_plan(), gpulane_pb2.APPLY_MODE_DRY_RUN)).changed


def test_apply_refuses_lanes_over_absent_gpus(tmp_path: Path) -> None:
    c = controller(tmp_path, h200_node(2))
    with pytest.raises(FailedPrecondition, match="intent train: GPUs 2,3,4,5 not present"):
        c.apply(apply_req(demo_plan(), gpulane_pb2.APPLY_MODE_APPLY))


def test_apply_refuses_without_mps_control(tmp_path: Path) -> None:
    c = controller(tmp_path, h200_node(), runner=RecordingRunner(programs=()))
    with pytest.raises(FailedPrecondition, match="nvidia-cuda-mps-control is not on PATH"):
        c.apply(apply_req(demo_plan(), gpulane_pb2.APPLY_MODE_APPLY))


def test_apply_on_idle_gpus_runs_mps_lines_once(tmp_path: Path) -> None:
    runner = RecordingRunner(servers="4711\n")
    c = controller(
        tmp_path, h200_node(gpu0=FakeGpu(pids=[555])), runner=runner, own_pids=lambda: [555]
    )
    reply = c.apply(apply_req(demo_plan(), gpulane_pb2.APPLY_MODE_APPLY))
    assert reply.mode == gpulane_pb2.APPLY_MODE_APPLY
    stdin = [s for _, s in runner.calls]
    assert runner.calls[0][0] == ("nvidia-cuda-mps-control", "-d")
    assert "set_default_active_thread_percentage 57\n" in stdin
    assert "set_active_thread_percentage 4711 57\n" in stdin
    assert all(argv[0] == "nvidia-cuda-mps-control" for argv, _ in runner.calls)  # never MIG
    count = len(runner.calls)
    c.apply(apply_req(demo_plan(generation=2), gpulane_pb2.APPLY_MODE_APPLY))
    assert len(runner.calls) == count  # identical plan: not applied again
    record = json.loads((tmp_path / "run" / "gpulane" / "last_plan.json").read_text())
    assert record["executed"][0]["argv"] == ["nvidia-cuda-mps-control", "-d"]
    daemon_env = next(
        c.env for c in reply.commands if list(c.argv) == ["nvidia-cuda-mps-control", "-d"]
    )
    assert daemon_env["CUDA_VISIBLE_DEVICES"].split(",")[0] == "GPU-00000000"  # NVML's UUID


def test_mig_ids_are_looked_up_when_mig_is_enabled(tmp_path: Path) -> None:
    class LgipRunner(RecordingRunner):
        def run(self, argv, stdin="", env=None):
            self.calls.append((tuple(argv), stdin))
            table = f"|   {argv[3]}  MIG 4g.71gb          5     1/1        69.00      No     64     4     0   |"
            return CommandOutcome(tuple(argv), stdin, 0, table, "")

    runner = LgipRunner(programs=("nvidia-smi",))
    fake = h200_node(gpu2=FakeGpu(mig_enabled=True))
    reply = controller(tmp_path, fake, runner=runner).preview(demo_plan())
    assert runner.calls == [(("nvidia-smi", "mig", "-i", "2", "-lgip"), "")]
    assert ["nvidia-smi", "mig", "-i", "2", "-cgi", "5"] in [list(c.argv) for c in reply.commands]


def test_telemetry_lanes_shares_and_pressure(tmp_path: Path) -> None:
    fake = h200_node(2, gpu1=FakeGpu(utilization=50, pids=[77]))
    c = controller(tmp_path, fake)
    c.apply(apply_req(demo_plan()))
    t = c.telemetry()
    assert t.nvml_available and [d.index for d in t.devices] == [0, 1]
    assert [d.idle for d in t.devices] == [True, False]
    assert t.devices[1].processes[0].pid == 77 and t.devices[0].power_watts == 75.0
    lanes = {lane.name: lane for lane in t.lanes}
    assert lanes["online"].available and lanes["online"].allocated_share_percent == 40.0
    assert not lanes["batch"].available and lanes["batch"].present_indexes == []
    assert t.backend == "nvml" and t.gpu_pressure == pytest.approx(0.25)


def test_telemetry_without_nvml_is_empty(tmp_path: Path) -> None:
    t = controller(tmp_path, FakeNvml(driver_missing=True)).telemetry()
    assert not t.nvml_available and list(t.devices) == []
    assert all(not lane.available for lane in t.lanes)
    assert "Shared Library Not Found" in t.nvml_error


def test_preview_defaults_to_last_plan(tmp_path: Path) -> None:
    c = controller(tmp_path, h200_node())
    assert list(c.preview(None).commands) == []
    c.apply(apply_req(demo_plan()))
    reply = c.preview(None)
    assert {d.intent_id for d in reply.decisions} == {"chat", "train", "arm", "estop"}
    assert reply.commands and reply.notes


def test_priority_range_is_probed_in_the_background(tmp_path: Path) -> None:
    c = controller(tmp_path, h200_node())
    first = c.priority_range()
    assert first.assumed  # the probe has not answered yet: the flagged assumption
    c.wait_for_probe()
    assert c.priority_range().source == "queried: GPU 0"
    no_gpu = controller(tmp_path, FakeNvml(driver_missing=True))
    assert no_gpu.priority_range().assumed
    no_gpu.wait_for_probe()
    assert no_gpu.priority_range().assumed


def test_apply_with_defaults_policy_runs_nothing_and_needs_no_idle_gpu(tmp_path: Path) -> None:
    runner = RecordingRunner()
    fake = h200_node(gpu0=FakeGpu(utilization=90, pids=[1]), gpu2=FakeGpu(utilization=90, pids=[2]))
    c = controller(tmp_path, fake, "apply", runner)
    reply = c.apply(apply_req(demo_plan("no-gpuintent", enabled=False)))
    assert reply.mode == gpulane_pb2.APPLY_MODE_APPLY and list(reply.commands) == []
    assert runner.calls == []
    with pytest.raises(FailedPrecondition, match="needs NVML"):
        controller(tmp_path, FakeNvml(driver_missing=True), "apply").apply(
            apply_req(demo_plan("no-gpuintent", enabled=False))
        )
