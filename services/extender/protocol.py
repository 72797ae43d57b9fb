"""The kube-scheduler extender protocol v1 on the wire: decoding requests, encoding replies.

Mirrors k8s.io/kube-scheduler/extender/v1 (types.go) and how pkg/scheduler/extender.go uses it.
Those Go structs carry no JSON tags, so kube-scheduler sends the Go field names as they are
(``Pod``, ``Nodes``, ``NodeNames``, ``PodName``...) and decodes replies case-insensitively; the
Pod and the Nodes inside are ordinary core/v1 JSON. Two modes, chosen by the scheduler's
``nodeCacheCapable``: full ``Nodes`` (a NodeList) or only ``NodeNames``. kube-scheduler reads
``NodeNames`` from a filter reply only when it is node-cache-capable and ``Nodes`` otherwise, so
every reply is written in the mode it was asked in.

Only what the decision needs is decoded (msgspec skips the rest); node objects are carried as
``msgspec.Raw`` slices of the request and written back byte for byte, never rebuilt.

Every way a body can be wrong is a :class:`ProtocolError` (400 naming the field): not JSON,
invalid UTF-8 anywhere (inside a node object too), nested too deeply (msgspec raises
RecursionError), the wrong shape, and ``Nodes`` and ``NodeNames`` that disagree (a request may
only teach the extender what it states consistently: its names are never keys for another
node's row).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Annotated, TypeVar

import msgspec

MIN_EXTENDER_PRIORITY = 0
MAX_EXTENDER_PRIORITY = 10
T = TypeVar("T")
# Go's int32 (pod priority, PDB violation counts): a longer number is a bad body, not a bignum
Int32 = Annotated[int, msgspec.Meta(ge=-(2**31), le=2**31 - 1)]


class ProtocolError(ValueError):
    """The body is not valid JSON or not shaped like the protocol message; ``field`` names where."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


def _refusing_deep_nesting(decode: Callable[[bytes], T]) -> Callable[[bytes], T]:
    """msgspec answers JSON nested beyond its limit with RecursionError: that is a bad body."""

    @functools.wraps(decode)
    def bounded(body: bytes) -> T:
        try:
            return decode(body)
        except RecursionError:
            raise ProtocolError("JSON nested too deeply") from None

    return bounded


# --- core/v1 subsets (lower-case JSON tags, as Kubernetes serialises them) -------------------


class ObjectMeta(msgspec.Struct, omit_defaults=True):
    name: str = ""
    namespace: str = ""
    uid: str = ""
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None


class ResourceRequirements(msgspec.Struct):
    requests: dict[str, str] | None = None
    limits: dict[str, str] | None = None


class Container(msgspec.Struct):
    name: str = ""
    resources: ResourceRequirements | None = None


class PodSpec(msgspec.Struct):
    containers: list[Container] | None = None
    nodeName: str = ""
    schedulerName: str = ""
    priority: Int32 | None = None


class Pod(msgspec.Struct):
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: PodSpec | None = None

    @property
    def key(self) -> str:
        return f"{self.metadata.namespace or 'default'}/{self.metadata.name}"


class NodeMeta(msgspec.Struct):
    name: str = ""
    resourceVersion: str = ""
    labels: dict[str, str] | None = None


class NodeCondition(msgspec.Struct):
    type: str = ""
    status: str = ""


class NodeStatus(msgspec.Struct):
    allocatable: dict[str, str] | None = None
    capacity: dict[str, str] | None = None
    conditions: list[NodeCondition] | None = None


class NodeSpec(msgspec.Struct):
    unschedulable: bool = False


class NodeHead(msgspec.Struct):
    """The few fields of a core/v1 Node the node view reads."""

    metadata: NodeMeta = msgspec.field(default_factory=NodeMeta)
    spec: NodeSpec | None = None
    status: NodeStatus | None = None


