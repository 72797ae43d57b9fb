"""Wire shapes of the kube-scheduler extender protocol v1, as kube-scheduler marshals them."""

from __future__ import annotations

import orjson
import pytest

from services.extender import protocol, samples
from services.extender.protocol import ProtocolError


def _args(by_names: bool) -> bytes:
    pod = samples.pod_object("detector-0", intent=samples.ONLINE_INTENT)
    return orjson.dumps(samples.extender_args(pod, samples.sample_node_objects(), by_names))


def test_nodelist_mode_keeps_node_bytes_unchanged() -> None:
    args = protocol.decode_extender_args(_args(by_names=False))
    assert not args.by_names
    assert args.candidate_names() == [n[0] for n in samples.SAMPLE_NODES]
    reply = orjson.loads(protocol.encode_filter_result(args, [0, 2], {"gpu-node-b": "x"}, {}))
    assert set(reply) == {
        "Nodes",
        "NodeNames",
        "FailedNodes",
        "FailedAndUnresolvableNodes",
        "Error",
    }
    assert reply["NodeNames"] is None
    # the kept node objects are the request's own, field for field
    assert reply["Nodes"]["items"] == [samples.sample_node_objects()[i] for i in (0, 2)]
    assert reply["Nodes"]["metadata"] == {}


def test_nodenames_mode_replies_with_names_only() -> None:
    args = protocol.decode_extender_args(_args(by_names=True))
    assert args.by_names and args.heads == []
    reply = orjson.loads(
        protocol.encode_filter_result(args, ["gpu-node-a"], {}, {"cpu-node-c": "no lane"})
    )
    assert reply["Nodes"] is None
    assert reply["NodeNames"] == ["gpu-node-a"]
    assert reply["FailedAndUnresolvableNodes"] == {"cpu-node-c": "no lane"}


def test_field_names_match_case_insensitively_like_go() -> None:
    body = orjson.dumps({"pod": {"metadata": {"name": "p"}}, "nodenames": ["a"]})
    args = protocol.decode_extender_args(body)
    assert args.node_names == ["a"] and args.pod.metadata.name == "p"
    binding = protocol.decode_binding_args(b'{"podname":"p","PODNAMESPACE":"ns","Node":"n1"}')
    assert (binding.pod_name, binding.pod_namespace, binding.node) == ("p", "ns", "n1")


def test_empty_nodelist_from_go_has_null_items() -> None:
    args = protocol.decode_extender_args(
        b'{"Pod":{"metadata":{"name":"p"}},"Nodes":{"metadata":{},"items":null},"NodeNames":null}'
    )
    assert args.candidate_names() == []
    assert orjson.loads(protocol.encode_filter_result(args, [], {}, {}))["Nodes"]["items"] == []


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b"", None),
        (b"{not json", None),
        (b"[1,2]", None),
        (b'{"Nodes":{"items":[]}}', "Pod"),
        (b'{"Pod":{"metadata":{"name":"p"}}}', "Nodes"),
        (b'{"Pod":{"metadata":{}},"NodeNames":[]}', "Pod.metadata.name"),
        (b'{"Pod":{"metadata":{"name":"p"}},"NodeNames":"a"}', "NodeNames"),
        (
            b'{"Pod":{"metadata":{"name":"p"}},"Nodes":{"items":[{"metadata":{}}]}}',
            "Nodes.items[0].metadata.name",
        ),
        (b'{"Pod":{"metadata":{"name":"p"}},"Nodes":{"items":[7]}}', "Nodes.items[0]"),
    ],
)
def test_bad_extender_args_name_the_field(body: bytes, field: str | None) -> None:
    with pytest.raises(ProtocolError) as err:
        protocol.decode_extender_args(body)
    assert err.value.field == field


def test_binding_args_need_pod_and_node() -> None:
    with pytest.raises(ProtocolError) as err:
        protocol.decode_binding_args(b'{"PodName":"p"}')
    assert err.value.field == "Node"
    with pytest.raises(ProtocolError):
        protocol.decode_binding_args(b'{"PodName":1,"Node":"n"}')


def test_host_priority_and_binding_result_shapes() -> None:
    assert orjson.loads(protocol.encode_host_priorities(["a", "b"], [10, 0])) == [
        {"Host": "a", "Score": 10},
        {"Host": "b", "Score": 0},
    ]
    odd = ['x",', "y\\", 'z","w', "plain"]
    assert orjson.loads(protocol.encode_host_priorities(odd, [1, 2, 3, 4])) == [
        {"Host": h, "Score": s} for h, s in zip(odd, [1, 2, 3, 4], strict=True)
    ]
    assert protocol.encode_host_priorities([], []) == b"[]"
    assert orjson.loads(protocol.encode_binding_result("boom")) == {"Error": "boom"}
    assert protocol.MAX_EXTENDER_PRIORITY == 10


def test_preemption_accepts_both_victim_maps_and_answers_meta_victims() -> None:
    meta = orjson.dumps(
        {
            "Pod": {"metadata": {"name": "p"}},
            "NodeNameToMetaVictims": {"n1": {"Pods": [{"UID": "u1"}], "NumPDBViolations": 1}},
        }
    )
    full = orjson.dumps(
        {
            "Pod": {"metadata": {"name": "p"}},
            "NodeNameToVictims": {
                "n2": {"Pods": [{"metadata": {"uid": "u2", "name": "v"}}], "NumPDBViolations": 0}
            },
        }
    )
    assert protocol.decode_preemption_args(meta).victims == {"n1": (["u1"], 1)}
    args = protocol.decode_preemption_args(full)
    assert args.victims == {"n2": (["u2"], 0)}
    assert orjson.loads(protocol.encode_preemption_result(args.victims)) == {
        "NodeNameToMetaVictims": {"n2": {"Pods": [{"UID": "u2"}], "NumPDBViolations": 0}}
    }
