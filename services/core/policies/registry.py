"""Policy registry: name -> factory, in the order the dashboard and experiments list them.

The allocator picks the active policy by name from config or SetPolicy; adding a policy means one
factory here and one module beside it.
"""

from __future__ import annotations

from collections.abc import Callable

from services.common.errors import InvalidArgument
from services.core.policies import parfusion as dmug_family
from services.core.policies import reference
from services.core.policies.base import Policy

POLICIES: dict[str, Callable[[], Policy]] = {
    "parfusion": dmug_family.parfusion,
    "baseline": reference.baseline,
    "fifo": reference.fifo,
    "static": reference.static,
    "loadbalance-only": reference.loadbalance_only,
    "no-crosslayer": dmug_family.no_crosslayer,
    "edf-only": dmug_family.edf_only,
    "no-gpuintent": dmug_family.no_gpuintent,
    "no-predictor": dmug_family.no_predictor,
    "no-elastic": dmug_family.no_elastic,
    "no-degrade": dmug_family.no_degrade,
    "no-preemption": dmug_family.no_preemption,
}

DEFAULT_POLICY = "parfusion"


def get_policy(name: str) -> Policy:
    """The policy registered under `name`; InvalidArgument (field "name") for an unknown one."""
    factory = POLICIES.get(name)
    if factory is None:
        raise InvalidArgument(
            f"unknown policy {name!r}; known: {', '.join(POLICIES)}", field="name"
        )
    return factory()


def list_policies() -> list[Policy]:
    """Every policy, parfusion first, then the references, then the ablations."""
    return [factory() for factory in POLICIES.values()]
