"""Reading a pod's intent from the annotation or the labels, validated by the allocator's rules."""

from __future__ import annotations

import json

import msgspec

from services.extender import samples
from services.extender.podintent import intent_name, pod_intent
from services.extender.protocol import Pod


def _pod(**kw: object) -> Pod:
    return msgspec.convert(samples.pod_object("detector-7", **kw), Pod)  # type: ignore[arg-type]


def test_annotation_intent_is_validated_and_defaulted() -> None:
    found = pod_intent(_pod(intent=samples.ONLINE_INTENT))
    assert found.source == "annotation" and not found.error
    spec = found.spec
    assert spec is not None
    assert spec.workload_class == "ONLINE" and spec.deadline_ms == 40 and spec.gpu_lane == "online"
    assert spec.min_units == 2 and spec.target_percentile == 99.0  # default from validation


def test_labels_form() -> None:
    labels = {
        "parfusion.io/class": "robot",
        "parfusion.io/deadline-ms": "25",
        "parfusion.io/gpu-lane": "robot",
        "parfusion.io/gpu-share": "0.25",
        "parfusion.io/preemptible": "false",
        "parfusion.io/owner": "team-a",  # not an intent field: ignored
    }
    found = pod_intent(_pod(labels=labels))
    assert found.source == "labels" and found.spec is not None
    assert (found.spec.workload_class, found.spec.deadline_ms, found.spec.gpu_share) == (
        "ROBOT",
        25,
        0.25,
    )


def test_no_intent_passes_through() -> None:
    found = pod_intent(_pod())
    assert found.spec is None and not found.present


def test_invalid_intents_carry_the_validation_message() -> None:
    online_without_deadline = {"workload_class": "ONLINE", "slo": {}}
    found = pod_intent(_pod(intent=online_without_deadline))
    assert found.spec is None and "slo.deadline_ms" in found.error
    bad_json = samples.pod_object("p")
    bad_json["metadata"]["annotations"]["parfusion.io/intent"] = "{oops"
    assert "not valid JSON" in pod_intent(msgspec.convert(bad_json, Pod)).error
    assert (
        "cannot parse"
        in pod_intent(
            _pod(labels={"parfusion.io/class": "batch", "parfusion.io/priority": "high"})
        ).error
    )
    assert "class is required" in pod_intent(_pod(labels={"parfusion.io/deadline-ms": "5"})).error
    share = json.loads(json.dumps(samples.ONLINE_INTENT))
    share["gpu"]["share"] = 1.5
    assert "gpu.share" in pod_intent(_pod(intent=share)).error


def test_intent_name_from_long_dotted_pod_names() -> None:
    assert intent_name("web.frontend-7d9f") == "web-frontend-7d9f"
    assert len(intent_name("a" * 100)) == 63


def test_replicas_share_one_validation_but_keep_their_own_id_and_name() -> None:
    a = pod_intent(
        msgspec.convert(samples.pod_object("web-1", uid="uid-1", intent=samples.ONLINE_INTENT), Pod)
    )
    b = pod_intent(
        msgspec.convert(samples.pod_object("web-2", uid="uid-2", intent=samples.ONLINE_INTENT), Pod)
    )
    assert a.spec is not None and b.spec is not None
    assert (a.spec.id, b.spec.id) == ("uid-1", "uid-2")
    # the annotation names the intent ("detector"); without a name the pod's name is used
    assert a.spec.name == b.spec.name == "detector"
    unnamed = {k: v for k, v in samples.ONLINE_INTENT.items() if k != "name"}
    c = pod_intent(msgspec.convert(samples.pod_object("web-3", uid="uid-3", intent=unnamed), Pod))
    assert c.spec is not None and c.spec.name == "web-3" and c.spec.id == "uid-3"
