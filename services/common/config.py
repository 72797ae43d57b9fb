"""Typed service settings: configs/*.yaml, then PARFUSION_* environment overrides, then CLI flags.

Parsed once in each service's ``main()``. Relative paths resolve against the project home
(``PARFUSION_HOME``, default the working directory) so runtime files stay under run/, logs/,
results/ of the checkout or container. What the services read (configs/demo.yaml,
configs/model.yaml, the demo intents) comes from the home when it has its own copy, else from
the checkout the code runs from: a fresh directory as PARFUSION_HOME holds a second stack's
runtime files with the shipped configuration.
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

GLOBAL_ENV = {
    "PARFUSION_HOST": "host",
    "PARFUSION_RUN_DIR": "run_dir",
    "PARFUSION_LOG_DIR": "log_dir",
    "PARFUSION_RESULTS_DIR": "results_dir",
    "PARFUSION_LOG_LEVEL": "log_level",
    "PARFUSION_LOG_FORMAT": "log_format",
    "PARFUSION_NODE_NAME": "node_name",
}


class ConfigError(ValueError):
    """A configuration key is missing or has the wrong type; the message names the key."""


# the checkout (or image) this code runs from
CODE_HOME = Path(__file__).resolve().parents[2]


def project_home() -> Path:
    return Path(os.environ.get("PARFUSION_HOME") or os.getcwd()).resolve()


def resolve_input(value: str | os.PathLike[str]) -> Path:
    """A file or directory the services read: absolute as given; relative, under the project
    home when it is there, else under CODE_HOME when it is there (else the home's path, which
    the caller reports as missing)."""
    p = Path(value)
    if p.is_absolute():
        return p
    own = project_home() / p
    if own.exists():
        return own
    shipped = CODE_HOME / p
    return shipped if shipped.exists() else own


def default_config_path() -> Path:
    explicit = os.environ.get("PARFUSION_CONFIG")
    return Path(explicit) if explicit else resolve_input("configs/demo.yaml")


def load_config(path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Read the YAML document; a missing or malformed file is a ConfigError naming it."""
    cfg_path = Path(path) if path else default_config_path()
    try:
        text = cfg_path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config {cfg_path}: {exc.strerror}") from exc
    try:
        doc = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"config {cfg_path} is not valid YAML: {exc}") from exc
    if not isinstance(doc, dict):
        raise ConfigError(f"config {cfg_path}: top level must be a mapping")
    return doc


def coerce(raw: str, like: Any, key: str) -> Any:
    """Convert an environment string to the type of the configured default."""
    try:
        if isinstance(like, bool):
            low = raw.strip().lower()
            if low in {"1", "true", "yes", "on"}:
                return True
            if low in {"0", "false", "no", "off", ""}:
                return False
            raise ValueError(raw)
        if isinstance(like, int):
            return int(raw)
        if isinstance(like, float):
            return float(raw)
        if isinstance(like, (list, dict)):
            value = (
                json.loads(raw)
                if raw.strip()[:1] in "[{"
                else [v.strip() for v in raw.split(",") if v.strip()]
            )
            return value
    except (ValueError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{key}: cannot parse {raw!r} as {type(like).__name__}") from exc
    return raw


def apply_env(
    section_name: str, section: Mapping[str, Any], env: Mapping[str, str]
) -> dict[str, Any]:
    out = dict(section)
    prefix = f"PARFUSION_{section_name.upper()}_"
    for key, raw in env.items():
        if key.startswith(prefix):
            name = key[len(prefix) :].lower()
            out[name] = coerce(raw, out.get(name, ""), key)
    return out


@dataclass(frozen=True)
class ServiceSettings:
    service: str
    host: str
    port: int
    metrics_port: int | None
    api_token: str | None
    run_dir: Path
    log_dir: Path
    results_dir: Path
    log_level: str
    log_format: str
    node_name: str
    config_path: Path
    section: Mapping[str, Any] = field(default_factory=dict)
    document: Mapping[str, Any] = field(default_factory=dict)

    def get(self, key: str, default: Any = None) -> Any:
        return self.section.get(key, default)

    def get_str(self, key: str, default: str = "") -> str:
        value = self.section.get(key, default)
        if value is None:
            return default
        if not isinstance(value, (str, int, float)):
            raise ConfigError(f"{self.service}.{key}: expected a string")
        return str(value)

    def get_int(self, key: str, default: int = 0) -> int:
        value = self.section.get(key, default)
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or (isinstance(value, float) and not value.is_integer())
        ):
            raise ConfigError(f"{self.service}.{key}: expected an integer, got {value!r}")
        return int(value)

    def get_float(self, key: str, default: float = 0.0) -> float:
        value = self.section.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{self.service}.{key}: expected a number, got {value!r}")
        return float(value)

    def get_bool(self, key: str, default: bool = False) -> bool:
        value = self.section.get(key, default)
        if not isinstance(value, bool):
            raise ConfigError(f"{self.service}.{key}: expected true or false, got {value!r}")
        return value

    def path(self, key: str, default: str) -> Path:
        return resolve_path(self.get_str(key, default))

    def ensure_dirs(self) -> None:
        for d in (self.run_dir, self.log_dir, self.results_dir):
            d.mkdir(parents=True, exist_ok=True)


