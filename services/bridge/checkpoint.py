"""Durable mission checkpoints under run/: what the bridge resumes from after a preemption or a restart.

One JSON document per bridge, replaced atomically (write a temporary file in the same directory,
fsync it, rename over the old one, fsync the directory), so a crash leaves either the previous
checkpoint or the new one, never a torn file. Progress records between safe points use the same
file without the directory fsync: losing one of those only means a few more steps are redone.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

FORMAT_VERSION = 1


class CheckpointStore:
    def __init__(self, path: Path) -> None:
        self.path = path

    def save(self, document: dict[str, Any], *, durable: bool = True) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        payload = json.dumps({"version": FORMAT_VERSION, **document}, sort_keys=True).encode()
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(payload)
                if durable:
                    f.flush()
                    os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        if durable:
            dir_fd = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)

    def load(self) -> dict[str, Any] | None:
        """The stored document, or None when there is none or it cannot be used (logged)."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return None
        except OSError as exc:
            log.warning("cannot read checkpoint", extra={"path": str(self.path), "error": str(exc)})
            return None
        try:
            document = json.loads(text)
        except json.JSONDecodeError as exc:
            log.warning(
                "checkpoint is not valid JSON; ignoring it",
                extra={"path": str(self.path), "error": str(exc)},
            )
            return None
        if not isinstance(document, dict) or document.get("version") != FORMAT_VERSION:
            log.warning(
                "checkpoint has an unknown format; ignoring it", extra={"path": str(self.path)}
            )
            return None
        return document

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)
