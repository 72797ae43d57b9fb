"""The layer contracts in pyproject.toml ([tool.importlinter]) hold: the core is pure, services
reach each other only through the core, common and the generated contracts, and nothing outside
experiments, bench and tests imports experiments."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT


def test_import_contracts_are_kept() -> None:
    lint = Path(sys.executable).parent / "lint-imports"
    if not lint.exists():
        found = shutil.which("lint-imports")
        if found is None:
            pytest.skip("lint-imports is not installed (pip install -e '.[dev]')")
        lint = Path(found)
    done = subprocess.run(
        [str(lint), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout
