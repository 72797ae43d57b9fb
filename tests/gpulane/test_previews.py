"""Command previews: exact MPS control grammar, client env, MIG lookup/create/tear-down order."""

from __future__ import annotations

import re

from services.gpulane.lanes import parse_lanes, resolve_lanes
from services.gpulane.nvml import Nvml, NvmlSnapshot
from services.gpulane.planner import place
from services.gpulane.previews import REFERENCE_LABEL, build_preview
from services.gpulane.priority import ASSUMED_RANGE, PriorityRange
from tests.gpulane.fake_nvml import h200_node
from tests.gpulane.plans import demo_plan

LANES = parse_lanes({"online": [0, 1], "batch": [2, 3, 4, 5], "robot": [6], "urgent": [7]})
RANGE = PriorityRange(0, -5, "queried: test")

# nvidia-cuda-mps-control(1) command grammar for the lines the previews emit.
MPS_LINE = re.compile(
    r"^(set_default_active_thread_percentage (100|[1-9]\d?)"
    r"|set_active_thread_percentage (\d+|<server-pid from get_server_list>) (100|[1-9]\d?)"
    r"|set_default_device_pinned_mem_limit \d+ \d+[MG]"
    r"|get_server_list)\n$"
)


def _preview(count: int = 8, plan=None, **kw):
    snap = Nvml(h200_node(count)).snapshot()
    names = {d.index: d.name for d in snap.devices}
    placements = place(plan or demo_plan(), resolve_lanes(LANES, snap), RANGE, names)
    return build_preview(placements, RANGE, policy="parfusion", **kw)


def test_mps_lines_follow_the_control_grammar() -> None:
    preview = _preview()
    mps = [c for c in preview.commands if c.argv and c.argv[0] == "nvidia-cuda-mps-control"]
    assert mps[0].argv == ("nvidia-cuda-mps-control", "-d")
    assert mps[0].env["CUDA_VISIBLE_DEVICES"] == "0,2,6,7"  # the GPUs the plan uses
    for c in mps[1:]:
        assert MPS_LINE.match(c.stdin), c.stdin
    stdin = [c.stdin for c in mps]
    # the daemon default is the largest share; each client tightens to its own
    assert "set_default_active_thread_percentage 57\n" in stdin
    assert "set_default_device_pinned_mem_limit 0 8G\n" in stdin  # GPU 0, daemon ordinal 0
    assert "set_default_device_pinned_mem_limit 1 16G\n" in stdin  # GPU 2, daemon ordinal 1
    assert stdin.index("get_server_list\n") < stdin.index(
        "set_active_thread_percentage <server-pid from get_server_list> 57\n"
    )


