"""A pod's intent as the extender reads it: services/core/podintent.py on the pod's metadata."""

from __future__ import annotations

from services.core import podintent as _core
from services.core.podintent import ANNOTATION, NO_INTENT, PodIntent, intent_name

from .protocol import Pod


def pod_intent(pod: Pod) -> PodIntent:
    return _core.pod_intent(pod.metadata)


__all__ = ["ANNOTATION", "NO_INTENT", "PodIntent", "intent_name", "pod_intent"]
