"""Runs one experiment: every policy over the same seeded scenario, then JSON, figures, report.

Each policy gets its own modeled node with the same seed, so every policy faces the very same
requests (common random numbers) and the differences are the policies'. Policies run in
parallel worker processes when there are several (each run is independent and seeded, so the
result does not depend on the order they finish); they report their ticks to the progress bar
through a queue. The JSON's ``meta`` block holds the only
run-dependent fields (timestamp, wall time); everything else is a function of the seed, the
run length and configs/model.yaml.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from experiments.metrics import summarize
from experiments.runner import run_policy
from experiments.scenario import load_scenario
from services.sim.params import default_model_path, load_model_params

MODELED_STATEMENT = (
    "All latencies, throughputs and response times in this report are modeled, not measured: "
    "they come from the PARFusion modeled node (configs/model.yaml) driven by the real policy "
    "core, not from running workloads."
)


@dataclass(frozen=True)
class ExperimentSpec:
    name: str  # "compare", "dynamic", "ablation"
    scenario: str  # event list in configs/model.yaml scenario.events
    policies: tuple[str, ...]


PROGRESS_EVERY = 8  # ticks between progress reports from a worker process

_progress_queue: Any = None  # set in each worker process by _init_worker


def _init_worker(queue: Any) -> None:
    global _progress_queue
    _progress_queue = queue


def _run_one(args: tuple[str, str, float, int, str]) -> dict[str, Any]:
    policy, scenario_name, seconds, seed, model_path = args
    params = load_model_params(model_path)
    scenario = load_scenario(params, scenario_name, seconds)
    done = 0

    def on_tick() -> None:
        nonlocal done
        done += 1
        if _progress_queue is not None and done % PROGRESS_EVERY == 0:
            _progress_queue.put(PROGRESS_EVERY)

    result = summarize(run_policy(policy, scenario, params, seed, on_tick=on_tick))
    if _progress_queue is not None and done % PROGRESS_EVERY:
        _progress_queue.put(done % PROGRESS_EVERY)
    return result


def run_experiment(
    spec: ExperimentSpec,
    seconds: float,
    seed: int,
    *,
    model_path: str | os.PathLike[str] | None = None,
    progress: bool = True,
    workers: int | None = None,
) -> dict[str, Any]:
    """The experiment's JSON document (not yet written)."""
    from tqdm import tqdm

    path = Path(model_path) if model_path else default_model_path()
    params = load_model_params(path)
    scenario = load_scenario(params, spec.scenario, seconds)
    started = time.perf_counter()
    jobs = [(p, spec.scenario, seconds, seed, str(path)) for p in spec.policies]
    workers = workers or min(len(jobs), os.cpu_count() or 1, 4)
    ticks = max(1, round(seconds / (params.tick_ms / 1000.0)))
    bar = tqdm(
        total=len(jobs) * ticks,
        desc=f"{spec.name}: {len(jobs)} policies x {seconds:g} s modeled",
        unit="tick",
        disable=not progress,
    )
    queue: Any = multiprocessing.get_context("fork").SimpleQueue()
    results: dict[str, dict[str, Any]] = {}
    if workers <= 1 or len(jobs) == 1:
        _init_worker(queue)
        try:
            for job in jobs:
                results[job[0]] = _run_one(job)
                while not queue.empty():
                    bar.update(queue.get())
        finally:
            _init_worker(None)
    else:
        context = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(
            max_workers=workers, mp_context=context, initializer=_init_worker, initargs=(queue,)
        ) as pool:
            futures = {pool.submit(_run_one, job): job[0] for job in jobs}
            pending = set(futures)
            while pending:
                finished, pending = wait(pending, timeout=0.1, return_when=FIRST_COMPLETED)
                while not queue.empty():
                    bar.update(queue.get())
                for future in finished:
                    results[futures[future]] = future.result()
    while not queue.empty():
        bar.update(queue.get())
    bar.close()
    wall = time.perf_counter() - started
    return {
        "experiment": spec.name,
        "statement": MODELED_STATEMENT,
        "modeled": True,
        "seed": seed,
        "seconds": seconds,
        "tick_ms": params.tick_ms,
        "cpu_units": params.cpu_units,
        "policies": list(spec.policies),
        "model": {
            "path": "configs/model.yaml" if path == default_model_path() else str(path),
            "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        },
        "scenario": {
            "name": spec.scenario,
            "intents": [i.id for i in scenario.intents],
            "urgent_intent": scenario.urgent.id,
            "events": [e.describe() for e in scenario.events],
        },
        "results": {p: results[p] for p in spec.policies},
        "meta": {
            "generated_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "wall_s": round(wall, 3),
        },
    }


def comparable(doc: dict[str, Any]) -> str:
    """The part of the document a seed determines (everything but ``meta``), canonical JSON."""
    return json.dumps({k: v for k, v in doc.items() if k != "meta"}, sort_keys=True)


def write_json(doc: dict[str, Any], results_dir: Path) -> Path:
    results_dir.mkdir(parents=True, exist_ok=True)
    out = results_dir / f"experiment_{doc['experiment']}.json"
    out.write_text(json.dumps(doc, indent=1) + "\n")
    return out


def default_results_dir() -> Path:
    from services.common.config import ConfigError, build_settings, project_home

    try:
        return build_settings("experiments").results_dir
    except ConfigError:
        return project_home() / "results"


def policies_known(names: Sequence[str]) -> None:
    from services.core.policies.registry import get_policy

    for name in names:
        get_policy(name)  # InvalidArgument naming the unknown policy


def run_and_report(
    spec: ExperimentSpec,
    seconds: float,
    seed: int,
    results_dir: Path,
    *,
    title: str,
    findings: Callable[[dict[str, Any]], list[str]],
    sections: Callable[[dict[str, Any]], list[str]] = lambda _doc: [],
    units_policies: Sequence[str] = ("parfusion",),
    progress: bool = True,
) -> tuple[Path, Path]:
    """Run, write the JSON, render figures and the report; (json path, report path)."""
    from experiments import report

    doc = run_experiment(spec, seconds, seed, progress=progress)
    json_path = write_json(doc, results_dir)
    md = report.render(
        doc,
        results_dir,
        title=title,
        findings=findings(doc),
        sections=sections(doc),
        units_policies=units_policies,
        json_path=json_path,
    )
    return json_path, md
