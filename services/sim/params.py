"""The modeled node's parameters, read once from configs/model.yaml into frozen dataclasses.

Both users of the model (the node agent's and GPU-lane service's ``modeled`` backends, and the
headless experiments) load the same file through ``load_model_params``, so a value changed
there changes both. configs/model.yaml documents where every value comes from.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from services.common.config import ConfigError, resolve_input

LEVELS = ("NORMAL", "FP16", "INT8")
CLASSES = ("ONLINE", "BATCH", "ROBOT", "URGENT")


@dataclass(frozen=True, slots=True)
class WorkMix:
    """Share of one request's time spent on the GPU and on the network; the rest is CPU."""

    gpu_fraction: float = 0.0
    network_fraction: float = 0.0

    @property
    def cpu_fraction(self) -> float:
        return 1.0 - self.gpu_fraction - self.network_fraction


@dataclass(frozen=True, slots=True)
class Interference:
    cpu_gain: float = 1.0
    leak_shared: float = 1.0
    leak_deprioritised: float = 0.2
    leak_separate_cpus: float = 0.05
    gpu_gain: float = 1.0
    gpu_leak_priority: float = 0.3
    gpu_priority_shield: float = 0.5
    max_pressure: float = 0.9


@dataclass(frozen=True, slots=True)
class ModelParams:
    node_name: str = "node-0"
    cpu_units: int = 16
    gpu_count: int = 8
    gpu_name: str = "NVIDIA H200"
    gpu_memory_bytes: int = 150754820096
    lanes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    tick_ms: float = 250.0
    sigma: float = 0.12
    drop_after_deadlines: float = 4.0
    recent_samples_max: int = 256
    window_s: float = 10.0
    mix: Mapping[str, WorkMix] = field(default_factory=dict)
    interference: Interference = field(default_factory=Interference)
    degradation_gpu: Mapping[str, float] = field(default_factory=dict)
    degradation_cpu: Mapping[str, float] = field(default_factory=dict)
    scenario: Mapping[str, Any] = field(default_factory=dict)

    def mix_for(self, workload_class: str) -> WorkMix:
        return self.mix.get(workload_class, WorkMix())


def default_model_path() -> Path:
    explicit = os.environ.get("PARFUSION_MODEL_CONFIG")
    return Path(explicit) if explicit else resolve_input("configs/model.yaml")


def _number(section: Mapping[str, Any], key: str, where: str, lo: float, hi: float) -> float:
    value = section.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where}.{key}: expected a number, got {value!r}")
    if not lo <= float(value) <= hi:
        raise ConfigError(f"{where}.{key}: expected a value in [{lo}, {hi}], got {value}")
    return float(value)


def _levels(section: Mapping[str, Any], where: str) -> dict[str, float]:
    if not isinstance(section, Mapping) or set(section) != set(LEVELS):
        raise ConfigError(f"{where}: expected exactly the levels {', '.join(LEVELS)}")
    return {level: _number(section, level, where, 0.01, 1.0) for level in LEVELS}


def parse_model_params(doc: Mapping[str, Any]) -> ModelParams:
    """Validated parameters; a missing or out-of-range key is a ConfigError naming it."""
    node = doc.get("node") or {}
    st = doc.get("service_time") or {}
    inter = doc.get("interference") or {}
    deg = doc.get("degradation") or {}
    mixes: dict[str, WorkMix] = {}
    for cls in CLASSES:
        raw = (doc.get("mix") or {}).get(cls)
        if not isinstance(raw, Mapping):
            raise ConfigError(f"mix.{cls}: missing")
        mix = WorkMix(
            gpu_fraction=_number(raw, "gpu_fraction", f"mix.{cls}", 0.0, 1.0),
            network_fraction=_number(raw, "network_fraction", f"mix.{cls}", 0.0, 1.0),
        )
        if mix.cpu_fraction < 0:
            raise ConfigError(f"mix.{cls}: gpu_fraction + network_fraction exceeds 1")
        mixes[cls] = mix
    lanes_raw = node.get("lanes") or {}
    if not isinstance(lanes_raw, Mapping):
        raise ConfigError("node.lanes: expected a mapping of lane name to GPU indexes")
    gpu_count = int(_number(node, "gpu_count", "node", 0, 64))
    lanes: dict[str, tuple[int, ...]] = {}
    for lane, indexes in lanes_raw.items():
        if not isinstance(indexes, list) or not all(isinstance(i, int) for i in indexes):
            raise ConfigError(f"node.lanes.{lane}: expected a list of GPU indexes")
        lanes[str(lane)] = tuple(i for i in indexes if 0 <= i < gpu_count)
    return ModelParams(
        node_name=str(node.get("name", "node-0")),
        cpu_units=int(_number(node, "cpu_units", "node", 1, 4096)),
        gpu_count=gpu_count,
        gpu_name=str(node.get("gpu_name", "NVIDIA H200")),
        gpu_memory_bytes=int(_number(node, "gpu_memory_bytes", "node", 0, 1e13)),
        lanes=lanes,
        tick_ms=_number(node, "tick_ms", "node", 10, 10_000),
        sigma=_number(st, "sigma", "service_time", 0.0, 2.0),
        drop_after_deadlines=_number(st, "drop_after_deadlines", "service_time", 1.0, 1000.0),
        recent_samples_max=int(_number(st, "recent_samples_max", "service_time", 1, 100_000)),
        window_s=_number(st, "window_s", "service_time", 0.5, 3600.0),
        mix=mixes,
        interference=Interference(
            **{
                name: _number(inter, name, "interference", 0.0, 100.0)
                for name in Interference.__slots__  # type: ignore[attr-defined]
            }
        ),
        degradation_gpu=_levels(deg.get("gpu") or {}, "degradation.gpu"),
        degradation_cpu=_levels(deg.get("cpu") or {}, "degradation.cpu"),
        scenario=dict(doc.get("scenario") or {}),
    )


def load_model_params(path: str | os.PathLike[str] | None = None) -> ModelParams:
    cfg = Path(path) if path else default_model_path()
    try:
        doc = yaml.safe_load(cfg.read_text()) or {}
    except OSError as exc:
        raise ConfigError(f"cannot read model config {cfg}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"model config {cfg} is not valid YAML: {exc}") from exc
    if not isinstance(doc, Mapping):
        raise ConfigError(f"model config {cfg}: top level must be a mapping")
    return parse_model_params(doc)
