"""The real server: `python -m services.bridge` as a subprocess, /healthz, then the smoke client."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from services.bridge import smoke
from tests.conftest import ROOT

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
]  # a real process: a few seconds on a busy machine


def test_the_bridge_process_serves_healthz_and_passes_the_smoke_check(
    home: Path, port: int
) -> None:
    env = {
        **os.environ,
        "PARFUSION_HOME": str(home),
        "PARFUSION_BRIDGE_ALLOCATOR_ADDRESS": "",  # no allocator in this test: urgent work runs locally
        "PARFUSION_BRIDGE_BACKGROUND_TICKER": "false",
    }
    env.pop("PARFUSION_API_TOKEN", None)
    log_path = home / "bridge.log"
    log_file = log_path.open("wb")
    process = subprocess.Popen(
        [sys.executable, "-m", "services.bridge", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=log_file,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=0.5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert process.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, "bridge did not become healthy"
            time.sleep(0.1)
        assert smoke.main(["--url", url, "--timeout", "10"]) == 0
        assert (home / "run" / "bridge" / "checkpoint.json").exists()
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log_file.close()
    # uvicorn drains, runs the lifespan shutdown, then re-raises SIGTERM for the exit status
    assert process.returncode in (0, -signal.SIGTERM)
    assert "Application shutdown complete" in log_path.read_text()
