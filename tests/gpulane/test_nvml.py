"""The NVML adapter: real pynvml without a driver, and a fake library at the pynvml boundary."""

from __future__ import annotations

import pytest

from services.gpulane.nvml import Nvml
from tests.gpulane.fake_nvml import FakeGpu, FakeNvml, h200_node


def test_real_pynvml_without_driver_reports_no_gpus() -> None:
    snap = Nvml().snapshot()
    if snap.available:
        pytest.skip("this machine has an NVIDIA driver")
    assert snap.devices == ()
    assert snap.present_indexes == ()
    assert "NVML" in snap.error


def test_missing_driver_is_empty_and_init_is_not_retried_every_call() -> None:
    fake = FakeNvml(driver_missing=True)
    nvml = Nvml(fake, retry_s=60)
    for _ in range(5):
        snap = nvml.snapshot()
        assert not snap.available and snap.devices == ()
    assert fake.init_calls == 1
    assert "Shared Library Not Found" in snap.error


def test_samples_units_processes_and_idle() -> None:
    fake = h200_node(2, gpu1=FakeGpu(utilization=40, pids=[4242], power_mw=350_500))
    snap = Nvml(fake).snapshot()
    assert snap.available and snap.driver_version == "570.86.15"
    assert snap.present_indexes == (0, 1)
    busy = snap.device(1)
    assert busy is not None
    assert busy.power_watts == pytest.approx(350.5)
    assert [p.pid for p in busy.processes] == [4242]
    assert not busy.is_idle()
    assert "pid 4242" in busy.busy_reason()
    assert busy.is_idle(own_pids=[4242], max_utilization_percent=50)
    idle = snap.device(0)
    assert idle is not None and idle.is_idle() and idle.busy_reason() == ""


def test_utilisation_alone_makes_a_gpu_busy() -> None:
    snap = Nvml(h200_node(1, gpu0=FakeGpu(utilization=30))).snapshot()
    device = snap.device(0)
    assert device is not None
    assert "30% utilised" in device.busy_reason()
