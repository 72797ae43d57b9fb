"""MPS control lines and client environment."""

from __future__ import annotations

from services.gpulane import mps


def test_percentages_round_up_and_clamp() -> None:
    assert mps.thread_percentage(37.2) == 38
    assert mps.thread_percentage(40.0) == 40
    assert mps.thread_percentage(0.1) == 1
    assert mps.thread_percentage(250) == 100


def test_memory_limits() -> None:
    assert mps.mem_limit_text(8 * 2**30) == "8G"
    assert mps.mem_limit_text(8 * 2**30 + 1) == "9G"
    assert mps.mem_limit_text(512 * 2**20) == "512M"


def test_control_lines() -> None:
    assert mps.default_percentage_line(40) == "set_default_active_thread_percentage 40"
    assert mps.server_percentage_line("1234", 40) == "set_active_thread_percentage 1234 40"
    assert mps.default_pinned_mem_line(0, 8 * 2**30) == "set_default_device_pinned_mem_limit 0 8G"


def test_client_env_uses_visible_ordinals() -> None:
    env = mps.client_env((2, 3), 25.0, 8 * 2**30)
    assert env["CUDA_VISIBLE_DEVICES"] == "2,3"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=8G,1=8G"
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in mps.client_env((0,), 50.0, 0)


def test_visible_devices_prefers_uuids() -> None:
    assert mps.visible_devices((2, 3), {2: "GPU-aa", 3: "GPU-bb"}) == "GPU-aa,GPU-bb"
    assert mps.visible_devices((2, 3), {2: "GPU-aa"}) == "GPU-aa,3"
    assert mps.client_env((4,), 10.0, 0, {4: "GPU-cc"})["CUDA_VISIBLE_DEVICES"] == "GPU-cc"
