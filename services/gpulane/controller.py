"""The lane controller: the GPU side of the node loop (ApplyGpuPlan, PreviewCommands, telemetry).

Each tick the allocator's GpuPlan is placed on the present GPUs (planner), turned into exact
MPS / MIG commands and environment (previews), recorded under run/ when it changed, and, only
in apply mode and only on GPUs NVML shows idle, the MPS lines are executed. Dependencies (the
NVML adapter, the command runner, the lane-load source, the stream-priority probe) come in
through the constructor so tests replace the hardware boundary and nothing else.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from parfusion.v1 import gpulane_pb2, intent_pb2, telemetry_pb2
from services.common.errors import FailedPrecondition
from services.gpulane import convert, metrics, mig
from services.gpulane.apply import execute_mps
from services.gpulane.backend import LaneLoadSource
from services.gpulane.lanes import LaneSpec, LaneView, resolve_lanes
from services.gpulane.nvml import DEFAULT_IDLE_UTILIZATION_PERCENT, Nvml, NvmlSnapshot
from services.gpulane.planner import LanePlacement, lane_shares, place
from services.gpulane.previews import Preview, build_preview
from services.gpulane.priority import ASSUMED_RANGE, PriorityRange
from services.gpulane.recorder import PlanRecorder, fingerprint
from services.gpulane.runner import CommandRunner

log = logging.getLogger(__name__)

DRY_RUN, APPLY = gpulane_pb2.APPLY_MODE_DRY_RUN, gpulane_pb2.APPLY_MODE_APPLY


@dataclass(frozen=True)
class LaneOptions:
    lanes: tuple[LaneSpec, ...]
    mode: str = "dry-run"  # or "apply"
    reference_preview: bool = True
    idle_utilization_percent: float = DEFAULT_IDLE_UTILIZATION_PERCENT
    snapshot_ttl_s: float = 0.5


class LaneController:
    def __init__(
        self,
        options: LaneOptions,
        *,
        nvml: Nvml,
        recorder: PlanRecorder,
        load_source: LaneLoadSource,
        runner: CommandRunner | None = None,
        priority_probe: Callable[[int], PriorityRange] | None = None,
        own_pids: Callable[[], Iterable[int]] = tuple,
    ) -> None:
        self.options = options
        self._nvml = nvml
        self._recorder = recorder
        self._load = load_source
        self._runner = runner or CommandRunner()
        self._probe = priority_probe
        self._own_pids = own_pids
        self._lock = threading.Lock()
        self._snapshot: NvmlSnapshot | None = None
        self._snapshot_at = float("-inf")
        self._range: PriorityRange | None = None
        self._probe_thread: threading.Thread | None = None
        self._mig_ids: dict[tuple[int, str], int] = {}
        self._mig_looked_up: set[int] = set()
        self._last_plan = intent_pb2.GpuPlan()
        self._last_placements: tuple[LanePlacement, ...] = ()
        self._applied_fingerprint = ""

    # -- inputs --------------------------------------------------------------------------

    def snapshot(self) -> NvmlSnapshot:
        now = time.monotonic()
        if self._snapshot is None or now - self._snapshot_at > self.options.snapshot_ttl_s:
            self._snapshot = self._nvml.snapshot()
            self._snapshot_at = now
        return self._snapshot

    def lanes(self) -> tuple[LaneView, ...]:
        return resolve_lanes(self.options.lanes, self.snapshot())

    def priority_range(self) -> PriorityRange:
        """Queried once from the first present GPU, in the background (the probe imports a GPU
        runtime, seconds); until it answers, and without a GPU, the flagged assumption."""
        if self._range is not None:
            return self._range
        present = self.snapshot().present_indexes
        if present and self._probe is not None and self._probe_thread is None:
            probe, gpu = self._probe, present[0]

            def run() -> None:
                self._range = probe(gpu)
                log.info("stream priority range", extra={"range": self._range.describe()})

            self._probe_thread = threading.Thread(target=run, name="priority-probe", daemon=True)
            self._probe_thread.start()
        return ASSUMED_RANGE

    def wait_for_probe(self, timeout_s: float = 5.0) -> None:
        if self._probe_thread is not None:
            self._probe_thread.join(timeout_s)

    def _resolve_mig_ids(self, placements: tuple[LanePlacement, ...]) -> None:
        """Read profile ids from ``nvidia-smi mig -lgip`` once per GPU that gets a suggestion."""
        snap = self.snapshot()
        for p in placements:
            for gpu in p.gpu_indexes:
                device = snap.device(gpu)
                if not p.mig_profile or gpu in self._mig_looked_up or device is None:
                    continue
                self._mig_looked_up.add(gpu)
                if not device.mig_enabled or not self._runner.which("nvidia-smi"):
                    continue
                outcome = self._runner.run(mig.lookup_argv(gpu))
                if outcome.returncode == 0:
                    self._mig_ids.update(mig.parse_lgip(outcome.stdout))

    # -- planning ------------------------------------------------------------------------

    def _plan(self, plan: intent_pb2.GpuPlan) -> tuple[tuple[LanePlacement, ...], Preview]:
        snap = self.snapshot()
        names = {d.index: d.name for d in snap.devices}
        rng = self.priority_range()  # once: the probe may answer between two reads
        placements = place(plan, self.lanes(), rng, names)
        self._resolve_mig_ids(placements)
        preview = build_preview(
            placements,
            rng,
            policy=plan.policy,
            mig_ids=self._mig_ids,
            uuids={d.index: d.uuid for d in snap.devices},
            reference_preview=self.options.reference_preview,
            mig_enabled={d.index for d in snap.devices if d.mig_enabled},
        )
        return placements, preview

    def effective_mode(self, requested: int) -> gpulane_pb2.ApplyMode:
        if requested == APPLY:
            return APPLY
        if requested == DRY_RUN:
            return DRY_RUN
        return APPLY if self.options.mode == "apply" else DRY_RUN

    def apply(self, request: gpulane_pb2.ApplyGpuPlanRequest) -> gpulane_pb2.ApplyGpuPlanResponse:
        with self._lock:
            mode = self.effective_mode(request.mode)
            placements, preview = self._plan(request.plan)
            content = {
                "mode": gpulane_pb2.ApplyMode.Name(mode),
                "policy": request.plan.policy,
                "gpu_intent_enabled": request.plan.gpu_intent_enabled,
                "decisions": [convert.placement_json(p) for p in placements],
                "commands": [convert.command_json(c) for c in preview.commands],
            }
            content_fp = fingerprint(content)
            outcomes: list[dict[str, Any]] = []
            if mode == APPLY and content_fp != self._applied_fingerprint:
                self._check_apply(placements, preview)
                outcomes = execute_mps(preview.commands, self._runner)
                self._applied_fingerprint = content_fp
            record = {
                **content,
                "node": request.plan.node,
                "generation": request.plan.generation,
                "recorded_at": time.time(),
                "notes": list(preview.notes),
                "executed": outcomes,
            }
            changed = self._recorder.record(record, content_fp)
            self._last_plan = request.plan
            self._last_placements = placements
            metrics.PLANS_APPLIED_TOTAL.labels(mode="apply" if mode == APPLY else "dry-run").inc()
            if changed:
                metrics.PLANS_RECORDED_TOTAL.inc()
                log.info(
                    "gpu plan recorded",
                    extra={"generation": request.plan.generation, "mode": record["mode"]},
                )
            self._update_share_metrics(placements)
            return gpulane_pb2.ApplyGpuPlanResponse(
                generation=request.plan.generation,
                mode=mode,
                decisions=[convert.decision(p) for p in placements],
                commands=[convert.command(c) for c in preview.commands],
                recorded_path=str(self._recorder.last_path),
                notes=list(preview.notes),
                changed=changed,
            )

    def _check_apply(self, placements: tuple[LanePlacement, ...], preview: Preview) -> None:
        """Apply mode acts only on GPUs NVML shows present and idle; otherwise nothing runs.

        Placements left at their defaults change nothing on a GPU, so they need no check; a
        plan with nothing to run needs none either, except that NVML must answer at all.
        """
        snap = self.snapshot()
        if not snap.available:
            self._refuse("no_nvml", f"apply mode needs NVML to show the GPUs idle: {snap.error}")
        if not any(c.kind == "mps" for c in preview.commands):
            return
        own = tuple(self._own_pids())
        for p in placements:
            if p.at_defaults:
                continue
            if p.share_percent > 0 and not p.available:
                self._refuse("absent", f"intent {p.intent_id}: {p.reason}")
            for gpu in p.gpu_indexes:
                device = snap.device(gpu)
                reason = (
                    device.busy_reason(own, self.options.idle_utilization_percent) if device else ""
                )
                if reason:
                    self._refuse("busy", f"apply refused: {reason}")
        if not self._runner.which("nvidia-cuda-mps-control"):
            self._refuse("no_mps", "apply refused: nvidia-cuda-mps-control is not on PATH")

    @staticmethod
    def _refuse(reason: str, message: str) -> None:
        metrics.APPLY_REFUSED_TOTAL.labels(reason=reason).inc()
        raise FailedPrecondition(message)

    def preview(self, plan: intent_pb2.GpuPlan | None) -> gpulane_pb2.PreviewCommandsResponse:
        with self._lock:
            chosen = plan if plan is not None and plan.ByteSize() else self._last_plan
            placements, preview = self._plan(chosen)
        return gpulane_pb2.PreviewCommandsResponse(
            decisions=[convert.decision(p) for p in placements],
            commands=[convert.command(c) for c in preview.commands],
            notes=list(preview.notes),
        )

    # -- telemetry -----------------------------------------------------------------------

    def shares(self) -> dict[str, float]:
        return lane_shares(self._last_placements)

    def idle_gpus(self) -> tuple[int, ...]:
        snap = self.snapshot()
        own = tuple(self._own_pids())
        limit = self.options.idle_utilization_percent
        return tuple(d.index for d in snap.devices if d.is_idle(own, limit))

    def telemetry(self) -> telemetry_pb2.GpuTelemetry:
        snap = self.snapshot()
        lanes = self.lanes()
        shares = self.shares()
        load = self._load.sample(snap, lanes, shares)
        idle = set(self.idle_gpus())
        metrics.NVML_AVAILABLE.set(1 if snap.available else 0)
        metrics.GPUS_PRESENT.set(len(snap.devices))
        metrics.GPU_PRESSURE_RATIO.set(load.gpu_pressure)
        for d in snap.devices:
            metrics.GPU_UTILIZATION_RATIO.labels(gpu=str(d.index)).set(d.utilization_percent / 100)
        for view in lanes:
            metrics.LANE_AVAILABLE.labels(lane=view.name).set(1 if view.available else 0)
        return convert.telemetry(
            snap, lanes, shares, load, {i: i in idle for i in snap.present_indexes}
        )

    def _update_share_metrics(self, placements: tuple[LanePlacement, ...]) -> None:
        shares = lane_shares(placements)
        for lane in self.options.lanes:
            metrics.LANE_SHARE_PERCENT.labels(lane=lane.name).set(shares.get(lane.name, 0.0))