def resolve_path(value: str | os.PathLike[str]) -> Path:
    p = Path(value)
    return p if p.is_absolute() else project_home() / p


def build_settings(
    service: str,
    *,
    config_path: str | os.PathLike[str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    document: Mapping[str, Any] | None = None,
) -> ServiceSettings:
    """Settings for one service. ``overrides`` (CLI flags, tests) win over env, env over YAML;
    ``document`` stands for the YAML when given (the file is then not read)."""
    env = os.environ if env is None else env
    path = Path(config_path) if config_path else default_config_path()
    doc = dict(document) if document is not None else load_config(path)
    common = dict(doc.get("common") or {})
    for var, key in GLOBAL_ENV.items():
        if var in env:
            common[key] = env[var]
    common = apply_env("common", common, env)
    section = apply_env(service, dict(doc.get(service) or {}), env)
    section.update({k: v for k, v in (overrides or {}).items() if v is not None})
    if not isinstance(section.get("port", 0), int):
        raise ConfigError(f"{service}.port: expected an integer")
    metrics = section.get("metrics_port")
    token = env.get("PARFUSION_API_TOKEN") or None
    return ServiceSettings(
        service=service,
        host=str(section.get("host") or common.get("host") or "127.0.0.1"),
        port=int(section.get("port", 0)),
        metrics_port=int(metrics) if metrics not in (None, "") else None,
        api_token=token,
        run_dir=resolve_path(common.get("run_dir", "run")),
        log_dir=resolve_path(common.get("log_dir", "logs")),
        results_dir=resolve_path(common.get("results_dir", "results")),
        log_level=str(common.get("log_level", "INFO")),
        log_format=str(common.get("log_format", "kv")),
        node_name=str(common.get("node_name", "node-0")),
        config_path=path,
        section=section,
        document=doc,
    )


def parse_service_args(
    service: str,
    argv: Sequence[str] | None = None,
    extra: Callable[[argparse.ArgumentParser], None] | None = None,
) -> tuple[ServiceSettings, argparse.Namespace]:
    """The command line every service main() accepts: --config --host --port --metrics-port."""
    parser = argparse.ArgumentParser(prog=f"python -m services.{service}")
    parser.add_argument(
        "--config", help="YAML config (default configs/demo.yaml or $PARFUSION_CONFIG)"
    )
    parser.add_argument("--host", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="listen port")
    parser.add_argument("--metrics-port", type=int, help="Prometheus metrics port (gRPC services)")
    parser.add_argument("--log-level", help="DEBUG, INFO, WARNING, ERROR")
    if extra:
        extra(parser)
    ns = parser.parse_args(argv)
    try:
        settings = build_settings(
            service,
            config_path=ns.config,
            overrides={"host": ns.host, "port": ns.port, "metrics_port": ns.metrics_port},
        )
    except ConfigError as exc:
        parser.error(str(exc))
    if ns.log_level:
        settings = _replace(settings, log_level=ns.log_level)
    return settings, ns


def _replace(settings: ServiceSettings, **changes: Any) -> ServiceSettings:
    from dataclasses import replace

    return replace(settings, **changes)
