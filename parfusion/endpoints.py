"""Where each service listens under this configuration, and how its peers and the CLI reach it.

One resolution for the launcher, every `parfusion` command and check-env: configs/demo.yaml
(or $PARFUSION_CONFIG), then PARFUSION_HOST / PARFUSION_<SERVICE>_HOST / _PORT / _METRICS_PORT.
:func:`peer_environment` rewrites every cross-service address of the config (the
``127.0.0.1:<default port>`` values the service table finds) to where its target really
listens, so moving one port moves every peer that dials it. An address set explicitly in the
environment (PARFUSION_ALLOCATOR_NODEAGENT_ADDRESS, ...) or edited in the YAML is left alone.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from parfusion.services import BY_NAME, SERVICES, ServiceSpec, address_references, env_key
from services.common.config import ConfigError, build_settings, load_config

# A wildcard bind is reached on loopback from this host.
_WILDCARDS = {"", "0.0.0.0", "::", "[::]"}


@dataclass(frozen=True)
class Endpoint:
    spec: ServiceSpec
    bind_host: str
    port: int
    metrics_port: int | None

    @property
    def host(self) -> str:
        """The host a peer on this machine dials: the bind address, loopback for a wildcard."""
        if self.bind_host in _WILDCARDS:
            return "127.0.0.1"
        return f"[{self.bind_host}]" if ":" in self.bind_host else self.bind_host

    @property
    def address(self) -> str:
        """host:port for gRPC services, http://host:port for HTTP ones (the config's forms)."""
        hostport = f"{self.host}:{self.port}"
        return hostport if self.spec.protocol == "grpc" else f"http://{hostport}"

    @property
    def metrics_url(self) -> str:
        if self.metrics_port:
            return f"http://{self.host}:{self.metrics_port}/metrics"
        return f"http://{self.host}:{self.port}/metrics"

    @property
    def ports(self) -> tuple[int, ...]:
        return (self.port,) if not self.metrics_port else (self.port, self.metrics_port)


def endpoint(spec: ServiceSpec, env: Mapping[str, str] | None = None) -> Endpoint:
    """The service's endpoint; a config that cannot be read falls back to the table's defaults,
    moved by the same PARFUSION_* variables (a command must not dial another stack's port)."""
    try:
        settings = build_settings(spec.name, env=env)
    except ConfigError:
        table = {"port": spec.port, "metrics_port": spec.metrics_port}
        settings = build_settings(spec.name, env=env, document={spec.name: table})
    metrics = settings.metrics_port if spec.metrics_port is not None else None
    return Endpoint(spec, settings.host, settings.port or spec.port, metrics or spec.metrics_port)


def endpoints(env: Mapping[str, str] | None = None) -> dict[str, Endpoint]:
    return {spec.name: endpoint(spec, env) for spec in SERVICES}


def address_of(name: str, env: Mapping[str, str] | None = None) -> str:
    """How a client (a `parfusion` command) reaches ``name`` under this configuration."""
    return endpoint(BY_NAME[name], env).address


def peer_environment(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """PARFUSION_<SECTION>_<KEY> for each cross-service address whose target moved.

    Only references not already set in ``env`` are returned, so an explicit address wins.
    """
    env = os.environ if env is None else env
    try:
        doc = load_config()
    except ConfigError:
        return {}
    where = endpoints(env)
    out: dict[str, str] = {}
    for ref in address_references(doc):
        key = env_key(ref.section, ref.key)
        if key in env:
            continue
        target = where[ref.service]
        rewritten = ref.rewrite(target.host, target.port)
        if rewritten != ref.value:
            out[key] = rewritten
    return out
