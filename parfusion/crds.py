"""The custom resources PARFusion defines, with schemas derived from the proto descriptor.

``ResourceIntent`` (namespaced): ``spec`` is parfusion.v1.ResourceIntent in its proto JSON form,
so the two cannot drift; ``.status`` is what the node's allocator decided
(services/allocator/kubestatus.py), written through the status subresource. ``spec.node`` is a
selectable field: each allocator watches only the intents naming its node.

``NodeIntentState`` (cluster-scoped, one per node, named after it): the node's capacity, lanes,
contention and residents as its allocator sees them, plus a heartbeat; the extender watches
them (services/extender/nodestates.py).
"""

from __future__ import annotations

from typing import Any

from google.protobuf.descriptor import FieldDescriptor

from parfusion.v1 import intent_pb2

CRD_GROUP = "parfusion.io"
PART_OF = "parfusion"
DECISIONS = ["Pending", "Admitted", "Degraded", "Throttled", "Preempted", "Invalid"]


def _labels(component: str) -> dict[str, str]:
    return {"app.kubernetes.io/name": component, "app.kubernetes.io/part-of": PART_OF}


_SCALARS: dict[int, dict[str, Any]] = {
    FieldDescriptor.TYPE_DOUBLE: {"type": "number"},
    FieldDescriptor.TYPE_FLOAT: {"type": "number"},
    FieldDescriptor.TYPE_INT32: {"type": "integer", "format": "int32"},
    FieldDescriptor.TYPE_SINT32: {"type": "integer", "format": "int32"},
    FieldDescriptor.TYPE_UINT32: {"type": "integer", "format": "int64", "minimum": 0},
    FieldDescriptor.TYPE_INT64: {"type": "integer", "format": "int64"},
    FieldDescriptor.TYPE_UINT64: {"type": "integer", "format": "int64", "minimum": 0},
    FieldDescriptor.TYPE_BOOL: {"type": "boolean"},
    FieldDescriptor.TYPE_STRING: {"type": "string"},
}


def _field_schema(field: FieldDescriptor) -> dict[str, Any]:
    if field.message_type is not None and field.message_type.GetOptions().map_entry:
        value = field.message_type.fields_by_name["value"]
        return {"type": "object", "additionalProperties": _field_schema(value)}
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        assert field.message_type is not None
        if field.message_type.full_name == "google.protobuf.Timestamp":
            item: dict[str, Any] = {"type": "string", "format": "date-time"}
        else:
            item = message_schema(field.message_type)
    elif field.type == FieldDescriptor.TYPE_ENUM:
        enum = field.enum_type
        assert enum is not None
        prefix = _enum_prefix(enum.values_by_name)
        names = [v.name for v in enum.values if v.number != 0]
        # full names (the proto JSON form) and the short ones the intent documents use
        item = {"type": "string", "enum": names + [n.removeprefix(prefix) for n in names]}
    else:
        item = dict(_SCALARS[field.type])
    if field.is_repeated:
        return {"type": "array", "items": item}
    return item


def _enum_prefix(names: Any) -> str:
    unspecified = next(n for n in names if n.endswith("_UNSPECIFIED"))
    return unspecified[: -len("UNSPECIFIED")]


def message_schema(message: Any) -> dict[str, Any]:  # a protobuf Descriptor (either backend)
    return {
        "type": "object",
        "properties": {f.json_name: _field_schema(f) for f in message.fields},
    }


def _obj(**properties: Any) -> dict[str, Any]:
    return {"type": "object", "properties": properties}


_NUMBER = {"type": "number"}
_INT = {"type": "integer", "format": "int64"}
_STRING = {"type": "string"}
_TIME = {"type": "string", "format": "date-time"}


def intent_spec_schema() -> dict[str, Any]:
    spec_schema = message_schema(intent_pb2.ResourceIntent.DESCRIPTOR)
    # createdAt is server-set: a CR's creationTimestamp plays that part.
    spec_schema["properties"].pop("createdAt", None)
    return spec_schema


