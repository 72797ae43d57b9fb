"""Name -> factory registries whose entries import their module only when chosen.

The node agent's backends and the GPU lane's load sources are picked by a config key at
start-up; ``lazy`` keeps an unchosen backend's imports (and their import cycles) out, and
``choose`` turns an unknown name into the same precise ConfigError for every registry.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from services.common.config import ConfigError

F = TypeVar("F", bound=Callable[..., Any])


def lazy(target: str) -> Callable[..., Any]:
    """A factory that imports ``package.module:Name`` on first call and calls it with the
    factory's arguments."""
    module_name, _, attr = target.partition(":")

    def build(*args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(module_name), attr)(*args, **kwargs)

    build.__qualname__ = f"lazy({target})"
    return build


def choose(registry: Mapping[str, F], name: str, key: str) -> F:
    """The factory registered under `name`; ConfigError naming the config `key`, the name and
    the known ones otherwise."""
    factory = registry.get(name)
    if factory is None:
        known = ", ".join(sorted(registry))
        raise ConfigError(f"{key}: unknown backend {name!r} (known: {known})")
    return factory
