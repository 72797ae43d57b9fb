"""GPU co-run: refusals without NVML / on a busy GPU / without a runtime, and report rendering.

NVML is the fake library at the pynvml boundary (no driver here). The report test renders a
result dict that is marked synthetic: its numbers are made up and every output says so. The
measured run itself needs a GPU and is not exercised on this machine.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from experiments.gpu_corun import gate
from experiments.gpu_corun.harness import CorunConfig, ratios, run_corun, summarise
from experiments.gpu_corun.report import SYNTHETIC_BANNER, render_markdown, write_outputs
from experiments.gpu_corun.run import REFUSED, run_gpu_corun
from parfusion.cli import main as cli_main
from services.gpulane.nvml import Nvml
from tests.gpulane.fake_nvml import FakeGpu, FakeNvml, h200_node


def test_refuses_without_nvml(tmp_path: Path) -> None:
    code, message, paths = run_gpu_corun(9, tmp_path, nvml=Nvml(FakeNvml(driver_missing=True)))
    assert code == REFUSED and paths == {}
    assert "needs NVML" in message and "Shared Library Not Found" in message
    assert not any(tmp_path.iterdir())


def test_cli_refuses_on_this_machine(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if Nvml().snapshot().available:
        pytest.skip("this machine has an NVIDIA driver")
    assert cli_main(["bench", "gpu-corun", "--seconds", "6"]) == REFUSED
    assert "refused: GPU co-run needs NVML" in capsys.readouterr().err


def test_refuses_when_candidates_are_busy(tmp_path: Path) -> None:
    fake = h200_node(gpu6=FakeGpu(utilization=70, pids=[1234]), gpu7=FakeGpu(utilization=12))
    code, message, _ = run_gpu_corun(9, tmp_path, nvml=Nvml(fake))
    assert code == REFUSED
    assert "GPU 6 runs compute processes (pid 1234)" in message
    assert "GPU 7 is 12% utilised" in message  # never falls back to another lane's GPU 0


def test_candidates_fall_back_to_present_gpus() -> None:
    fake = h200_node(2, gpu0=FakeGpu(pids=[99]))
    selection = gate.select_gpu(Nvml(fake))
    assert selection.device.index == 1 and selection.candidates == (0, 1)


def test_refuses_without_a_gpu_runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(gate.importlib.util, "find_spec", lambda name: None)
    code, message, _ = run_gpu_corun(9, tmp_path, nvml=Nvml(h200_node()))
    assert code == REFUSED and "needs torch or CuPy" in message


def test_too_short_is_refused(tmp_path: Path) -> None:
    assert run_gpu_corun(1, tmp_path, nvml=Nvml(h200_node()))[0] == REFUSED


def synthetic_result() -> dict:
    def phase(p50, p95, p99, prio, batch=None):
        out = {
            "online": {
                "count": 1000,
                "p50_ms": p50,
                "p95_ms": p95,
                "p99_ms": p99,
                "mean_ms": p50,
                "stream_priority": prio,
            }
        }
        if batch:
            out["batch"] = dict(
                zip(("tflops", "block_rows", "inflight", "stream_priority"), batch, strict=True)
            )
        return out

    phases = {
        "alone": phase(0.20, 0.25, 0.30, 0),
        "baseline": phase(1.10, 4.00, 6.00, 0, (600.0, 8192, 8, 0)),
        "parfusion": phase(0.30, 0.50, 0.60, -5, (480.0, 1024, 2, 0)),
    }
    return {
        "benchmark": "gpu-corun",
        "synthetic": True,
        "device": {"index": 6, "name": "NVIDIA H200", "driver_version": "570.86.15"},
        "runtime": "synthetic",
        "config": {"phase_seconds": 10},
        "command": "parfusion bench gpu-corun --seconds 30",
        "priority_range": {"least": 0, "greatest": -5},
        "phases": phases,
        "ratios": ratios(phases),
    }


def test_ratios_and_summary() -> None:
    r = synthetic_result()["ratios"]
    assert r["p99_baseline_over_alone"] == pytest.approx(20.0)
    assert r["p99_parfusion_over_baseline"] == pytest.approx(0.1)
    assert r["batch_tflops_parfusion_over_baseline"] == pytest.approx(0.8)
    s = summarise([1.0] * 98 + [10.0, 20.0])
    assert s["count"] == 100 and s["p50_ms"] == 1.0 and s["p99_ms"] > 10.0


def test_report_rendering_of_a_synthetic_result(tmp_path: Path) -> None:
    result = synthetic_result()
    md = render_markdown(result, "fig.png")
    assert SYNTHETIC_BANNER in md
    assert "| baseline | 1.100 | 4.000 | 6.000 | 1000 | 0 | 600.0 | 8192 | 8 | 0 |" in md
    assert "| alone | 0.200 | 0.250 | 0.300 | 1000 | 0 | - | - | - | - |" in md
    assert "parfusion / baseline: **0.10x**" in md
    paths = write_outputs(result, tmp_path, "20260101T000000Z")
    assert paths["json"].name == "gpu-corun-20260101T000000Z-synthetic.json"
    assert json.loads(paths["json"].read_text())["synthetic"] is True
    assert paths["figure"].parent == tmp_path / "figures" and paths["figure"].stat().st_size > 1000
    assert paths["report"].parent == tmp_path / "reports"
    assert "../figures/gpu-corun-20260101T000000Z-synthetic.png" in paths["report"].read_text()


class HostOps:
    """The GPU boundary replaced by host sleeps, to check the phase logic (not GPU behaviour)."""

    name, version = "host", "test"

    def __init__(self) -> None:
        self.streams: list[int] = []
        self.pending = 0

    def priority_range(self) -> tuple[int, int]:
        return 0, -5

    def stream(self, priority: int) -> int:
        self.streams.append(priority)
        return priority

    def online_request(self, stream: int) -> None:
        time.sleep(0.0002)

    def batch_block(self, stream: int, rows: int) -> None:
        self.pending += rows

    def sync(self, stream: int) -> None:
        time.sleep(self.pending * 1e-7)
        self.pending = 0


def test_phases_use_the_planned_priorities_and_throttle() -> None:
    ops = HostOps()
    cfg = CorunConfig(
        phase_seconds=0.3, batch_n=1024, parfusion_block_rows=128, throttled_inflight=2
    )
    result = run_corun(ops, cfg)
    phases = result["phases"]
    assert phases["alone"]["online"]["stream_priority"] == 0 and "batch" not in phases["alone"]
    assert (
        phases["baseline"]["batch"]["block_rows"] == 1024
        and phases["baseline"]["batch"]["inflight"] == 8
    )
    assert phases["parfusion"]["online"]["stream_priority"] == -5
    assert phases["parfusion"]["batch"] | {"tflops": 0, "blocks": 0, "seconds": 0} == {
        "tflops": 0, "blocks": 0, "seconds": 0, "stream_priority": 0, "block_rows": 128, "inflight": 2,
    }  # fmt: skip
    for name in ("alone", "baseline", "parfusion"):
        online = phases[name]["online"]
        assert online["count"] > 50 and 0 < online["p50_ms"] <= online["p95_ms"] <= online["p99_ms"]
    assert phases["baseline"]["batch"]["tflops"] > 0 and phases["parfusion"]["batch"]["blocks"] > 0
    assert set(result["ratios"]) == {
        "p99_baseline_over_alone", "p99_parfusion_over_alone",
        "p99_parfusion_over_baseline", "batch_tflops_parfusion_over_baseline",
    }  # fmt: skip
