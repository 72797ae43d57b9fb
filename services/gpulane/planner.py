"""The lane planner: one GpuPlan (from the allocator, every tick) -> one LanePlacement per intent.

Pure: the plan, the resolved lanes, the stream-priority range and the board names come in;
placements come out. For each assignment it picks the lane and the GPUs of that lane that are
present, packs the share onto them, turns it into a per-GPU MPS percentage, maps the logical
stream priority into the device range and maps the per-GPU share and memory to the smallest
MIG slice that holds them (or says why none does). A share is in the allocator's lane units, percent of one GPU (a four-GPU lane has
400): an intent gets the fewest GPUs that hold it, the ones with the most share left, and the
same percentage on each. A plan whose policy
disables GPU intent (no-gpuintent, no-crosslayer, baseline...) leaves every GPU setting at
its default: full device, default stream priority, default concurrency, no slice.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from parfusion.v1 import intent_pb2
from services.common.errors import InvalidArgument
from services.gpulane import mig
from services.gpulane.lanes import LaneView, lane_by_name
from services.gpulane.priority import PriorityRange, map_priority


@dataclass(frozen=True)
class LanePlacement:
    intent_id: str
    intent_name: str
    lane: str
    gpu_indexes: tuple[int, ...]  # present GPUs only
    share_percent: float  # per GPU: the MPS active thread percentage on each of gpu_indexes
    logical_priority: int
    cuda_stream_priority: int
    concurrency: int
    memory_limit_bytes: int
    mig_profile: str
    available: bool
    reason: str
    at_defaults: bool
    # The lane's configured GPUs, for a labelled reference-profile preview when absent here.
    reference_indexes: tuple[int, ...] = ()
    total_share_percent: float = 0.0  # lane units (percent of one GPU) the intent holds
    mig_note: str = ""  # why no MIG slice fits ("no MIG: whole GPU (...)"), when mig_profile is ""


def validate_plan(plan: intent_pb2.GpuPlan) -> None:
    """Reject a malformed plan as a whole, before anything is recorded or applied."""
    seen: set[str] = set()
    for i, a in enumerate(plan.assignments):
        where = f"plan.assignments[{i}]"
        if not a.intent_id:
            raise InvalidArgument("must not be empty", field=f"{where}.intent_id")
        if a.intent_id in seen:
            raise InvalidArgument(f"intent {a.intent_id} appears twice", field=f"{where}.intent_id")
        seen.add(a.intent_id)
        if not math.isfinite(a.share_percent) or a.share_percent < 0:
            raise InvalidArgument(
                f"must be a percentage >= 0, got {a.share_percent}", field=f"{where}.share_percent"
            )
        if a.stream_priority not in (-1, 0, 1):
            raise InvalidArgument(
                f"must be -1, 0 or 1, got {a.stream_priority}", field=f"{where}.stream_priority"
            )


def _pick_lane(requested: str, lanes: tuple[LaneView, ...]) -> tuple[LaneView | None, str]:
    if requested:
        view = lane_by_name(lanes, requested)
        return view, "" if view else f"lane {requested!r} is not configured"
    for view in lanes:  # empty = any lane: the first one with a GPU present
        if view.available:
            return view, ""
    return (lanes[0] if lanes else None), ""


def _pick_gpus(
    assignment: intent_pb2.GpuAssignment, view: LaneView
) -> tuple[tuple[int, ...], tuple[int, ...], str]:
    """(present GPUs to use, reference GPUs, reason)."""
    wanted = tuple(assignment.gpu_indexes) or view.configured
    outside = [i for i in wanted if i not in view.configured]
    if outside:
        listed = ",".join(map(str, outside))
        return (), wanted, f"GPUs {listed} are not in lane {view.name}"
    present = tuple(i for i in wanted if i in view.present)
    if not present:
        return (), wanted, view.reason or f"lane {view.name} has no GPU present"
    absent = [i for i in wanted if i not in view.present]
    reason = f"GPUs {','.join(map(str, absent))} absent" if absent else ""
    return present, wanted, reason


def _pack(
    candidates: tuple[int, ...], units: float, left: dict[int, float]
) -> tuple[tuple[int, ...], float, str]:
    """(GPUs, per-GPU percent, note): the fewest GPUs that hold ``units``, most share left first."""
    capacity = 100.0 * len(candidates)
    note = ""
    if units > capacity + 1e-9:
        note = f"share {units:g}% is more than {len(candidates)} GPU(s); capped at 100% per GPU"
        units = capacity
    k = max(1, min(len(candidates), math.ceil(units / 100.0 - 1e-9)))
    chosen = sorted(candidates, key=lambda g: (-left.get(g, 100.0), g))[:k]
    per_gpu = units / k
    for g in chosen:
        left[g] = left.get(g, 100.0) - per_gpu
    return tuple(sorted(chosen)), per_gpu, note


def place(
    plan: intent_pb2.GpuPlan,
    lanes: tuple[LaneView, ...],
    priority_range: PriorityRange,
    device_names: Mapping[int, str],
) -> tuple[LanePlacement, ...]:
    validate_plan(plan)
    placements = []
    left: dict[int, float] = {}  # share left per GPU (present or, for previews, reference)
    for a in plan.assignments:
        view, lane_error = _pick_lane(a.lane, lanes)
        if view is None or lane_error:
            placements.append(_unplaced(a, a.lane, lane_error or "no lanes configured"))
            continue
        if a.share_percent <= 0:
            placements.append(_unplaced(a, view.name, "no GPU share in this plan"))
            continue
        present, reference, reason = _pick_gpus(a, view)
        if not plan.gpu_intent_enabled:
            placements.append(
                LanePlacement(
                    intent_id=a.intent_id,
                    intent_name=a.intent_name,
                    lane=view.name,
                    gpu_indexes=present,
                    share_percent=100.0,
                    logical_priority=0,
                    cuda_stream_priority=priority_range.least,
                    concurrency=0,
                    memory_limit_bytes=0,
                    mig_profile="",
                    available=bool(present),
                    reason=_join(
                        f"policy {plan.policy or '?'} leaves GPU settings at their defaults",
                        reason,
                    ),
                    at_defaults=True,
                    reference_indexes=reference,
                )
            )
            continue
        if present:
            gpus, share, note = _pack(present, a.share_percent, left)
            packed_reference = reference
        else:  # nothing runs here; pack the reference GPUs so a labelled preview is exact
            packed_reference, share, note = _pack(reference, a.share_percent, left)
            gpus = ()
        names = {device_names.get(i, "") for i in (gpus or packed_reference)}
        board = names.pop() if len(names) == 1 else "a mix of boards"
        fit = mig.fit_profile(share, a.memory_limit_bytes, mig.profiles_for(board), board)
        placements.append(
            LanePlacement(
                intent_id=a.intent_id,
                intent_name=a.intent_name,
                lane=view.name,
                gpu_indexes=gpus,
                share_percent=share,
                logical_priority=a.stream_priority,
                cuda_stream_priority=map_priority(a.stream_priority, priority_range),
                concurrency=a.concurrency,
                memory_limit_bytes=a.memory_limit_bytes,
                mig_profile=fit.profile.name if fit.profile else "",
                available=bool(gpus),
                reason=_join(reason, note),
                at_defaults=False,
                reference_indexes=packed_reference,
                total_share_percent=min(a.share_percent, 100.0 * len(gpus or packed_reference)),
                mig_note=fit.reason,
            )
        )
    return tuple(placements)


def _join(*parts: str) -> str:
    return "; ".join(p for p in parts if p)


def _unplaced(a: intent_pb2.GpuAssignment, lane: str, reason: str) -> LanePlacement:
    return LanePlacement(
        intent_id=a.intent_id,
        intent_name=a.intent_name,
        lane=lane,
        gpu_indexes=(),
        share_percent=0.0,
        logical_priority=0,
        cuda_stream_priority=0,
        concurrency=0,
        memory_limit_bytes=0,
        mig_profile="",
        available=False,
        reason=reason,
        at_defaults=False,
    )


def lane_shares(placements: tuple[LanePlacement, ...]) -> dict[str, float]:
    """Allocated share per lane, in lane units (percent of one GPU), GPU-intent plans only."""
    shares: dict[str, float] = {}
    for p in placements:
        if p.lane and not p.at_defaults and p.available:
            shares[p.lane] = shares.get(p.lane, 0.0) + p.total_share_percent
    return shares
