"""A pod's ResourceIntent, read from its annotation or labels and validated like the allocator does.

Two ways for a pod to carry an intent (docs/kubernetes.md lists them):

* the annotation ``parfusion.io/intent``: the ResourceIntent in its proto JSON form (snake_case or
  lowerCamelCase keys; enums short ``ONLINE`` or full ``WORKLOAD_CLASS_ONLINE``);
* labels, for the common fields only (label values cannot hold JSON):
  ``parfusion.io/class`` (online|batch|robot|urgent, required for this form),
  ``parfusion.io/deadline-ms``, ``parfusion.io/priority``, ``parfusion.io/min-units``,
  ``parfusion.io/max-units``, ``parfusion.io/parallel-fraction``,
  ``parfusion.io/base-service-ms``, ``parfusion.io/gpu-lane``, ``parfusion.io/gpu-share``,
  ``parfusion.io/preemptible`` (true|false).

The annotation wins when both are present. A pod with neither has no intent and the extender
passes it through. Validation is the allocator's own (services/core/validation.py), so a pod
intent the extender accepts is one SubmitIntent would accept. kube-scheduler sends the same pod
to /filter, /prioritize and /bind in turn, and replicas carry the same annotation, so validation
results are cached on the raw strings and only the id (the pod UID) and name are per pod.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

from services.common.errors import InvalidArgument
from services.core.convert import intent_from_document, intent_to_spec
from services.core.model import IntentSpec
from services.core.validation import normalize_intent

from .protocol import Pod

ANNOTATION = "parfusion.io/intent"
LABEL_PREFIX = "parfusion.io/"
LABEL_FIELDS: dict[str, tuple[str, ...]] = {
    "class": ("workload_class",),
    "deadline-ms": ("slo", "deadline_ms"),
    "priority": ("priority",),
    "min-units": ("parallelism", "min"),
    "max-units": ("parallelism", "max"),
    "parallel-fraction": ("speedup", "parallel_fraction"),
    "base-service-ms": ("speedup", "base_service_ms"),
    "gpu-lane": ("gpu", "lane"),
    "gpu-share": ("gpu", "share"),
    "preemptible": ("preemptible",),
}
PLACEHOLDER_ID = "pod-intent"  # replaced by the pod's UID after validation
_NOT_DNS_LABEL = re.compile(r"[^a-z0-9-]+")


@dataclass(frozen=True, slots=True)
class PodIntent:
    """What the extender knows about a pod's intent: a spec, an error, or nothing (pass through)."""

    spec: IntentSpec | None
    error: str = ""
    source: str = ""  # "annotation", "labels" or "" (none)

    @property
    def present(self) -> bool:
        return self.spec is not None or bool(self.error)


NO_INTENT = PodIntent(spec=None)


def intent_name(pod_name: str) -> str:
    """A DNS-1123 label from a pod name (which may be a longer, dotted subdomain)."""
    name = _NOT_DNS_LABEL.sub("-", pod_name.lower()).strip("-")[:63].strip("-")
    return name or "pod"


def pod_intent(pod: Pod) -> PodIntent:
    meta = pod.metadata
    annotation = (meta.annotations or {}).get(ANNOTATION)
    if annotation is not None:
        found, own_id, own_name = _from_annotation(annotation)
    else:
        labels = meta.labels or {}
        ours = tuple(sorted((k, v) for k, v in labels.items() if k.startswith(LABEL_PREFIX)))
        if not ours:
            return NO_INTENT
        found, own_id, own_name = _from_labels(ours)
    if found.spec is None or (own_id and own_name):
        return found
    # Replicas share one validated intent; each pod gets its own id (its UID) and name.
    ident = meta.uid or f"{meta.namespace or 'default'}.{meta.name}"
    spec = replace(
        found.spec,
        id=found.spec.id if own_id else ident,
        name=found.spec.name if own_name else intent_name(meta.name),
    )
    return PodIntent(spec, "", found.source)


Cached = tuple[PodIntent, bool, bool]  # (intent, the document set its id, ... its name)


@lru_cache(maxsize=4096)
def _from_annotation(text: str) -> Cached:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        error = f"annotation {ANNOTATION} is not valid JSON: {exc}"
        return PodIntent(None, error, "annotation"), False, False
    if not isinstance(doc, dict):
        error = f"annotation {ANNOTATION} must be a JSON object"
        return PodIntent(None, error, "annotation"), False, False
    return _validated(doc, "annotation")


@lru_cache(maxsize=4096)
def _from_labels(labels: tuple[tuple[str, str], ...]) -> Cached:
    doc: dict[str, Any] = {}
    for key, value in labels:
        suffix = key[len(LABEL_PREFIX) :]
        path = LABEL_FIELDS.get(suffix)
        if path is None:
            continue  # other parfusion.io/* labels (selectors, ownership) are not intent fields
        try:
            parsed: Any = _label_value(suffix, value)
        except ValueError:
            return PodIntent(None, f"label {key}: cannot parse {value!r}", "labels"), False, False
        target = doc
        for part in path[:-1]:
            target = target.setdefault(part, {})
        target[path[-1]] = parsed
    if "workload_class" not in doc:
        error = f"label {LABEL_PREFIX}class is required when parfusion.io/* labels are used"
        return PodIntent(None, error, "labels"), False, False
    return _validated(doc, "labels")


def _label_value(suffix: str, value: str) -> Any:
    if suffix in ("class", "gpu-lane"):
        return value
    if suffix == "preemptible":
        low = value.lower()
        if low not in ("true", "false"):
            raise ValueError(value)
        return low == "true"
    if suffix in ("priority", "min-units", "max-units"):
        return int(value)
    return float(value)


def _validated(doc: dict[str, Any], source: str) -> Cached:
    own_id, own_name = bool(doc.get("id")), bool(doc.get("name"))
    doc = {**doc, "id": doc.get("id") or PLACEHOLDER_ID, "name": doc.get("name") or "pod"}
    try:
        spec = intent_to_spec(normalize_intent(intent_from_document(doc)))
    except InvalidArgument as exc:
        return PodIntent(None, f"invalid intent: {exc}", source), own_id, own_name
    return PodIntent(spec, "", source), own_id, own_name
