"""The plan record under run/gpulane/: what a dry run would do (or an apply did), on change only.

The allocator sends a GpuPlan every tick (250 ms); recording each would flood the disk with
identical entries, so a record is written only when the plan's content (not its generation)
changes. ``last_plan.json`` always holds the latest record; ``plans.jsonl`` keeps a bounded
history (the newest ``max_records`` entries, trimmed to half when full).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path
from typing import Any


def fingerprint(content: Any) -> str:
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


class PlanRecorder:
    def __init__(self, run_dir: Path, max_records: int = 200) -> None:
        self.directory = run_dir / "gpulane"
        self.last_path = self.directory / "last_plan.json"
        self.history_path = self.directory / "plans.jsonl"
        self._max = max(2, max_records)
        self._lock = threading.Lock()
        self._last_fingerprint = ""
        self._lines = self._count_lines()

    def _count_lines(self) -> int:
        try:
            with self.history_path.open("rb") as fh:
                return sum(1 for _ in fh)
        except FileNotFoundError:
            return 0

    def record(self, record: dict[str, Any], content_fingerprint: str) -> bool:
        """Write ``record`` unless its content equals the last one; True when written."""
        with self._lock:
            if content_fingerprint == self._last_fingerprint:
                return False
            self.directory.mkdir(parents=True, exist_ok=True)
            tmp = self.last_path.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
            os.replace(tmp, self.last_path)
            with self.history_path.open("a") as fh:
                fh.write(json.dumps(record, sort_keys=True) + "\n")
            self._lines += 1
            if self._lines > self._max:
                self._trim()
            self._last_fingerprint = content_fingerprint
            return True

    def _trim(self) -> None:
        keep = self.history_path.read_text().splitlines()[-(self._max // 2) :]
        tmp = self.history_path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(line + "\n" for line in keep))
        os.replace(tmp, self.history_path)
        self._lines = len(keep)
