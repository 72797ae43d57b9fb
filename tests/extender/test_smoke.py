"""The smoke client against a real extender process (uvicorn on a free port)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from services.extender import smoke
from tests.conftest import ROOT


@pytest.mark.integration
@pytest.mark.slow
def test_smoke_passes_against_a_real_server(home: Path, port: int) -> None:
    env = {**os.environ, "PARFUSION_HOME": str(home), "PARFUSION_EXTENDER_TELEMETRY": "false"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.extender", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/healthz", timeout=0.5).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        else:
            pytest.fail("extender did not become healthy")
        assert smoke.main(["--url", url]) == 0
        assert smoke.main(["--url", f"http://127.0.0.1:{port}/nope"]) == 1
    finally:
        proc.terminate()
        # uvicorn drains, then re-raises SIGTERM so the exit status tells the signal
        assert proc.wait(timeout=10) in (0, -15)
