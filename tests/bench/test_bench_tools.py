"""The benchmark and cross-check tools under bench/ run and report what they claim (small sizes;
the figures themselves are for docs/performance.md, not asserted here)."""

from __future__ import annotations

import ctypes.util
import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"{args[0]} exited {done.returncode}:\n{done.stderr[-4000:]}"
    return done.stdout


def test_plan_digest_is_deterministic_and_depends_on_the_seed() -> None:
    first = _run("bench/plan_digest.py", "--instances", "3", "--seed", "5")
    again = _run("bench/plan_digest.py", "--instances", "3", "--seed", "5")
    other = _run("bench/plan_digest.py", "--instances", "3", "--seed", "6")
    digest = re.search(r"^(\d+) PlanResults, seed 5: sha256 ([0-9a-f]{64})$", first, re.M)
    assert digest is not None, first
    assert int(digest.group(1)) == 3 * 12 * 6  # instances x policies x ticks
    assert first == again and other != first


def test_bench_dmug_prints_every_cell_and_checks_the_fast_phase() -> None:
    out = _run("bench/bench_dmug.py", "--sizes", "10", "--repeats", "2")
    rows = [line.split() for line in out.splitlines() if line.split()[:1] == ["10"]]
    cells = {(r[1], r[2]) for r in rows if len(r) == 14}
    assert cells == {(c, t) for c in ("plenty", "scarce") for t in ("cold", "steady")}
    phase = [r for r in rows if len(r) == 5]
    assert phase and phase[0][-1] == "True"  # water-filling equals the heap greedy