def intent_status_schema() -> dict[str, Any]:
    condition = _obj(
        type={"type": "string", "enum": ["Admitted", "Degraded", "Throttled", "Preempted"]},
        status={"type": "string", "enum": ["True", "False", "Unknown"]},
        reason=_STRING,
        message=_STRING,
        observedGeneration=_INT,
        lastTransitionTime=_TIME,
    )
    condition["required"] = ["type", "status"]
    return _obj(
        observedGeneration=_INT,
        node=_STRING,
        decision={"type": "string", "enum": DECISIONS},
        units=_INT,
        workers=_INT,
        degradation={"type": "string", "enum": ["NORMAL", "FP16", "INT8"]},
        gpuLane=_STRING,
        predictedP99Ms=_NUMBER,
        observedP99Ms=_NUMBER,
        slackMs=_NUMBER,
        deadlineRisk=_NUMBER,
        reason=_STRING,
        updatedAt=_TIME,
        conditions={
            "type": "array",
            "items": condition,
            "x-kubernetes-list-type": "map",
            "x-kubernetes-list-map-keys": ["type"],
        },
    )


def _crd(
    plural: str,
    kind: str,
    scope: str,
    short: list[str],
    description: str,
    properties: dict[str, Any],
    columns: list[dict[str, Any]],
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    version: dict[str, Any] = {
        "name": "v1",
        "served": True,
        "storage": True,
        "schema": {
            "openAPIV3Schema": {
                "type": "object",
                "description": description,
                "properties": properties,
            }
        },
        "subresources": {"status": {}},
        "additionalPrinterColumns": columns,
        **(extra or {}),
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{CRD_GROUP}", "labels": _labels(kind.lower())},
        "spec": {
            "group": CRD_GROUP,
            "scope": scope,
            "names": {
                "plural": plural,
                "singular": kind.lower(),
                "kind": kind,
                "shortNames": short,
            },
            "versions": [version],
        },
    }


def _column(name: str, kind: str, path: str, priority: int = 0) -> dict[str, Any]:
    column: dict[str, Any] = {"name": name, "type": kind, "jsonPath": path}
    if priority:
        column["priority"] = priority
    return column


def resource_intent_crd() -> dict[str, Any]:
    spec_schema = intent_spec_schema()
    spec_schema["required"] = ["workloadClass"]
    return _crd(
        "resourceintents",
        "ResourceIntent",
        "Namespaced",
        ["ri"],
        "parfusion.v1.ResourceIntent (proto JSON form) as a Kubernetes object",
        {"spec": spec_schema, "status": intent_status_schema()},
        [
            _column("Class", "string", ".spec.workloadClass"),
            _column("Node", "string", ".spec.node"),
            _column("Decision", "string", ".status.decision"),
            _column("Units", "integer", ".status.units"),
            _column("Slack-ms", "number", ".status.slackMs"),
            _column("Deadline-ms", "number", ".spec.slo.deadlineMs", priority=1),
            _column("Lane", "string", ".spec.gpu.lane", priority=1),
            _column("Reason", "string", ".status.reason", priority=1),
        ],
        # each allocator lists/watches only `spec.node=<its node>`
        {"selectableFields": [{"jsonPath": ".spec.node"}]},
    )


def node_intent_state_crd() -> dict[str, Any]:
    lane = _obj(name=_STRING, gpus=_INT, shareUnits=_INT, freeShareUnits=_NUMBER)
    resident = _obj(
        id=_STRING,
        name=_STRING,
        **{"class": _STRING},
        priority=_INT,
        units=_INT,
        slackMs=_NUMBER,
        deadlineRisk=_NUMBER,
        decision={"type": "string", "enum": DECISIONS},
        intent=intent_spec_schema(),
    )
    status = _obj(
        nodeName=_STRING,
        capacityUnits=_INT,
        freeUnits=_INT,
        contention=_NUMBER,
        stale={"type": "boolean"},
        policy=_STRING,
        planGeneration=_INT,
        lanes={"type": "array", "items": lane},
        residents={"type": "array", "items": resident},
        residentsTotal=_INT,
        omittedResidents={"type": "array", "items": _STRING},
        heartbeat=_TIME,
    )
    return _crd(
        "nodeintentstates",
        "NodeIntentState",
        "Cluster",
        ["nis"],
        "One node's PARFusion state as its allocator publishes it (named after the node)",
        {"spec": _obj(nodeName=_STRING), "status": status},
        [
            _column("Capacity", "integer", ".status.capacityUnits"),
            _column("Free", "integer", ".status.freeUnits"),
            _column("Contention", "number", ".status.contention"),
            _column("Heartbeat", "date", ".status.heartbeat"),
        ],
    )
