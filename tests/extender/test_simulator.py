"""The scheduler simulator is deterministic for a seed and runs the extender's own decisions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from parfusion.cli import main as parfusion
from services.extender.simulator import simulate


@pytest.mark.slow
def test_same_seed_same_report_and_the_extender_keeps_lanes() -> None:
    a = simulate(60, 120, seed=3)
    b = simulate(60, 120, seed=3)
    a.pop("timing_s"), b.pop("timing_s")
    assert a == b
    default, extender = a["arms"]["default"], a["arms"]["extender"]
    assert default["placed"] + default["pending"] == 120
    assert extender["placed"] + extender["pending"] == 120
    # the extender never puts a GPU pod on a node without its lane; the default scheduler does
    assert extender["gpu_lane_mismatches"] == 0 < default["gpu_lane_mismatches"]
    assert extender["deadline_misses"] <= default["deadline_misses"]
    assert extender["extender_calls"] > 0 and default["extender_calls"] == 0
    other = simulate(60, 120, seed=4)
    other.pop("timing_s")
    assert other != a


@pytest.mark.slow
def test_cli_writes_json_and_markdown(tmp_path: Path, home: Path) -> None:
    assert (
        parfusion(
            [
                "sim",
                "k8s",
                "--nodes",
                "30",
                "--pods",
                "40",
                "--seed",
                "1",
                "--out",
                str(tmp_path),
                "--no-progress",
            ]
        )
        == 0
    )
    report = json.loads((tmp_path / "sim_k8s_30n_40p_seed1.json").read_text())
    assert report["config"]["modeled"] is True and set(report["arms"]) == {"default", "extender"}
    text = (tmp_path / "sim_k8s_30n_40p_seed1.md").read_text()
    assert "Modeled, not measured" in text and "| modeled deadline misses |" in text
