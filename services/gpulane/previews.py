"""Command previews: the exact MPS / MIG commands and per-process environment for placements.

This is what a dry run returns and records, what the dashboard shows, and (for the MPS part)
what apply mode executes. Unresolved run-time values (an MPS server PID, a MIG profile or
instance id) appear as ``<...>`` with the lookup command that yields them, so a preview never
pretends to know a value only the device can tell. Placements whose GPUs are absent may be
previewed against the configured reference profile; those commands say so in their purpose.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field

from services.gpulane import mig, mps
from services.gpulane.planner import LanePlacement
from services.gpulane.priority import PriorityRange

REFERENCE_LABEL = "[reference profile, GPUs absent here: not runnable] "


@dataclass(frozen=True)
class CommandSpec:
    argv: tuple[str, ...]
    purpose: str
    stdin: str = ""
    env: Mapping[str, str] = field(default_factory=dict)
    intent_id: str = ""
    kind: str = "mps"  # "mps" (apply mode runs these), "env" (for workloads), "mig" (never run)

    @property
    def resolved(self) -> bool:
        text = " ".join(self.argv) + self.stdin
        return "<" not in text


@dataclass(frozen=True)
class Preview:
    commands: tuple[CommandSpec, ...]
    notes: tuple[str, ...]


FACT_NOTES = (
    "MPS settings are lines piped into nvidia-cuda-mps-control; one process per line here.",
    "set_default_active_thread_percentage and set_default_device_pinned_mem_limit apply only to "
    "MPS servers started afterwards; a running server changes with set_active_thread_percentage "
    "SERVER_PID PCT (PIDs from get_server_list).",
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE and CUDA_MPS_PINNED_DEVICE_MEM_LIMIT in a client's "
    "environment can only tighten the daemon's limits, never raise them; the daemon default is "
    "therefore the largest share and each client tightens to its own.",
    "One MPS server serves one user id: intents run as the same user share one server.",
    "CUDA_VISIBLE_DEVICES names GPUs by UUID: an MPS daemon started on a subset of GPUs remaps "
    "device indexes for its clients, so indexes would point at the wrong board.",
    "CUDA stream priority: lower number is higher priority; it orders pending work and never "
    "preempts a running kernel, so batch kernels must stay short for the online tail to hold.",
    "MIG: each share and memory request maps to the smallest H200 slice that holds it "
    "(1g.18gb, 1g.35gb, 2g.35gb, 3g.71gb, 4g.71gb, 7g.141gb); MIG mode is enabled per GPU with "
    "nvidia-smi -i N -mig 1, which needs the GPU idle and may need a GPU reset; profile ids are "
    "read at run time from nvidia-smi mig -lgip; re-partitioning needs an idle GPU, and "
    "tear-down is -dci before -dgi.",
)


def _targets(p: LanePlacement, reference: bool) -> tuple[tuple[int, ...], str]:
    if p.gpu_indexes:
        return p.gpu_indexes, ""
    if reference and p.reference_indexes and p.share_percent > 0:
        return p.reference_indexes, REFERENCE_LABEL
    return (), ""


def build_preview(
    placements: tuple[LanePlacement, ...],
    priority_range: PriorityRange,
    *,
    policy: str = "",
    mig_ids: Mapping[tuple[int, str], int] | None = None,
    uuids: Mapping[int, str] | None = None,
    reference_preview: bool = True,
    mig_enabled: Collection[int] = (),
) -> Preview:
    """``mig_enabled``: GPUs NVML reports in MIG mode already (no enable step for those)."""
    mig_ids = mig_ids or {}
    uuids = uuids or {}
    notes = [f"CUDA stream priority range {priority_range.describe()}."]
    if priority_range.assumed:
        notes.append("ASSUMPTION: the stream priority range was not queried from a device.")
    targeted = [(p, *_targets(p, reference_preview)) for p in placements if not p.at_defaults]
    targeted = [(p, gpus, label) for p, gpus, label in targeted if gpus]
    # Reference-profile commands only when nothing is runnable here: never mixed with real GPUs.
    real = [t for t in targeted if not t[2]]
    active = real or targeted
    if any(p.at_defaults for p in placements):
        notes.append(
            f"Policy {policy or '?'} leaves GPU settings at their defaults: no MPS limits, the "
            f"default stream priority ({priority_range.least}), default concurrency, no MIG."
        )
    if not active:
        notes.extend(FACT_NOTES)
        return Preview((), tuple(notes))
    commands: list[CommandSpec] = []
    union = tuple(sorted({g for _, gpus, _ in active for g in gpus}))
    any_label = "" if real else REFERENCE_LABEL
    commands.append(
        CommandSpec(
            (mps.MPS_CONTROL, "-d"),
            any_label + "start the MPS control daemon once per node over the planned GPUs",
            env={
                "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
                "CUDA_VISIBLE_DEVICES": mps.visible_devices(union, uuids),
            },
        )
    )
    top = max(mps.thread_percentage(p.share_percent) for p, _, _ in active)
    commands.append(
        CommandSpec(
            (mps.MPS_CONTROL,),
            any_label + "default active thread percentage for MPS servers started after this",
            stdin=mps.default_percentage_line(top) + "\n",
        )
    )
    limits: dict[int, int] = {}
    for p, gpus, _ in active:
        for g in gpus:
            if p.memory_limit_bytes > 0:
                limits[g] = max(limits.get(g, 0), p.memory_limit_bytes)
    for g, limit in sorted(limits.items()):
        commands.append(
            CommandSpec(
                (mps.MPS_CONTROL,),
                any_label + f"default pinned device memory limit on GPU {g} "
                f"(daemon ordinal {union.index(g)}) for servers started after this",
                stdin=mps.default_pinned_mem_line(union.index(g), limit) + "\n",
            )
        )
    commands.append(
        CommandSpec(
            (mps.MPS_CONTROL,),
            any_label + "list running MPS servers (one per user id) for the next line",
            stdin="get_server_list\n",
        )
    )
    commands.append(
        CommandSpec(
            (mps.MPS_CONTROL,),
            any_label + "raise or lower the limit of an MPS server that is already running",
            stdin=mps.server_percentage_line("<server-pid from get_server_list>", top) + "\n",
        )
    )
    for p, gpus, label in active:
        env = mps.client_env(gpus, p.share_percent, p.memory_limit_bytes, uuids)
        env["PARFUSION_CUDA_STREAM_PRIORITY"] = str(p.cuda_stream_priority)
        env["PARFUSION_GPU_CONCURRENCY"] = str(p.concurrency)
        commands.append(
            CommandSpec(
                (),
                label + f"environment for {p.intent_name or p.intent_id}'s GPU processes "
                f"(lane {p.lane}, share {p.share_percent:g}%, stream priority "
                f"{p.cuda_stream_priority}, concurrency {p.concurrency or 'default'})",
                env=env,
                intent_id=p.intent_id,
                kind="env",
            )
        )
    commands.extend(_mig_commands(active, mig_ids, mig_enabled))
    notes.extend(
        f"MIG for {p.intent_name or p.intent_id}: {p.mig_note}." for p, _, _ in active if p.mig_note
    )
    notes.extend(FACT_NOTES)
    return Preview(tuple(commands), tuple(notes))


def _mig_commands(
    active: list[tuple[LanePlacement, tuple[int, ...], str]],
    mig_ids: Mapping[tuple[int, str], int],
    mig_enabled: Collection[int],
) -> list[CommandSpec]:
    out: list[CommandSpec] = []
    for p, gpus, label in active:
        if not p.mig_profile:
            continue
        prefix = label + f"MIG suggestion for {p.intent_name or p.intent_id} ({p.mig_profile}): "
        steps: list[tuple[list[str], str]] = []
        for gpu in gpus:
            if gpu not in mig_enabled:
                enable = f"enable MIG mode on GPU {gpu} first; {mig.ENABLE_NOTE.format(gpu=gpu)}"
                steps.append((mig.enable_argv(gpu), enable))
            lookup = f"read the profile id of {p.mig_profile} at run time"
            steps.append((mig.lookup_argv(gpu), lookup))
            steps += mig.create_argvs(gpu, p.mig_profile, mig_ids.get((gpu, p.mig_profile)))
            steps += mig.teardown_argvs(gpu)
        for argv, purpose in steps:
            out.append(
                CommandSpec(tuple(argv), prefix + purpose, intent_id=p.intent_id, kind="mig")
            )
    return out