class NodeList(msgspec.Struct, omit_defaults=True):
    """A core/v1 NodeList with each item kept as the raw bytes it arrived as."""

    items: list[msgspec.Raw] | None = None
    metadata: msgspec.Raw = msgspec.field(default_factory=lambda: msgspec.Raw(b"{}"))
    kind: str | None = None
    apiVersion: str | None = None


class MetaPod(msgspec.Struct):
    UID: str = ""


class MetaVictims(msgspec.Struct):
    Pods: list[MetaPod] | None = None
    NumPDBViolations: Int32 = 0


class VictimPodMeta(msgspec.Struct):
    uid: str = ""


class VictimPod(msgspec.Struct):
    metadata: VictimPodMeta = msgspec.field(default_factory=VictimPodMeta)


class Victims(msgspec.Struct):
    Pods: list[VictimPod] | None = None
    NumPDBViolations: Int32 = 0


# --- the extender messages ------------------------------------------------------------------


@dataclass
class ExtenderArgs:
    """Filter / prioritize arguments. Exactly one of ``nodes`` / ``node_names`` is the mode."""

    pod: Pod
    nodes: NodeList | None
    node_names: list[str] | None
    heads: list[NodeHead] = field(default_factory=list)  # parallel to nodes.items
    names_key: bytes | None = None  # NodeNames as sent: a cheap key for repeated candidate lists

    @property
    def by_names(self) -> bool:
        return self.nodes is None

    def candidate_names(self) -> list[str]:
        if self.nodes is None:
            return self.node_names or []
        return [h.metadata.name for h in self.heads]


@dataclass
class ExtenderBindingArgs:
    pod_name: str
    pod_namespace: str
    pod_uid: str
    node: str


@dataclass
class ExtenderPreemptionArgs:
    pod: Pod
    # node -> victim pod UIDs and PDB violations, from whichever map the scheduler sent
    victims: dict[str, tuple[list[str], int]]


_top = msgspec.json.Decoder(dict[str, msgspec.Raw])
_pod = msgspec.json.Decoder(Pod | None)
_node_list = msgspec.json.Decoder(NodeList | None)
_node_head = msgspec.json.Decoder(NodeHead)
_names = msgspec.json.Decoder(list[str] | None)
_string = msgspec.json.Decoder(str | None)
_meta_victims = msgspec.json.Decoder(dict[str, MetaVictims | None] | None)
_victims = msgspec.json.Decoder(dict[str, Victims | None] | None)
_encoder = msgspec.json.Encoder()


def _fields(body: bytes) -> dict[str, msgspec.Raw]:
    """Top-level fields by lower-cased name: Go's decoder matches field names case-insensitively."""
    if not body:
        raise ProtocolError("request body is empty; expected a JSON object")
    try:
        raw = _top.decode(body)
    except msgspec.DecodeError as exc:
        raise ProtocolError(f"malformed JSON or not an object: {exc}") from exc
    return {k.lower(): v for k, v in raw.items()}


def _decode(decoder: msgspec.json.Decoder, raw: msgspec.Raw | None, name: str):  # type: ignore[no-untyped-def]
    if raw is None:
        return None
    try:
        return decoder.decode(raw)
    except msgspec.ValidationError as exc:
        raise ProtocolError(f"{name}: {exc}", field=name) from exc
    except msgspec.DecodeError as exc:  # invalid UTF-8 inside a Raw the top level kept whole
        raise ProtocolError(f"{name}: {exc}", field=name) from exc


def _required_pod(fields: dict[str, msgspec.Raw]) -> Pod:
    pod = _decode(_pod, fields.get("pod"), "Pod")
    if pod is None:
        raise ProtocolError("Pod is required", field="Pod")
    if not pod.metadata.name:
        raise ProtocolError("Pod.metadata.name is required", field="Pod.metadata.name")
    return pod


_HEAD_CACHE_LIMIT = 20_000
_HEAD_CACHE_BYTES = 64 << 20  # node objects kept as keys: bounded in bytes as well as count
_head_cache: dict[bytes, NodeHead] = {}
_head_cache_size = [0]


