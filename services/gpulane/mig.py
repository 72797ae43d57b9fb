"""MIG: the H200 GPU-instance profiles, the share -> slice fit, and nvidia-smi mig commands.

Every GPU share and memory request maps to the smallest H200 profile that holds both (the
fewest compute slices, then the least memory), up to 7g.141gb for a whole GPU; a request no
profile holds, or a board without a known table, reads "no MIG: whole GPU" with the reason.
Profile *names* are what an H200 offers; profile *IDs* differ by product and driver, so they
are always read at run time from ``nvidia-smi mig -i N -lgip`` (:func:`parse_lgip`) and never
written down here. MIG mode is enabled per GPU first (``nvidia-smi -i N -mig 1``: the GPU must
be idle, and the change may need a GPU reset); tear-down goes compute instances first (-dci),
then GPU instances (-dgi).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

GB = 10**9
COMPUTE_SLICES = 7


@dataclass(frozen=True)
class MigProfile:
    name: str
    compute_slices: int
    memory_gb: int  # nominal, as the profile name says
    max_instances: int
    media_engines: bool = False

    @property
    def compute_percent(self) -> float:
        return 100.0 * self.compute_slices / COMPUTE_SLICES


# NVIDIA Multi-Instance GPU User Guide, "Supported MIG Profiles", H200 MIG Profiles (H200-SXM5
# and H200 NVL, 141 GB): https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html
# (SMs in sevenths, memory in eighths: 1g.18gb 1/7 SM 1/8 memory x7, 1g.35gb 1/7 1/4 x4,
# 2g.35gb 2/7 1/4 x3, 3g.71gb 3/7 1/2 x2, 4g.71gb 4/7 1/2 x1, 7g.141gb 7/7 full x1); the
# instance counts match the H200-141GB entries of NVIDIA mig-parted's default config.
H200_PROFILES: tuple[MigProfile, ...] = (
    MigProfile("1g.18gb", 1, 18, 7),
    MigProfile("1g.18gb+me", 1, 18, 1, media_engines=True),
    MigProfile("1g.35gb", 1, 35, 4),
    MigProfile("2g.35gb", 2, 35, 3),
    MigProfile("3g.71gb", 3, 71, 2),
    MigProfile("4g.71gb", 4, 71, 1),
    MigProfile("7g.141gb", 7, 141, 1),
)


def profiles_for(device_name: str) -> tuple[MigProfile, ...]:
    """Known profiles for a board; "" means the reference profile (8xH200) with no device."""
    if device_name == "" or "H200" in device_name.upper():
        return H200_PROFILES
    return ()


@dataclass(frozen=True)
class MigFit:
    profile: MigProfile | None
    reason: str  # why there is no slice ("no MIG: whole GPU (...)"); "" with a profile


def fit_profile(
    share_percent: float,
    memory_limit_bytes: int,
    profiles: tuple[MigProfile, ...],
    board: str = "",
) -> MigFit:
    """The smallest compute profile holding the per-GPU share and memory, or why none does.

    Media-engine profiles are never chosen for compute work; a memory limit of 0 means none.
    """
    if not profiles:
        return MigFit(None, f"no MIG: whole GPU (no MIG profile table for {board or 'this board'})")
    if share_percent > 100.0 + 1e-9:
        return MigFit(None, f"no MIG: whole GPU (share {share_percent:g}% is more than one GPU)")
    candidates = sorted(
        (p for p in profiles if not p.media_engines),
        key=lambda p: (p.compute_slices, p.memory_gb),
    )
    for profile in candidates:
        if profile.compute_percent + 1e-9 >= share_percent and (
            memory_limit_bytes <= profile.memory_gb * GB
        ):
            return MigFit(profile, "")
    largest = candidates[-1]
    return MigFit(
        None,
        f"no MIG: whole GPU (memory {memory_limit_bytes / GB:g} GB is more than the largest "
        f"slice, {largest.name})",
    )


_LGIP_ROW = re.compile(r"^\|\s*(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)/(\d+)", re.MULTILINE)


def parse_lgip(text: str) -> dict[tuple[int, str], int]:
    """``nvidia-smi mig -lgip`` table -> {(gpu index, profile name): profile id}."""
    return {(int(m[1]), m[2]): int(m[3]) for m in _LGIP_ROW.finditer(text)}


def enable_argv(gpu: int) -> list[str]:
    return ["nvidia-smi", "-i", str(gpu), "-mig", "1"]


ENABLE_NOTE = (
    "needs the GPU idle (no processes on it); the mode may show as pending until the GPU is "
    "reset (nvidia-smi -i {gpu} -r) or the node rebooted"
)


def lookup_argv(gpu: int) -> list[str]:
    return ["nvidia-smi", "mig", "-i", str(gpu), "-lgip"]


def profile_id_placeholder(gpu: int, profile: str) -> str:
    return f"<id of {profile} from: nvidia-smi mig -i {gpu} -lgip>"


def create_argvs(gpu: int, profile: str, profile_id: int | None) -> list[tuple[list[str], str]]:
    pid = str(profile_id) if profile_id is not None else profile_id_placeholder(gpu, profile)
    gi = f"<GPU instance id printed by -cgi on GPU {gpu}>"
    return [
        (["nvidia-smi", "mig", "-i", str(gpu), "-cgi", pid], f"create a {profile} GPU instance"),
        (
            ["nvidia-smi", "mig", "-i", str(gpu), "-gi", gi, "-cci"],
            "create its default compute instance",
        ),
    ]


def teardown_argvs(gpu: int) -> list[tuple[list[str], str]]:
    gi = f"<GPU instance id from: nvidia-smi mig -i {gpu} -lgi>"
    return [
        (
            ["nvidia-smi", "mig", "-i", str(gpu), "-gi", gi, "-dci"],
            "tear-down step 1: destroy the compute instances first",
        ),
        (
            ["nvidia-smi", "mig", "-i", str(gpu), "-gi", gi, "-dgi"],
            "tear-down step 2: then destroy the GPU instance",
        ),
    ]
