"""MIG: the H200 GPU-instance profiles, the share -> slice fit, and nvidia-smi mig commands.

Profile *names* are what an H200 offers; profile *IDs* differ by product and driver, so they
are always read at run time from ``nvidia-smi mig -i N -lgip`` (:func:`parse_lgip`) and never
written down here. A slice is suggested only where a share fits it closely, because a MIG
slice is fixed and isolated while an MPS share can follow the plan every tick. Re-partitioning
needs the GPU idle, and tear-down goes compute instances first (-dci), then GPU instances
(-dgi).
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
    memory_gb: int
    max_instances: int
    media_engines: bool = False

    @property
    def compute_percent(self) -> float:
        return 100.0 * self.compute_slices / COMPUTE_SLICES


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


def suggest_profile(
    share_percent: float,
    memory_limit_bytes: int,
    profiles: tuple[MigProfile, ...],
    tolerance_percent: float = 5.0,
) -> MigProfile | None:
    """The smallest compute profile covering the share and memory, if it wastes little.

    A whole GPU (share >= 100) needs no slice; media-engine profiles are never suggested for
    compute work.
    """
    if share_percent <= 0 or share_percent >= 100:
        return None
    candidates = sorted(
        (p for p in profiles if not p.media_engines and p.compute_slices < COMPUTE_SLICES),
        key=lambda p: (p.compute_slices, p.memory_gb),
    )
    for profile in candidates:
        if profile.compute_percent + 1e-9 < share_percent:
            continue
        if memory_limit_bytes > profile.memory_gb * GB:
            continue
        if profile.compute_percent - share_percent <= tolerance_percent:
            return profile
        return None
    return None


_LGIP_ROW = re.compile(r"^\|\s*(\d+)\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)/(\d+)", re.MULTILINE)


def parse_lgip(text: str) -> dict[tuple[int, str], int]:
    """``nvidia-smi mig -lgip`` table -> {(gpu index, profile name): profile id}."""
    return {(int(m[1]), m[2]): int(m[3]) for m in _LGIP_ROW.finditer(text)}


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
