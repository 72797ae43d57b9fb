"""H200 MIG profiles: share -> slice fit, -lgip parsing, command order."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.gpulane import mig

# The table layout nvidia-smi mig -lgip prints (ids are whatever the driver says).
LGIP = """
+-------------------------------------------------------------------------------+
| GPU instance profiles:                                                        |
| GPU   Name               ID    Instances   Memory     P2P    SM    DEC   ENC  |
|                                Free/Total   GiB              CE    JPEG  OFA  |
|===============================================================================|
|   6  MIG 1g.18gb         19     7/7        16.00      No     16     1     0   |
|                                                               1     1     0   |
+-------------------------------------------------------------------------------+
|   6  MIG 1g.18gb+me      20     1/1        16.00      No     16     1     0   |
|                                                               1     1     1   |
+-------------------------------------------------------------------------------+
|   6  MIG 3g.71gb          9     2/2        69.00      No     60     3     0   |
|                                                               3     3     0   |
+-------------------------------------------------------------------------------+
"""


# NVIDIA MIG User Guide, "Supported MIG Profiles", H200 MIG Profiles (141 GB):
# https://docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-mig-profiles.html
# (name, fraction of SMs in sevenths, fraction of memory in eighths, instances available)
PUBLISHED_H200 = (
    ("1g.18gb", 1, 1, 7),
    ("1g.18gb+me", 1, 1, 1),
    ("1g.35gb", 1, 2, 4),
    ("2g.35gb", 2, 2, 3),
    ("3g.71gb", 3, 4, 2),
    ("4g.71gb", 4, 4, 1),
    ("7g.141gb", 7, 8, 1),
)


def test_h200_table_is_the_published_one() -> None:
    ours = [(p.name, p.compute_slices, p.max_instances) for p in mig.H200_PROFILES]
    assert ours == [(name, sm, count) for name, sm, _, count in PUBLISHED_H200]
    for profile, (_, _, eighths, _) in zip(mig.H200_PROFILES, PUBLISHED_H200, strict=True):
        # the name's memory is its eighth of the 141 GB board, rounded as NVIDIA names it
        assert abs(profile.memory_gb - 141 * eighths / 8) < 1.0
    assert mig.profiles_for("NVIDIA H200") == mig.H200_PROFILES
    assert mig.profiles_for("NVIDIA H200 NVL") == mig.H200_PROFILES
    assert mig.profiles_for("NVIDIA A10") == ()


@pytest.mark.parametrize(
    ("name", "sevenths", "eighths", "_count"), PUBLISHED_H200[:1] + PUBLISHED_H200[2:]
)
def test_each_published_profile_is_the_fit_for_its_own_size(
    name: str, sevenths: int, eighths: int, _count: int
) -> None:
    profile = next(p for p in mig.H200_PROFILES if p.name == name)
    fit = mig.fit_profile(100.0 * sevenths / 7, profile.memory_gb * mig.GB, mig.H200_PROFILES)
    assert fit.profile == profile and fit.reason == ""


@pytest.mark.parametrize(
    ("share", "memory_gb", "expected"),
    [
        (14.0, 0, "1g.18gb"),
        (12.0, 30, "1g.35gb"),
        (25.0, 0, "2g.35gb"),
        (20.0, 0, "2g.35gb"),
        (40.0, 0, "3g.71gb"),
        (50.0, 0, "4g.71gb"),
        (57.0, 0, "4g.71gb"),
        (58.0, 0, "7g.141gb"),
        (90.0, 0, "7g.141gb"),
        (100.0, 0, "7g.141gb"),
        (10.0, 80, "7g.141gb"),  # 80 GB: more than any 71 GB slice
        (14.0, 100, "7g.141gb"),
        (1.0, 141, "7g.141gb"),
    ],
)
def test_smallest_profile_that_holds_the_request(
    share: float, memory_gb: int, expected: str
) -> None:
    fit = mig.fit_profile(share, memory_gb * mig.GB, mig.H200_PROFILES)
    assert fit.profile is not None and fit.profile.name == expected


def test_no_mig_says_why() -> None:
    too_big = mig.fit_profile(50.0, 150 * mig.GB, mig.H200_PROFILES)
    assert too_big.profile is None
    assert too_big.reason == (
        "no MIG: whole GPU (memory 150 GB is more than the largest slice, 7g.141gb)"
    )
    other = mig.fit_profile(50.0, 0, mig.profiles_for("NVIDIA A10"), "NVIDIA A10")
    assert other.profile is None and "no MIG profile table for NVIDIA A10" in other.reason
    over = mig.fit_profile(150.0, 0, mig.H200_PROFILES)
    assert over.profile is None and "more than one GPU" in over.reason


@given(
    share=st.floats(min_value=0.01, max_value=100.0),
    memory_gb=st.floats(min_value=0.0, max_value=141.0),
)
def test_fit_holds_the_request_and_nothing_smaller_does(share: float, memory_gb: float) -> None:
    memory = int(memory_gb * mig.GB)
    fit = mig.fit_profile(share, memory, mig.H200_PROFILES)
    assert fit.profile is not None and not fit.profile.media_engines

    def holds(p: mig.MigProfile) -> bool:
        return p.compute_percent + 1e-9 >= share and memory <= p.memory_gb * mig.GB

    assert holds(fit.profile)
    smaller = [
        p
        for p in mig.H200_PROFILES
        if not p.media_engines
        and (p.compute_slices, p.memory_gb) < (fit.profile.compute_slices, fit.profile.memory_gb)
    ]
    assert not any(holds(p) for p in smaller)


def test_enable_step_syntax() -> None:
    assert mig.enable_argv(6) == ["nvidia-smi", "-i", "6", "-mig", "1"]
    assert "idle" in mig.ENABLE_NOTE and "reset" in mig.ENABLE_NOTE


def test_parse_lgip_reads_ids_at_run_time() -> None:
    assert mig.parse_lgip(LGIP) == {(6, "1g.18gb"): 19, (6, "1g.18gb+me"): 20, (6, "3g.71gb"): 9}


def test_create_and_teardown_syntax() -> None:
    create = [argv for argv, _ in mig.create_argvs(6, "3g.71gb", 9)]
    assert create[0] == ["nvidia-smi", "mig", "-i", "6", "-cgi", "9"]
    assert (
        create[1][:6] == ["nvidia-smi", "mig", "-i", "6", "-gi", create[1][5]]
        and create[1][-1] == "-cci"
    )
    unresolved = mig.create_argvs(6, "3g.71gb", None)[0][0]
    assert unresolved[-1] == "<id of 3g.71gb from: nvidia-smi mig -i 6 -lgip>"
    teardown = [argv[-1] for argv, _ in mig.teardown_argvs(6)]
    assert teardown == ["-dci", "-dgi"]
