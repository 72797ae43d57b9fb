"""The headless experiments' workload: intents, the urgent robot event and disturbances.

Read from configs/model.yaml's ``scenario`` section. Intents are intent documents validated
exactly as SubmitIntent validates them (services.core.validation), and disturbances are
``parfusion.v1.Disturbance`` messages handed to the node's InjectDisturbance path, so the
experiments feed the system through the same doors a user does. Event times are fractions of
the run, so ``--seconds N`` keeps the scenario's shape; each fires half a tick after its
nominal time, so the controller's reaction includes the wait for its next tick, as a real
event's would on average.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from parfusion.v1 import intent_pb2, telemetry_pb2
from services.common.config import ConfigError
from services.core import convert, validation
from services.sim.params import ModelParams


@dataclass(frozen=True)
class Event:
    at_s: float
    # "urgent_start", "urgent_end", "fleet_start", "fleet_end", "disturbance", "load" or "drift"
    kind: str
    disturbance: telemetry_pb2.Disturbance | None = None
    intent_id: str = ""  # load / drift: the intent it changes; fleet: the one it copies
    factor: float = 1.0  # load: x its declared arrival rate; drift: x its real service time
    count: int = 0  # fleet: how many copies join

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"at_s": round(self.at_s, 6), "kind": self.kind}
        if self.kind in ("load", "drift"):
            out.update(intent=self.intent_id, factor=self.factor)
        if self.kind in ("fleet_start", "fleet_end"):
            out.update(intent=self.intent_id, count=self.count)
        if self.disturbance is not None:
            d = self.disturbance
            out.update(
                cpu_pressure=d.cpu_pressure,
                gpu_pressure=d.gpu_pressure,
                network_pressure=d.network_pressure,
                duration_s=round(d.duration_s, 6),
            )
        return out


@dataclass(frozen=True)
class Scenario:
    name: str
    seconds: float
    intents: tuple[intent_pb2.ResourceIntent, ...]
    urgent: intent_pb2.ResourceIntent
    events: tuple[Event, ...]


def _intent(doc: Mapping[str, Any], lanes: Sequence[str], where: str) -> intent_pb2.ResourceIntent:
    try:
        return validation.normalize_intent(convert.intent_from_document(doc), known_lanes=lanes)
    except Exception as exc:  # InvalidArgument names the field; say which intent it was
        raise ConfigError(f"{where}: {exc}") from exc


def load_scenario(params: ModelParams, name: str, seconds: float) -> Scenario:
    raw = params.scenario
    lanes = tuple(params.lanes)
    docs = raw.get("intents") or []
    intents = tuple(_intent(d, lanes, f"scenario.intents[{i}]") for i, d in enumerate(docs))
    urgent_raw = raw.get("urgent_event") or {}
    urgent = _intent(urgent_raw.get("intent") or {}, lanes, "scenario.urgent_event.intent")
    duration = float(urgent_raw.get("duration_s", 3.0))
    table = (raw.get("events") or {}).get(name)
    if table is None:
        raise ConfigError(f"scenario.events.{name}: no such event list")
    half_tick = params.tick_ms / 2000.0
    events: list[Event] = []
    for i, e in enumerate(table):
        at = float(e["at"]) * seconds + half_tick
        if e["kind"] == "urgent":
            events.append(Event(at, "urgent_start"))
            events.append(Event(at + duration, "urgent_end"))
        elif e["kind"] == "disturbance":
            events.append(
                Event(
                    at,
                    "disturbance",
                    telemetry_pb2.Disturbance(
                        cpu_pressure=float(e.get("cpu_pressure", 0.0)),
                        gpu_pressure=float(e.get("gpu_pressure", 0.0)),
                        network_pressure=float(e.get("network_pressure", 0.0)),
                        duration_s=float(e["duration_fraction"]) * seconds,
                        source=f"experiment:{name}",
                    ),
                )
            )
        elif e["kind"] in ("load", "drift", "fleet"):
            known = {x.id for x in intents}
            if e.get("intent") not in known:
                raise ConfigError(f"scenario.events.{name}[{i}].intent: one of {sorted(known)}")
            if e["kind"] == "fleet":
                count = e.get("count")
                if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= 64:
                    raise ConfigError(f"scenario.events.{name}[{i}].count: expected 1..64")
                span = float(e["duration_fraction"]) * seconds
                events.append(Event(at, "fleet_start", intent_id=e["intent"], count=count))
                events.append(Event(at + span, "fleet_end", intent_id=e["intent"], count=count))
                continue
            factor = float(e.get("factor", 1.0))
            if not 0.0 < factor <= 10.0:
                raise ConfigError(f"scenario.events.{name}[{i}].factor: expected (0, 10]")
            events.append(Event(at, e["kind"], intent_id=e["intent"], factor=factor))
        else:
            raise ConfigError(
                f"scenario.events.{name}[{i}].kind: urgent, disturbance, load, drift or fleet"
            )
    events.sort(key=lambda ev: ev.at_s)
    return Scenario(name, seconds, intents, urgent, tuple(events))