def test_client_environment_per_intent() -> None:
    envs = {c.intent_id: c.env for c in _preview().commands if c.kind == "env"}
    assert envs["chat"]["CUDA_VISIBLE_DEVICES"] == "0"
    assert envs["chat"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "40"
    assert envs["chat"]["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=8G"
    assert envs["chat"]["PARFUSION_CUDA_STREAM_PRIORITY"] == "-5"
    assert envs["train"]["PARFUSION_CUDA_STREAM_PRIORITY"] == "0"
    assert envs["train"]["CUDA_VISIBLE_DEVICES"] == "2"


def test_multi_gpu_intent_env_lists_every_ordinal() -> None:
    plan = demo_plan()
    plan.assignments[1].share_percent = 300.0
    envs = {c.intent_id: c.env for c in _preview(plan=plan).commands if c.kind == "env"}
    assert envs["train"]["CUDA_VISIBLE_DEVICES"] == "2,3,4"
    assert envs["train"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "100"
    assert envs["train"]["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=16G,1=16G,2=16G"


def test_mig_enable_then_lookup_then_create_then_dci_before_dgi() -> None:
    cmds = [c for c in _preview().commands if c.kind == "mig" and c.intent_id == "train"]
    flags = [c.argv[-1] for c in cmds]
    assert cmds[0].argv == ("nvidia-smi", "-i", "2", "-mig", "1")
    assert "needs the GPU idle" in cmds[0].purpose and "nvidia-smi -i 2 -r" in cmds[0].purpose
    assert cmds[1].argv == ("nvidia-smi", "mig", "-i", "2", "-lgip")
    assert cmds[2].argv[:5] == ("nvidia-smi", "mig", "-i", "2", "-cgi")
    assert cmds[2].argv[5].startswith("<id of 4g.71gb from: nvidia-smi mig -i 2 -lgip>")
    assert flags[3:] == ["-cci", "-dci", "-dgi"]
    resolved = _preview(mig_ids={(2, "4g.71gb"): 5}, mig_enabled={2}).commands
    argvs = [c.argv for c in resolved if c.intent_id == "train"]
    assert ("nvidia-smi", "mig", "-i", "2", "-cgi", "5") in argvs
    assert ("nvidia-smi", "-i", "2", "-mig", "1") not in argvs  # NVML says MIG mode is on


def test_every_share_and_memory_gets_a_slice_or_a_reason() -> None:
    plan = demo_plan()
    shares = {"chat": 50.0, "train": 90.0, "arm": 10.0}
    for a in plan.assignments:
        a.share_percent = shares.get(a.intent_id, a.share_percent)
        if a.intent_id == "arm":
            a.memory_limit_bytes = 80 * 10**9
        if a.intent_id == "estop":
            a.memory_limit_bytes = 150 * 10**9
    preview = _preview(plan=plan)
    created = {
        c.intent_id: c.purpose.split("(")[1].split(")")[0]
        for c in preview.commands
        if c.kind == "mig" and "-cgi" in c.argv
    }
    assert created == {"chat": "4g.71gb", "train": "7g.141gb", "arm": "7g.141gb"}
    assert (
        "MIG for estop: no MIG: whole GPU (memory 150 GB is more than the largest slice, "
        "7g.141gb)." in preview.notes
    )


def test_notes_carry_the_mps_facts() -> None:
    notes = " ".join(_preview().notes)
    assert "only to MPS servers started afterwards" in notes
    assert "can only tighten" in notes
    assert "One MPS server serves one user id" in notes
    assert "-dci before -dgi" in notes
    assert "nvidia-smi -i N -mig 1, which needs the GPU idle and may need a GPU reset" in notes
    assert "never preempts a running kernel" in notes


def test_defaults_policy_emits_no_commands() -> None:
    preview = _preview(plan=demo_plan("no-gpuintent", enabled=False))
    assert preview.commands == ()
    assert any("defaults" in n for n in preview.notes)


def test_absent_gpus_reference_preview_is_labelled_and_can_be_off() -> None:
    placements = place(
        demo_plan(), resolve_lanes(LANES, NvmlSnapshot(False, "no driver")), ASSUMED_RANGE, {}
    )
    labelled = build_preview(placements, ASSUMED_RANGE)
    assert labelled.commands and all(
        c.purpose.startswith(REFERENCE_LABEL) for c in labelled.commands
    )
    assert any("ASSUMPTION" in n for n in labelled.notes)
    assert build_preview(placements, ASSUMED_RANGE, reference_preview=False).commands == ()


def test_reference_commands_never_mix_with_present_gpus() -> None:
    preview = _preview(count=2)
    assert preview.commands
    assert all(REFERENCE_LABEL not in c.purpose for c in preview.commands)
    assert {c.intent_id for c in preview.commands if c.kind == "env"} == {"chat"}
    assert preview.commands[0].env["CUDA_VISIBLE_DEVICES"] == "0"


def test_devices_are_named_by_uuid_where_nvml_gives_one() -> None:
    uuids = {i: f"GPU-{i:08d}" for i in range(8)}
    preview = _preview(uuids=uuids)
    assert (
        preview.commands[0].env["CUDA_VISIBLE_DEVICES"]
        == "GPU-00000000,GPU-00000002,GPU-00000006,GPU-00000007"
    )
    envs = {c.intent_id: c.env for c in preview.commands if c.kind == "env"}
    assert envs["train"]["CUDA_VISIBLE_DEVICES"] == "GPU-00000002"
    assert any("remaps device indexes" in n for n in preview.notes)