def test_compare_dmug_against_itself_and_refuses_a_non_checkout(tmp_path: Path) -> None:
    out = _run("bench/compare_dmug.py", str(ROOT), "--rounds", "1", "--sizes", "10")
    ratios = re.findall(r"\| 10 \| (plenty|scarce) \| (cold|steady) \|.*\| (\d+\.\d\d)x \|", out)
    assert len(ratios) == 4, out
    done = subprocess.run(
        [sys.executable, "bench/compare_dmug.py", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and "does not hold a PARFusion checkout" in done.stderr


def test_gc_pause_alternates_and_reports_every_cell() -> None:
    out = _run("bench/gc_pause.py", "--sizes", "10", "--ticks", "2", "--heap", "0,100")
    rows = re.findall(
        r"^\| 10 \| (plenty|scarce) \| (cold|steady) \| (0|100) \| .* \| (\d+\.\d\d)x \|$",
        out,
        re.M,
    )
    assert {(c, t, h) for c, t, h, _ in rows} == {
        (c, t, h) for c in ("plenty", "scarce") for t in ("cold", "steady") for h in ("0", "100")
    }, out


def test_bench_loop_times_steady_submit_and_delete_ticks() -> None:
    out = _run("bench/bench_loop.py", "--sizes", "40", "--ticks", "2", "--rounds", "2")
    rows = re.findall(
        r"^\| 40 \| (steady|samples|sampled, idle|submit|delete) \| [\d.]+ \([\d.]+\) \| [\d.]+ \| [\d.]+ \| (\d+) \|",
        out,
        re.M,
    )
    cases = ("steady", "samples", "sampled, idle", "submit", "delete")
    assert rows == [(case, "2") for case in cases], out


def test_bench_submit_drives_every_method_without_errors(tmp_path: Path) -> None:
    """A short run against a real allocator subprocess: all three methods answered, no submit
    failed (the exit status says so), the figures land in the JSON."""
    out = _run(
        "bench/bench_submit.py", "--seconds", "0.6", "--rounds", "2", "--warmup", "0.1",
        "--concurrency", "4", "--max-rate", "4000", "--json", str(tmp_path / "submit.json"),
    )  # fmt: skip
    methods = ("empty unary RPC (coroutine)", "empty unary RPC (thread pool)", "SubmitIntent (")
    for method in methods:
        rows = [line.split()[-7:] for line in out.splitlines() if line.startswith(method)]
        assert len(rows) == 1, out
        calls, errors = int(rows[0][0]), int(rows[0][1])
        assert calls > 0 and errors == 0
    figures = json.loads((tmp_path / "submit.json").read_text())
    assert figures["submit"]["calls"] > 0 and figures["empty_in_pool"]["errors"] == 0
    assert figures["ratio"] > 0


def test_histogram_quantile_reads_one_labelled_series_between_scrapes() -> None:
    """The quantile comes from the named series only (other methods' buckets are ignored) and
    from the difference between the two scrapes, interpolated inside its bucket."""
    from bench import bench_system

    name, submit = bench_system.RPC_HISTOGRAM, 'method="SubmitIntent",service="AllocatorService"'
    other = 'method="GetPlan",service="AllocatorService"'

    def scrape(counts: dict[str, list[float]]) -> dict[str, float]:
        series = {}
        for labels, cumulative in counts.items():
            for le, count in zip(("0.01", "0.02", "0.05", "+Inf"), cumulative, strict=True):
                series[f'{name}_bucket{{le="{le}",{labels}}}'] = count
        return series

    before = scrape({submit: [5, 5, 5, 5], other: [0, 0, 0, 0]})
    # 100 new SubmitIntent calls: 50 below 10 ms, 40 in (10, 20], 10 in (20, 50]
    after = scrape({submit: [55, 95, 105, 105], other: [0, 0, 0, 1000]})
    quantile = bench_system.histogram_quantile
    assert quantile(before, after, 0.5, name, submit) == 0.01
    assert abs(quantile(before, after, 0.7, name, submit) - 0.015) < 1e-9
    assert abs(quantile(before, after, 0.99, name, submit) - 0.047) < 1e-9
    assert quantile(before, after, 0.5, name, other) == float("inf")  # all beyond 50 ms
    assert math.isnan(quantile(before, before, 0.5, name, submit))  # no calls in between


@pytest.mark.slow
@pytest.mark.parametrize("clients", ["process", "thread"])
def test_bench_system_drives_the_real_stack_and_reports_every_column(
    tmp_path: Path, clients: str
) -> None:
    """A short run of the whole stack (real services, modeled node): every call answered, plans
    fresh, the allocator's own handling time read from its histogram beside the client's; the
    GetPlan driver and the streams in processes of their own or in the harness's; memory read
    cold and again after a warm-up on the empty store."""
    out = _run(
        "bench/bench_system.py", "--intents", "20", "--seconds", "2", "--settle", "1",
        "--rate", "40", "--warmup", "1", "--clients", clients,
        "--json", str(tmp_path / "system.json"),
    )  # fmt: skip
    row = json.loads((tmp_path / "system.json").read_text())[0]
    assert row["clients"] == clients
    assert 0 <= row["ticks_over_250_ms"] <= row["ticks"] and row["full_collections"] >= 0
    assert row["intents"] == 20 and row["ticks"] > 0 and row["stale_plans"] == 0
    for call in ("submit", "get_plan"):
        assert row[call]["ok"] == 80 and row[call]["failed"] == 0
        server = row["server_ms"][call]
        assert 0 < server["p50_ms"] <= server["p99_ms"] < 1e3
    for lag in (row["loop_lag_ms"], row["agent_loop_lag_ms"], row["commit_ms"]):
        assert 0 <= lag["p50_ms"] <= lag["p99_ms"] < 1e3
    assert re.search(
        r"^\| 20 \| .*\(\d+\.\d\) \| .*\(\d+\.\d\) \| [\d.]+ / [\d.]+ \|", out, re.M
    ), out
    # the streams asked for deltas and kept the plan from them (PlanMirror raises otherwise)
    assert row["watch_mode"] == "deltas" and row["watched_plans"] > 0
    # the services whose state churns re-executed on jemalloc where it is installed
    expected = "jemalloc" if ctypes.util.find_library("jemalloc") else "pymalloc"
    assert row["malloc"] == {"allocator": expected, "nodeagent": expected, "gpulane": "pymalloc"}
    for name, anon in row["rss_anon_mb"].items():  # a part of the RSS, read beside it
        assert 0 < anon["cold"] < row["rss_mb"][name]["cold"]
        assert 0 < anon["start"] < row["rss_mb"][name]["start"]
        assert 0 < anon["after_delete"] < row["rss_mb"][name]["after_delete"]


@pytest.mark.slow
def test_bench_dashboard_reads_every_panel_of_a_real_stack(tmp_path: Path) -> None:
    """A short run of the page and every panel it polls against a real stack: each answered
    with a body, timed (the tables' cut is tested in tests/dashboard/test_live.py)."""
    _run(
        "bench/bench_dashboard.py", "--intents", "150", "--seconds", "2", "--every", "0.5",
        "--settle", "1", "--json", str(tmp_path / "dashboard.json"),
    )  # fmt: skip
    row = json.loads((tmp_path / "dashboard.json").read_text())[0]
    assert row["intents"] == 150 and 0 < row["rss_mb"]["start"] <= row["rss_mb"]["peak"]
    requests = row["requests"]
    assert set(requests) >= {"/", "/partials/allocator", "/partials/latency"}
    assert all(r["max_bytes"] > 0 and r["median_ms"] > 0 for r in requests.values())


@pytest.mark.slow
def test_bench_memory_serves_the_store_alone_refuses_every_call_and_repeats_rounds() -> None:
    """The modes that tell the store's and the loop's memory apart: with the loop off the
    intents are stored and deleted without a plan; with every call refused nothing is stored;
    every round gets its reading."""
    stored = json.loads(
        _run("bench/bench_memory.py", "--intents", "30", "--loop", "off", "--settle", "0.2")
    )
    assert any(line.startswith("client: 30 submitted") for line in stored["client"]), stored
    assert any(line.startswith("client: 30 deleted") for line in stored["client"]), stored
    assert stored["stored_after"] == 0 and stored["cycles"] == []
    out = _run(
        "bench/bench_memory.py", "--intents", "30", "--loop", "off", "--reject", "--cycles", "2",
        "--settle", "0.2",
    )  # fmt: skip
    refused = json.loads(out)
    lines = refused["client"]
    assert sum("30 submits refused ({'INVALID_ARGUMENT': 30})" in line for line in lines) == 2
    assert sum("30 deletes refused ({'NOT_FOUND': 30})" in line for line in lines) == 2
    assert refused["stored_after"] == 0
    assert len(refused["cycles"]) == 2
    assert all(c["rss_mb"] > 0 for c in refused["cycles"])
    # served as the allocator is: on jemalloc where installed, else on CPython's arenas
    if ctypes.util.find_library("jemalloc"):
        assert all(c["jemalloc"]["allocated_mb"] > 0 for c in refused["cycles"])
        assert (
            stored["jemalloc"]["after"]["active_mb"] >= stored["jemalloc"]["after"]["allocated_mb"]
        )
    else:
        assert all(c["pymalloc"]["arenas"] > 0 and not c["jemalloc"] for c in refused["cycles"])


def test_pinned_arenas_names_the_few_objects_that_keep_an_arena_mapped() -> None:
    # 200,000 two-tuples take a dozen fresh arenas; keeping one in 10,000 leaves each of those
    # arenas mapped for a block or two, which the report must show with the list holding them
    script = (
        "import sys; sys.path.insert(0, '.')\n"
        "from bench.bench_memory import pinned_arenas\n"
        "made = [(i, -i) for i in range(200_000)]\n"
        "kept = made[::10_000]\n"
        "del made\n"
        "print('\\n'.join(pinned_arenas()))\n"
    )
    out = _run("-c", script)
    rows = re.findall(r"^  arena +\d+: +(\d+) blocks in +\d+ pools; (\d+) objects", out, re.M)
    assert rows, out
    held = re.findall(r"held by list\[20\] at [0-9a-f]+: (\d+)", out)
    # the kept tuples sit in arenas of their own, each nearly empty
    assert sum(map(int, held)) >= 10, out
    assert min(int(blocks) for blocks, _ in rows) < 50, out


def test_bench_interpreter_times_calls_inside_and_beside_a_ticking_loop() -> None:
    out = _run(
        "bench/bench_interpreter.py", "--intents", "60", "--seconds", "1", "--rounds", "1",
        "--settle", "0.5", "--rate", "50",
    )  # fmt: skip
    rows = re.findall(r"^\| (idle|inside|beside) \| ([\d,]+) \| (\d+) \| ([\d.]+) \|", out, re.M)
    assert [r[0] for r in rows] == ["idle", "inside", "beside"], out
    for variant, intents, calls, p50 in rows:
        assert int(calls) >= 40 and float(p50) > 0, out
        assert intents == ("0" if variant == "idle" else "60"), out
    # the ticking process did work while the calls were timed
    cpus = re.findall(r"^\| (?:inside|beside) \|.*\| (\d+) \| [\d.]+ \|$", out, re.M)
    assert len(cpus) == 2 and all(int(c) > 0 for c in cpus), out
