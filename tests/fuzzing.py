"""Hostile inputs for the fuzz tests (tests/<service>/test_fuzz.py), mutated from valid examples.

Two families, both Hypothesis strategies:

- :func:`json_bodies`: a valid JSON document with one or more places replaced by what a hostile
  client sends (nesting thousands deep, 400-digit integers, ``NaN``/``Infinity``/``1e400``
  literals, invalid UTF-8, lone surrogates, wrong types, huge strings and lists, unknown enum
  names), keys dropped or added, or the bytes themselves cut or flipped.
- :func:`proto_bodies`: the serialized bytes of a valid request with fields set through the
  message's descriptor to extremes (±inf, NaN, 2^64-1, negative counts, unknown enum numbers,
  long and odd strings, thousands of repeated entries), invalid UTF-8 spliced into a string
  field, or the bytes cut, flipped and padded.

How many examples each test draws: ``PARFUSION_FUZZ_EXAMPLES`` (a few hundred by default, for
``make test``; ``make fuzz`` runs 10,000 per service).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import descriptor
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

EXAMPLES = int(os.environ.get("PARFUSION_FUZZ_EXAMPLES", "200"))


def fuzz_settings(examples: int = EXAMPLES) -> Any:
    return settings(
        max_examples=examples,
        deadline=None,
        database=None,
        derandomize=os.environ.get("PARFUSION_FUZZ_RANDOM") is None,  # CI: the same inputs
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.function_scoped_fixture,
            HealthCheck.data_too_large,
            HealthCheck.filter_too_much,
        ],
    )


# --- JSON ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Raw:
    """Bytes written into the JSON text as they are (not valid JSON, or not UTF-8)."""

    text: bytes


HOSTILE_JSON: list[Any] = [
    Raw(b"[" * 5000 + b"]" * 5000),
    Raw(b'{"a":' * 2000 + b"1" + b"}" * 2000),
    Raw(b"9" * 400),
    Raw(b"-" + b"9" * 400),
    Raw(b"1e400"),
    Raw(b"-1e400"),
    Raw(b"NaN"),
    Raw(b"Infinity"),
    Raw(b"-Infinity"),
    Raw(b'"\xff\xfe\xc3"'),
    Raw(b'"\\ud800"'),
    Raw(b'"\\u0000"'),
    Raw(b""),
    Raw(b"tru"),
    2**63,
    2**64,
    -(2**63) - 1,
    -1,
    0,
    1e308,
    5e-324,
    -0.0,
    True,
    None,
    "",
    "x" * 70_000,
    "é" * 1000,
    "<img src=x onerror=alert(1)>",
    "../../../../etc/passwd",
    "WORKLOAD_CLASS_WHATEVER",
    "ONLINE",
    "1e7",
    "inf",
    "nan",
    "-5",
    "9" * 400,
    [],
    {},
    ["a"] * 2000,
    {"k" * 200: "v"},
]


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(doc, dict):
        for key, value in doc.items():
            out += _paths(value, (*prefix, key))
    elif isinstance(doc, list):
        for i, value in enumerate(doc[:20]):
            out += _paths(value, (*prefix, i))
    return out


def _replace(doc: Any, path: tuple[Any, ...], value: Any, drop: bool = False) -> Any:
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(doc, dict):
        copy = dict(doc)
        if drop and not rest:
            copy.pop(head, None)
        else:
            copy[head] = _replace(doc[head], rest, value, drop)
        return copy
    copy_list = list(doc)
    if drop and not rest:
        del copy_list[head]
    else:
        copy_list[head] = _replace(doc[head], rest, value, drop)
    return copy_list


def encode(doc: Any) -> bytes:
    """JSON bytes of a document that may hold :class:`Raw` pieces."""
    if isinstance(doc, Raw):
        return doc.text
    if isinstance(doc, dict):
        parts = [json.dumps(str(k)).encode() + b":" + encode(v) for k, v in doc.items()]
        return b"{" + b",".join(parts) + b"}"
    if isinstance(doc, list):
        return b"[" + b",".join(encode(v) for v in doc) + b"]"
    if isinstance(doc, float) and not math.isfinite(doc):
        return b"NaN" if math.isnan(doc) else (b"Infinity" if doc > 0 else b"-Infinity")
    return json.dumps(doc).encode()


def hostile_values() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.sampled_from(HOSTILE_JSON),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.floats(allow_nan=True, allow_infinity=True),
        st.text(max_size=40),
        st.binary(max_size=40).map(lambda b: Raw(b'"' + b.replace(b'"', b"") + b'"')),
    )


@st.composite
def mutated_documents(draw: st.DrawFn, valid: Any) -> Any:
    """A copy of ``valid`` with one to three places replaced, dropped or added to."""
    doc = valid
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        paths = _paths(doc)
        path = draw(st.sampled_from(paths))
        action = draw(st.sampled_from(["replace", "replace", "replace", "drop", "add"]))
        if action == "drop" and path:
            doc = _replace(doc, path, None, drop=True)
        elif action == "add":
            target: Any = doc
            for key in path:
                target = target[key]
            if isinstance(target, dict):
                extra = {
                    draw(st.sampled_from(["x", "Pod", "priority", "id"])): draw(hostile_values())
                }
                doc = _replace(doc, path, {**target, **extra})
            else:
                doc = _replace(doc, path, draw(hostile_values()))
        else:
            doc = _replace(doc, path, draw(hostile_values()))
    return doc


@st.composite
def json_bodies(draw: st.DrawFn, valid: Any) -> bytes:
    """Request bodies: a mutated document, sometimes with its bytes cut or flipped as well."""
    body = encode(draw(mutated_documents(valid)))
    return draw(_byte_damage(body))


@st.composite
def _byte_damage(draw: st.DrawFn, body: bytes) -> bytes:
    kind = draw(st.sampled_from(["none", "none", "none", "cut", "flip", "insert"]))
    if kind == "none" or not body:
        return body
    at = draw(st.integers(min_value=0, max_value=len(body) - 1))
    if kind == "cut":
        return body[:at]
    if kind == "flip":
        return body[:at] + bytes([body[at] ^ draw(st.integers(1, 255))]) + body[at + 1 :]
    return body[:at] + draw(st.binary(min_size=1, max_size=16)) + body[at:]


# --- protobuf -----------------------------------------------------------------------------

FD = descriptor.FieldDescriptor
_NUMBERS: dict[int, list[Any]] = {
    FD.TYPE_DOUBLE: [math.inf, -math.inf, math.nan, 1e308, -1e308, 5e-324, -0.0, -1.0],
    FD.TYPE_FLOAT: [math.inf, -math.inf, math.nan, 3.4e38, -1.0],
    FD.TYPE_INT32: [2**31 - 1, -(2**31), -1],
    FD.TYPE_SINT32: [2**31 - 1, -(2**31), -1],
    FD.TYPE_SFIXED32: [2**31 - 1, -(2**31)],
    FD.TYPE_INT64: [2**63 - 1, -(2**63), -1],
    FD.TYPE_SINT64: [2**63 - 1, -(2**63)],
    FD.TYPE_SFIXED64: [2**63 - 1, -(2**63)],
    FD.TYPE_UINT32: [2**32 - 1, 0],
    FD.TYPE_FIXED32: [2**32 - 1],
    FD.TYPE_UINT64: [2**64 - 1, 2**63, 0],
    FD.TYPE_FIXED64: [2**64 - 1],
}
_STRINGS = [
    "",
    "x" * 100_000,
    "é\u0000\u202e",
    "<script>alert(1)</script>",
    "../../etc/passwd",
    "a" * 64,
    "UPPER_case.dots",
    "-",
    "nan",
]


def _is_repeated(field: FD) -> bool:
    if hasattr(field, "is_repeated"):
        return bool(field.is_repeated)
    return bool(field.label == FD.LABEL_REPEATED)


def _scalar(draw: st.DrawFn, field: FD) -> Any:
    if field.type == FD.TYPE_BOOL:
        return draw(st.booleans())
    if field.type == FD.TYPE_STRING:
        return draw(st.one_of(st.sampled_from(_STRINGS), st.text(max_size=30)))
    if field.type == FD.TYPE_BYTES:
        return draw(st.binary(max_size=64))
    if field.type == FD.TYPE_ENUM:
        known = [v.number for v in field.enum_type.values]
        return draw(st.one_of(st.sampled_from(known), st.integers(-5, 2**31 - 1)))
    values = _NUMBERS.get(field.type, [0])
    if field.type in (FD.TYPE_DOUBLE, FD.TYPE_FLOAT):
        return draw(st.one_of(st.sampled_from(values), st.floats(allow_nan=True)))
    return draw(st.sampled_from(values))


def _mutate_message(draw: st.DrawFn, msg: Message, depth: int = 0) -> None:
    fields = list(msg.DESCRIPTOR.fields)
    if not fields:
        return
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        field = draw(st.sampled_from(fields))
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            target = getattr(msg, field.name)
            for _ in range(draw(st.integers(0, 50))):
                key = draw(st.text(max_size=20))
                value_field = field.message_type.fields_by_name["value"]
                if value_field.message_type is None:
                    target[key] = _scalar(draw, value_field)
                else:
                    _mutate_message(draw, target[key], depth + 1)
        elif field.message_type is not None:
            if _is_repeated(field):
                count = draw(st.sampled_from([0, 1, 3, 200, 2000]))
                repeated = getattr(msg, field.name)
                for _ in range(count if depth == 0 else min(count, 20)):
                    item = repeated.add()
                    # a few entries get hostile content; thousands stay empty (bounded size)
                    if count <= 3 and depth < 3 and draw(st.booleans()):
                        _mutate_message(draw, item, depth + 1)
            elif depth < 3:
                _mutate_message(draw, getattr(msg, field.name), depth + 1)
        elif _is_repeated(field):
            count = draw(st.sampled_from([0, 1, 5, 500]))
            value = _scalar(draw, field)
            if isinstance(value, str | bytes) and count > 5:
                value = value[:64]
            getattr(msg, field.name).extend([value] * count)
        else:
            setattr(msg, field.name, _scalar(draw, field))


def _invalid_utf8_in_a_string(draw: st.DrawFn, msg: Message) -> bytes | None:
    """Serialized ``msg`` plus one string field whose bytes are not UTF-8 (protobuf's Python
    API refuses to build that, so it is spliced in by hand: tag, length, bytes)."""
    strings = [f for f in msg.DESCRIPTOR.fields if f.type == FD.TYPE_STRING]
    if not strings:
        return None
    field = draw(st.sampled_from(strings))
    junk = draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"ok\xfe\xff"]))
    tag = (field.number << 3) | 2
    return msg.SerializeToString() + _varint(tag) + _varint(len(junk)) + junk


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


@st.composite
def proto_bodies(draw: st.DrawFn, valid: Message) -> bytes:
    """Request bytes mutated from ``valid``: fields set to extremes, invalid UTF-8 in a
    string, or damaged bytes."""
    msg = type(valid)()
    msg.CopyFrom(valid)
    kind = draw(st.sampled_from(["fields", "fields", "fields", "utf8", "bytes", "junk", "deep"]))
    if kind == "junk":
        return draw(st.binary(max_size=200))
    if kind == "deep":  # groups of an unknown field nested far beyond protobuf's limit (100)
        levels = draw(st.sampled_from([99, 101, 1000, 20_000]))
        start, end = _varint((999 << 3) | 3), _varint((999 << 3) | 4)
        return msg.SerializeToString() + start * levels + end * levels
    if kind == "utf8":
        spliced = _invalid_utf8_in_a_string(draw, msg)
        if spliced is not None:
            return spliced
    if kind in ("fields", "utf8"):
        _mutate_message(draw, msg)
        return msg.SerializeToString()
    return draw(_byte_damage(msg.SerializeToString()))


# --- gRPC ---------------------------------------------------------------------------------

# What a hostile request may never get: a crash (INTERNAL) or an unmapped error (UNKNOWN).
FORBIDDEN_CODES = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}


def raw_call(
    ch: grpc.Channel, service: descriptor.ServiceDescriptor, method: str, body: bytes
) -> grpc.StatusCode:
    """Send ``body`` as the request of ``service/method`` and return the status it got (a
    stream: its first reply, then cancel)."""
    rpc = service.methods_by_name[method]
    path = f"/{service.full_name}/{rpc.name}"
    identity = {"request_serializer": bytes, "response_deserializer": bytes}
    try:
        if rpc.server_streaming:
            stream = ch.unary_stream(path, **identity)(body, timeout=1.0)
            try:
                next(iter(stream), None)
            finally:
                stream.cancel()
        else:
            ch.unary_unary(path, **identity)(body, timeout=10.0)
    except grpc.RpcError as exc:
        code: grpc.StatusCode = exc.code()  # type: ignore[attr-defined]
        return code
    return grpc.StatusCode.OK


def fuzz_grpc_service(
    ch: grpc.Channel, service: descriptor.ServiceDescriptor, examples: dict[str, Message]
) -> None:
    """Fuzz every method of ``service`` from its valid example, then require the server to
    be healthy (the caller checks that it still does its job)."""
    assert set(examples) == set(service.methods_by_name), "a method without a fuzz example"

    @fuzz_settings()
    @given(data=st.data())
    def fuzz(data: st.DataObject) -> None:
        method = data.draw(st.sampled_from(sorted(examples)), label="method")
        body = data.draw(proto_bodies(examples[method]), label="body")
        code = raw_call(ch, service, method, body)
        assert code not in FORBIDDEN_CODES, (method, code)

    fuzz()
    health = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert health.status == health_pb2.HealthCheckResponse.SERVING