def _heads(items: list[msgspec.Raw]) -> list[NodeHead]:
    """Each node's head, decoded once per distinct node object: kube-scheduler resends the same
    Node bytes cycle after cycle (they change with status updates, every few minutes)."""
    cache = _head_cache
    out = []
    for item in items:
        key = bytes(item)
        head = cache.get(key)
        if head is None:
            head = _node_head.decode(key)
            if (
                len(cache) >= _HEAD_CACHE_LIMIT
                or _head_cache_size[0] + len(key) > _HEAD_CACHE_BYTES
            ):
                cache.clear()
                _head_cache_size[0] = 0
            cache[key] = head
            _head_cache_size[0] += len(key)
        out.append(head)
    return out


class _ExactArgs(msgspec.Struct):
    """ExtenderArgs with the Go field names exactly as kube-scheduler writes them: one scan."""

    Pod: Pod | None = None
    Nodes: NodeList | None = None
    NodeNames: msgspec.Raw = msgspec.field(default_factory=lambda: msgspec.Raw(b"null"))


_exact_args = msgspec.json.Decoder(_ExactArgs)


@_refusing_deep_nesting
def decode_extender_args(body: bytes) -> ExtenderArgs:
    pod: Pod | None = None
    names_key: bytes | None = None
    try:
        exact = _exact_args.decode(body)
        pod, nodes = exact.Pod, exact.Nodes
        names_key = bytes(exact.NodeNames)
        names = _decode(_names, exact.NodeNames, "NodeNames")
        if names is None:
            names_key = None
    except msgspec.DecodeError:
        exact = None  # wrong shape or other-case names: the general path says which field
    if exact is None or pod is None or (nodes is None and names is None):
        fields = _fields(body)
        pod = _required_pod(fields)
        nodes = _decode(_node_list, fields.get("nodes"), "Nodes")
        names = _decode(_names, fields.get("nodenames"), "NodeNames")
        names_key = None
    elif not pod.metadata.name:
        raise ProtocolError("Pod.metadata.name is required", field="Pod.metadata.name")
    if nodes is None and names is None:
        raise ProtocolError("one of Nodes (a NodeList) or NodeNames is required", field="Nodes")
    heads: list[NodeHead] = []
    if nodes is not None:
        nodes.items = nodes.items or []
        try:
            heads = _heads(nodes.items)
        except (msgspec.ValidationError, msgspec.DecodeError):  # the item-by-item path says which
            heads = [
                _decode(_node_head, item, f"Nodes.items[{i}]") for i, item in enumerate(nodes.items)
            ]
        for i, head in enumerate(heads):
            if not head.metadata.name:
                raise ProtocolError(
                    "node without metadata.name", field=f"Nodes.items[{i}].metadata.name"
                )
        if names is not None:
            if names != [h.metadata.name for h in heads]:
                raise ProtocolError(
                    "NodeNames must list exactly the names of Nodes.items, in order, when both "
                    "are sent (kube-scheduler sends one of them)",
                    field="NodeNames",
                )
            names_key = None  # the candidates are the Nodes: never cache rows under NodeNames
    return ExtenderArgs(pod=pod, nodes=nodes, node_names=names, heads=heads, names_key=names_key)


@_refusing_deep_nesting
def decode_binding_args(body: bytes) -> ExtenderBindingArgs:
    fields = _fields(body)
    values: dict[str, str] = {}
    for key, label in (
        ("podname", "PodName"),
        ("podnamespace", "PodNamespace"),
        ("poduid", "PodUID"),
        ("node", "Node"),
    ):
        values[key] = _decode(_string, fields.get(key), label) or ""
    for key, label in (("podname", "PodName"), ("node", "Node")):
        if not values[key]:
            raise ProtocolError(f"{label} is required", field=label)
    return ExtenderBindingArgs(
        pod_name=values["podname"],
        pod_namespace=values["podnamespace"] or "default",
        pod_uid=values["poduid"],
        node=values["node"],
    )


