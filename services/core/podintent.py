"""A pod's ResourceIntent, read from its annotation or labels and validated like the allocator does.

Shared by the extender (scoring the pod) and the allocator (adopting the pods bound to its node),
so both read a pod's intent the same way.

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

The annotation is hostile input like any body: strict JSON (orjson: no NaN/Infinity, no integer
beyond 64 bits), at most ``MAX_ANNOTATION_BYTES`` and ``MAX_DEPTH`` levels; anything that fails
is an invalid intent with the reason, never an error of the caller.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any, Protocol

import orjson

from parfusion.v1 import intent_pb2
from services.common.errors import InvalidArgument
from services.core.convert import intent_from_document, intent_to_spec
from services.core.model import IntentSpec
from services.core.validation import normalize_intent

ANNOTATION = "parfusion.io/intent"
# The extended resource that marks a pod carrying an intent, so a kube-scheduler whose extender
# manages it calls the extender only for those pods (docs/kubernetes.md); the admission policy in
# deploy/ adds it to every such pod at creation.
MARKER = ANNOTATION
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
MAX_ANNOTATION_BYTES = 16 * 1024  # with the caches below: at most 64 MiB of kept text
MAX_DEPTH = 8  # a ResourceIntent nests 3 levels (intent.slo.deadline_ms); labels one more
_NOT_DNS_LABEL = re.compile(r"[^a-z0-9-]+")


@dataclass(frozen=True, slots=True)
class PodIntent:
    """What the extender knows about a pod's intent: a spec, an error, or nothing (pass through)."""

    spec: IntentSpec | None
    error: str = ""
    source: str = ""  # "annotation", "labels" or "" (none)
    # the validated message the spec came from (placeholder id and name): see pod_intent_message
    message: intent_pb2.ResourceIntent | None = field(default=None, compare=False, repr=False)

    @property
    def present(self) -> bool:
        return self.spec is not None or bool(self.error)


NO_INTENT = PodIntent(spec=None)


def intent_name(pod_name: str) -> str:
    """A DNS-1123 label from a pod name (which may be a longer, dotted subdomain)."""
    name = _NOT_DNS_LABEL.sub("-", pod_name.lower()).strip("-")[:63].strip("-")
    return name or "pod"


class PodMeta(Protocol):
    """The pod metadata fields an intent is read from (the extender's and the allocator's)."""

    name: str
    namespace: str
    uid: str
    labels: dict[str, str] | None
    annotations: dict[str, str] | None


def pod_intent(meta: PodMeta) -> PodIntent:
    """The intent a pod carries, given its metadata."""
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
    return PodIntent(spec, "", found.source, found.message)


def pod_intent_message(found: PodIntent) -> intent_pb2.ResourceIntent | None:
    """The pod's intent as a ResourceIntent message with the pod's own id and name."""
    if found.spec is None or found.message is None:
        return None
    message = intent_pb2.ResourceIntent()
    message.CopyFrom(found.message)
    message.id, message.name = found.spec.id, found.spec.name
    return message


Cached = tuple[PodIntent, bool, bool]  # (intent, the document set its id, ... its name)


@lru_cache(maxsize=4096)
def _from_annotation(text: str) -> Cached:
    def refused(error: str) -> Cached:
        return PodIntent(None, f"annotation {ANNOTATION} {error}", "annotation"), False, False

    if len(text) > MAX_ANNOTATION_BYTES:
        return refused(f"is {len(text)} characters; at most {MAX_ANNOTATION_BYTES}")
    try:
        doc = orjson.loads(text.encode("utf-8", "surrogatepass"))
    except orjson.JSONDecodeError as exc:
        return refused(f"is not valid JSON: {exc}")
    if not isinstance(doc, dict):
        return refused("must be a JSON object")
    if _depth(doc) > MAX_DEPTH:
        return refused(f"nests deeper than {MAX_DEPTH} levels")
    return _validated(doc, "annotation")


def _depth(doc: Any) -> int:
    """Nesting depth of a parsed JSON value, without recursion."""
    deepest, stack = 0, [(doc, 1)]
    while stack:
        value, level = stack.pop()
        if isinstance(value, dict | list):
            deepest = max(deepest, level)
            children = value.values() if isinstance(value, dict) else value
            stack.extend((child, level + 1) for child in children)
    return deepest


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
        message = normalize_intent(intent_from_document(doc))
        spec = intent_to_spec(message)
    except InvalidArgument as exc:
        return PodIntent(None, f"invalid intent: {exc}", source), own_id, own_name
    except (ValueError, OverflowError, TypeError) as exc:  # a number no field can hold
        error = f"invalid intent: {type(exc).__name__}: {exc}"
        return PodIntent(None, error, source), own_id, own_name
    return PodIntent(spec, "", source, message), own_id, own_name
