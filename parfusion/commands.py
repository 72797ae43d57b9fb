"""Core commands: up/down/status (launcher) and check-env."""

from __future__ import annotations

from typing import Any


def register(commands: Any) -> None:
    from parfusion import envcheck, launcher

    launcher.register(commands)
    envcheck.register(commands)