@_refusing_deep_nesting
def decode_preemption_args(body: bytes) -> ExtenderPreemptionArgs:
    fields = _fields(body)
    pod = _required_pod(fields)
    victims: dict[str, tuple[list[str], int]] = {}
    meta = _decode(_meta_victims, fields.get("nodenametometavictims"), "NodeNameToMetaVictims")
    full = _decode(_victims, fields.get("nodenametovictims"), "NodeNameToVictims")
    for node, mv in (meta or {}).items():
        if mv is not None:
            victims[node] = ([p.UID for p in mv.Pods or ()], mv.NumPDBViolations)
    for node, v in (full or {}).items():
        if v is not None and node not in victims:
            victims[node] = ([p.metadata.uid for p in v.Pods or ()], v.NumPDBViolations)
    return ExtenderPreemptionArgs(pod=pod, victims=victims)


# --- replies --------------------------------------------------------------------------------


def encode_filter_result(
    args: ExtenderArgs,
    kept: list[int] | list[str],
    failed: dict[str, str],
    unresolvable: dict[str, str],
    error: str = "",
) -> bytes:
    """ExtenderFilterResult in the request's mode.

    ``kept``: indexes into ``args.nodes.items`` in NodeList mode, names in NodeNames mode. The
    kept node objects are the request's own bytes (Raw), so nothing is rebuilt.
    """
    nodes_out: dict[str, object] | None = None
    names_out: list[str] | None = None
    if args.nodes is not None:
        items = args.nodes.items or []
        nodes_out = {
            "metadata": args.nodes.metadata,
            "items": [items[i] for i in kept],  # type: ignore[index]
        }
        if args.nodes.kind:
            nodes_out["kind"] = args.nodes.kind
        if args.nodes.apiVersion:
            nodes_out["apiVersion"] = args.nodes.apiVersion
    else:
        names_out = kept  # type: ignore[assignment]
    return _encoder.encode(
        {
            "Nodes": nodes_out,
            "NodeNames": names_out,
            "FailedNodes": failed,
            "FailedAndUnresolvableNodes": unresolvable,
            "Error": error,
        }
    )


_SCORE_TAIL = [f',"Score":{s}}}'.encode() for s in range(MAX_EXTENDER_PRIORITY + 1)]


def host_heads(hosts: Sequence[str]) -> list[bytes] | None:
    """``{"Host":"<name>"`` per host, from one encode; None when a name needs JSON escapes."""
    encoded = _encoder.encode(list(hosts))
    if not hosts or b"\\" in encoded:
        return None
    return [b'{"Host":"' + part + b'"' for part in encoded[2:-2].split(b'","')]


def encode_host_priorities(
    hosts: Sequence[str], scores: Sequence[int], heads: list[bytes] | None = None
) -> bytes:
    """HostPriorityList ``[{"Host": ..., "Score": ...}]``; scores are 0..10.

    Joined from per-host prefixes (``host_heads``, cacheable per candidate list), so a
    /prioritize with 5,000 names answers in about a millisecond."""
    if not hosts:
        return b"[]"
    heads = heads if heads is not None else host_heads(hosts)
    if heads is None:
        return _encoder.encode(
            [{"Host": h, "Score": s} for h, s in zip(hosts, scores, strict=True)]
        )
    return b"[" + b",".join(map(bytes.__add__, heads, [_SCORE_TAIL[s] for s in scores])) + b"]"


def encode_binding_result(error: str = "") -> bytes:
    return _encoder.encode({"Error": error})


def encode_preemption_result(victims: dict[str, tuple[list[str], int]]) -> bytes:
    """kube-scheduler always reads NodeNameToMetaVictims back, whichever map it sent."""
    return _encoder.encode(
        {
            "NodeNameToMetaVictims": {
                node: {"Pods": [{"UID": uid} for uid in uids], "NumPDBViolations": pdb}
                for node, (uids, pdb) in victims.items()
            }
        }
    )
