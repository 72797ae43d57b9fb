"""H200 MIG profiles: share -> slice fit, -lgip parsing, command order."""

from __future__ import annotations

import pytest

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


def test_h200_profile_names() -> None:
    names = [p.name for p in mig.H200_PROFILES]
    assert names == [
        "1g.18gb",
        "1g.18gb+me",
        "1g.35gb",
        "2g.35gb",
        "3g.71gb",
        "4g.71gb",
        "7g.141gb",
    ]
    assert mig.profiles_for("NVIDIA H200") == mig.H200_PROFILES
    assert mig.profiles_for("NVIDIA A10") == ()


@pytest.mark.parametrize(
    ("share", "memory_gb", "expected"),
    [
        (14.0, 0, "1g.18gb"),
        (12.0, 30, "1g.35gb"),
        (25.0, 0, "2g.35gb"),
        (40.0, 0, "3g.71gb"),
        (57.0, 0, "4g.71gb"),
        (50.0, 0, None),  # 4g would waste 7 points: an MPS share fits better
        (20.0, 0, None),
        (100.0, 0, None),  # a whole GPU needs no slice
        (0.0, 0, None),
        (14.0, 100, None),  # memory needs more than the fitting slice
    ],
)
def test_suggestion(share: float, memory_gb: int, expected: str | None) -> None:
    got = mig.suggest_profile(share, memory_gb * mig.GB, mig.H200_PROFILES)
    assert (got.name if got else None) == expected


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
