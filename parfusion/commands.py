"""Core commands: up/down/status (launcher) and the intent / plan / policy client commands."""

from __future__ import annotations

from typing import Any


def register(commands: Any) -> None:
    from parfusion import launcher

    launcher.register(commands)
