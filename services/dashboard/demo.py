"""The guided demo: baseline -> PARFusion -> urgent robot event -> disturbance -> recovery.

It runs server-side as one asyncio task in the dashboard's lifespan, so every open page (and a
reload) shows the same current stage. Each stage does its work through the services' own APIs —
AllocatorService.SetPolicy, the bridge's /api/mission, /api/urgent and /api/tick, and
NodeAgentService.InjectDisturbance on the modeled node — then holds for its share of the demo
while the cockpit shows the consequence. Captions say what a stage does, never how it turns
out: each stage's outcome lines are the services' answers and what they report at its end. A
failing call is shown next to its stage's caption and the demo goes on; nothing is simulated
in the page. Stopped or finished, the demo puts back what it changed (policy, mission,
disturbance; services/dashboard/demo_restore.py) and says what the services report after.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from services.dashboard import metrics
from services.dashboard.clients import ActionError, ServiceClients
from services.dashboard.demo_restore import DemoChanges, observed_recovery, restore
from services.dashboard.timeline import Timeline

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DemoConfig:
    stage_seconds: float = 14.0
    tick_seconds: float = (
        0.5  # how often the demo advances the robot (the bridge's ticker is off by default)
    )
    disturbance_cpu: float = 0.6
    disturbance_gpu: float = 0.5
    disturbance_network: float = 0.4
    urgent_name: str = "obstacle-stop"
    urgent_deadline_ms: float = 300.0
    urgent_work: int = 6
    mission_steps: int = 400
    mission_safe_point_interval: int = 5
    mission_deadline_ms: float = 600000.0
    intents_path: Path | None = None  # submitted when the allocator's store is empty


@dataclass(frozen=True)
class Stage:
    key: str
    title: str
    caption: str


STAGES: tuple[Stage, ...] = (
    Stage(
        "baseline",
        "Baseline",
        "The demo sets the baseline policy (Kubernetes-default behaviour: static requests and "
        "equal shares) and starts a robot mission. Watch the online p99 against its deadline "
        "and the miss rate.",
    ),
    Stage(
        "parfusion",
        "PARFusion",
        "The demo switches to the PARFusion policy: D-MUG gives each deadline intent the fewest "
        "units whose predicted p99 meets its deadline and the rest by marginal utility. Watch "
        "slack and risk in the table.",
    ),
    Stage(
        "urgent",
        "Urgent robot event",
        "The demo raises an urgent robot event: the bridge stops the mission at a safe point, "
        "checkpoints it and asks the allocator for an URGENT intent. The lines below are what "
        "the bridge answered and what the services report at the end of the stage.",
    ),
    Stage(
        "disturbance",
        "Disturbance",
        "The demo injects CPU, GPU and network interference into the modeled node for this "
        "stage. The allocator re-plans each tick and, where a deadline cannot be met, may walk "
        "the degradation ladder (FP16, INT8); the lines below say where it went.",
    ),
    Stage(
        "recovery",
        "Recovery",
        "The disturbance runs out and the demo holds while the services settle. The lines below "
        "are what the node, the robot and the allocator report now: the degradation level of "
        "each online intent the chart draws, whether the mission has resumed.",
    ),
)


@dataclass
class StageRecord:
    key: str
    started_at: float
    outcomes: list[str] = field(default_factory=list)


class GuidedDemo:
    def __init__(
        self,
        clients: ServiceClients,
        timeline: Timeline,
        config: DemoConfig,
        on_change: Callable[[], None] = lambda: None,
        observed: Callable[[], str] = lambda: "",
    ) -> None:
        self.clients = clients
        self.timeline = timeline
        self.config = config
        self.on_change = on_change
        self.observed = observed  # one line of what the services report now, closing each stage
        self.status = "idle"  # idle, running, done, stopped
        self.started_at: float | None = None
        self.stage_index = -1
        self.records: list[StageRecord] = []
        self.changes = DemoChanges()  # what this run changed, put back when it ends
        self._task: asyncio.Task[None] | None = None
        self._ticker: asyncio.Task[None] | None = None
        self._finishing = False  # the last stage is over and the restore is under way

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    @property
    def total_seconds(self) -> float:
        return self.config.stage_seconds * len(STAGES)

    def start(self) -> bool:
        """Start from the first stage; False (and nothing changes) when a demo already runs."""
        if self.running:
            return False
        self.status = "running"
        self.started_at = time.time()
        self.stage_index = -1
        self.records = []
        self.changes = DemoChanges()
        self._finishing = False
        self._task = asyncio.create_task(self._play(), name="guided-demo")
        return True

    async def stop(self) -> None:
        """Stop the stages and put back what they changed; a finishing run completes its restore."""
        if self._finishing and self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for task in (self._task, self._ticker):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if self.status == "running":
            self.status = "stopped"
            self.timeline.note(time.time(), "stage", "guided demo stopped")
            await self._put_back()
        metrics.DEMO_STAGE.set(0)

    async def _put_back(self) -> None:
        changes, self.changes = self.changes, DemoChanges()
        if not changes.any:
            return
        # An urgent task gets the ticks its work needs (and a margin) before the mission ends.
        lines = await restore(self.clients, changes, urgent_ticks=4 * self.config.urgent_work + 10)
        log.info("demo restored", extra={"outcomes": lines})
        if self.records:
            self.records[-1].outcomes.extend(lines)
        self.on_change()

    def view(self) -> dict[str, Any]:
        now = time.time()
        stage_elapsed = 0.0
        if self.status == "running" and self.records:
            stage_elapsed = min(now - self.records[-1].started_at, self.config.stage_seconds)
        outcomes = {r.key: r.outcomes for r in self.records}
        return {
            "status": self.status,
            "running": self.running,
            "stage_index": self.stage_index,
            "current": STAGES[self.stage_index] if 0 <= self.stage_index < len(STAGES) else None,
            "stages": [
                {
                    "number": i + 1,
                    "stage": s,
                    "state": (
                        "done"
                        if i < self.stage_index or (self.status == "done" and i == self.stage_index)
                        else "active"
                        if i == self.stage_index and self.status == "running"
                        else "pending"
                    ),
                    "outcomes": outcomes.get(s.key, []),
                }
                for i, s in enumerate(STAGES)
            ],
            "stage_seconds": self.config.stage_seconds,
            "stage_progress": stage_elapsed / self.config.stage_seconds
            if self.config.stage_seconds
            else 1.0,
            "total_seconds": self.total_seconds,
        }

    async def _play(self) -> None:
        actions: dict[str, Callable[[], Awaitable[list[str]]]] = {
            "baseline": self._baseline,
            "parfusion": self._parfusion,
            "urgent": self._urgent,
            "disturbance": self._disturbance,
            "recovery": self._recovery,
        }
        self._ticker = asyncio.create_task(self._tick_robot(), name="guided-demo-ticker")
        try:
            for index, stage in enumerate(STAGES):
                self.stage_index = index
                record = StageRecord(stage.key, time.time())
                self.records.append(record)
                metrics.DEMO_STAGE.set(index + 1)
                self.timeline.note(record.started_at, "stage", f"{index + 1} {stage.title}")
                record.outcomes = await actions[stage.key]()
                log.info("demo stage", extra={"stage": stage.key, "outcomes": record.outcomes})
                self.on_change()
                remaining = self.config.stage_seconds - (time.time() - record.started_at)
                if remaining > 0:
                    await asyncio.sleep(remaining)
                seen = self.observed()
                if seen:
                    record.outcomes.append(f"at the end: {seen}")
            self._finishing = True
            await self._stop_ticker()
            await self._put_back()
            self.status = "done"
            self.timeline.note(time.time(), "stage", "guided demo done")
        finally:
            self._finishing = False
            await self._stop_ticker()
            metrics.DEMO_STAGE.set(0)

    async def _stop_ticker(self) -> None:
        ticker, self._ticker = self._ticker, None
        if ticker is not None and not ticker.done():
            ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await ticker

    async def _attempt(
        self, what: str, call: Awaitable[Any], describe: Callable[[Any], str]
    ) -> str:
        try:
            result = await call
        except ActionError as exc:
            metrics.ACTIONS.labels(action=f"demo-{what}", outcome="error").inc()
            return f"{what} failed: {exc}"
        metrics.ACTIONS.labels(action=f"demo-{what}", outcome="ok").inc()
        return describe(result)

    async def _set_policy(self, name: str) -> str:
        def done(reply: Any) -> str:
            if not self.changes.policy_before:  # the first change: what to go back to
                self.changes.policy_before = reply.previous
            return f"SetPolicy {reply.active} (was {reply.previous or 'none'})"

        return await self._attempt("SetPolicy", self.clients.set_policy(name), done)

    async def _baseline(self) -> list[str]:
        outcomes = [await self._seed_intents(), await self._set_policy("baseline")]
        outcomes.append(await self._ensure_mission())
        return [o for o in outcomes if o]

    async def _parfusion(self) -> list[str]:
        return [await self._set_policy("parfusion")]

    async def _urgent(self) -> list[str]:
        cfg = self.config
        body = {
            "name": cfg.urgent_name,
            "deadline_ms": cfg.urgent_deadline_ms,
            "work": cfg.urgent_work,
        }
        outcome = await self._attempt(
            "urgent",
            self.clients.bridge_post("/api/urgent", body),
            lambda r: (
                f"POST /api/urgent {cfg.urgent_name} (deadline {cfg.urgent_deadline_ms:.0f} ms)"
                + (f": robot {r.get('state')}" if isinstance(r, dict) and r.get("state") else "")
            ),
        )
        self.timeline.note(time.time(), "urgent", f"urgent {cfg.urgent_name}")
        return [outcome]

    async def _disturbance(self) -> list[str]:
        cfg = self.config

        def done(reply: Any) -> str:
            self.changes.disturbance = self.changes.disturbance or bool(reply.accepted)
            return (
                f"InjectDisturbance cpu {cfg.disturbance_cpu:.0%} gpu {cfg.disturbance_gpu:.0%} "
                f"net {cfg.disturbance_network:.0%} for {cfg.stage_seconds:.0f} s"
                + ("" if reply.accepted else f": refused by the {reply.backend or 'node'} backend")
            )

        outcome = await self._attempt(
            "InjectDisturbance",
            self.clients.inject_disturbance(
                cpu=cfg.disturbance_cpu,
                gpu=cfg.disturbance_gpu,
                network=cfg.disturbance_network,
                duration_s=cfg.stage_seconds,
                source="guided-demo",
            ),
            done,
        )
        return [outcome]

    async def _recovery(self) -> list[str]:
        return await observed_recovery(self.clients)

    async def _seed_intents(self) -> str:
        listing = await self.clients.list_intents()
        if not listing.ok:
            return f"ListIntents failed: {listing.error}"
        if listing.value is not None and len(listing.value.intents) > 0:
            return ""
        path = self.config.intents_path
        if path is None or not path.exists():
            return "the allocator holds no intents and no demo intents are configured"
        from services.core.convert import intents_in_file

        files = (
            sorted(path.glob("*.y*ml")) + sorted(path.glob("*.json")) if path.is_dir() else [path]
        )
        submitted = 0
        for file in files:
            for intent in intents_in_file(file):
                try:
                    await self.clients.submit_intent(intent)
                    submitted += 1
                except ActionError as exc:
                    return f"SubmitIntent {intent.name} failed: {exc}"
        return f"submitted {submitted} demo intents from {path.name}"

    async def _ensure_mission(self) -> str:
        state = await self.clients.bridge_state()
        if not state.ok:
            return f"robot mission not started: {state.error}"
        current = state.value.get("state") if isinstance(state.value, dict) else None
        if current not in ("IDLE", "COMPLETED"):
            return f"robot already {current}"
        cfg = self.config
        body = {
            "steps": cfg.mission_steps,
            "safe_point_interval": cfg.mission_safe_point_interval,
            "deadline_ms": cfg.mission_deadline_ms,
        }

        def done(reply: Any) -> str:
            if isinstance(reply, dict) and reply.get("mission_id"):
                self.changes.mission_id = str(reply["mission_id"])
            return f"POST /api/mission ({cfg.mission_steps} steps)"

        return await self._attempt("mission", self.clients.bridge_post("/api/mission", body), done)

    async def _tick_robot(self) -> None:
        """Advance the robot at demo pace unless the bridge runs its own ticker; refusals ignored."""
        state = await self.clients.bridge_state()
        if state.ok and isinstance(state.value, dict) and state.value.get("background_ticker"):
            return
        while True:
            await asyncio.sleep(self.config.tick_seconds)
            with contextlib.suppress(ActionError):
                await self.clients.bridge_post("/api/tick", {})
