"""The process boundary for apply mode: running nvidia-cuda-mps-control / nvidia-smi.

Only apply mode (and the read-only MIG profile lookup) runs anything; a dry run never does.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class CommandOutcome:
    argv: tuple[str, ...]
    stdin: str
    returncode: int
    stdout: str
    stderr: str


class CommandRunner:
    def __init__(self, timeout_s: float = 10.0) -> None:
        self._timeout_s = timeout_s

    def which(self, program: str) -> bool:
        return shutil.which(program) is not None

    def run(
        self, argv: Sequence[str], stdin: str = "", env: Mapping[str, str] | None = None
    ) -> CommandOutcome:
        merged = {**os.environ, **(env or {})}
        try:
            done = subprocess.run(
                list(argv),
                input=stdin,
                capture_output=True,
                text=True,
                env=merged,
                timeout=self._timeout_s,
                check=False,
            )
        except FileNotFoundError as exc:
            return CommandOutcome(tuple(argv), stdin, 127, "", str(exc))
        except subprocess.TimeoutExpired:
            return CommandOutcome(
                tuple(argv), stdin, 124, "", f"timed out after {self._timeout_s}s"
            )
        return CommandOutcome(tuple(argv), stdin, done.returncode, done.stdout, done.stderr)
