"""Smoke client for a running extender: real filter / prioritize / bind / preempt calls, checked.

``python -m services.extender.smoke [--url http://127.0.0.1:18082]`` sends kube-scheduler-shaped
requests built from the packaged sample Node objects (carried in the request, so the extender
needs no flag), checks each answer and exits non-zero on the first wrong one.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from typing import Any

import httpx

from parfusion.endpoints import address_of

from . import samples

log = logging.getLogger("parfusion.extender.smoke")


class SmokeFailure(AssertionError):
    pass


def _check(condition: bool, what: str) -> None:
    if not condition:
        raise SmokeFailure(what)
    log.info("ok: %s", what)


def run(url: str, token: str | None = None, timeout_s: float = 5.0) -> None:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    nodes = samples.sample_node_objects()
    suffix = f"{os.getpid()}-{int(time.time())}"
    pod = samples.pod_object(f"smoke-detector-{suffix}", intent=samples.ONLINE_INTENT)
    plain = samples.pod_object(f"smoke-nginx-{suffix}")
    with httpx.Client(base_url=url, headers=headers, timeout=timeout_s) as client:

        def post(verb: str, body: Any) -> Any:
            response = client.post(f"/{verb}", json=body)
            _check(response.status_code == 200, f"/{verb} answers 200 (got {response.status_code})")
            return response.json()

        _check(client.get("/healthz").status_code == 200, "/healthz is 200")
        reply = post("filter", samples.extender_args(pod, nodes, by_names=False))
        kept = [n["metadata"]["name"] for n in reply["Nodes"]["items"]]
        _check(kept == ["gpu-node-a", "gpu-node-b"], f"/filter keeps the online-lane nodes: {kept}")
        _check(
            set(reply["FailedAndUnresolvableNodes"]) == {"cpu-node-c", "edge-node-d"},
            "/filter fails the nodes without the lane, with reasons",
        )
        reply = post("filter", samples.extender_args(pod, nodes, by_names=True))
        _check(reply["Nodes"] is None and reply["NodeNames"] == kept, "/filter NodeNames mode")
        reply = post("filter", samples.extender_args(plain, nodes, by_names=True))
        _check(len(reply["NodeNames"]) == len(nodes), "a pod without an intent passes through")
        scores = post("prioritize", samples.extender_args(pod, nodes, by_names=True))
        names = [n["metadata"]["name"] for n in nodes]
        _check(
            bool(scores) and all(s["Host"] in names and 1 <= s["Score"] <= 10 for s in scores),
            f"/prioritize scores the preferred nodes 1..10 (0 left out): {scores}",
        )
        meta = pod["metadata"]
        bound = post(
            "bind",
            {
                "PodName": meta["name"],
                "PodNamespace": meta["namespace"],
                "PodUID": meta["uid"],
                "Node": kept[0],
            },
        )
        _check(bound.get("Error", "") == "", f"/bind to {kept[0]}: {bound}")
        bad = client.post("/filter", content=b"{not json")
        _check(
            bad.status_code == 400 and "error" in bad.json(), "malformed JSON is 400 with an error"
        )
        state = client.get("/state").json()
        _check(
            any(b["pod"].endswith(meta["name"]) for b in state["bindings"]),
            "/state shows the binding",
        )
        _check("parfusion_extender_requests_total" in client.get("/metrics").text, "/metrics")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.extender.smoke", description=__doc__)
    parser.add_argument(
        "--url", help="extender base URL (default from configs: http://127.0.0.1:18082)"
    )
    ns = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    url = ns.url
    if not url:
        url = address_of("extender")
    try:
        run(url, os.environ.get("PARFUSION_API_TOKEN") or None)
    except (SmokeFailure, httpx.HTTPError, KeyError, TypeError, ValueError) as exc:
        log.error("extender smoke FAILED against %s: %s", url, exc)
        return 1
    log.info("extender smoke passed against %s", url)
    return 0


if __name__ == "__main__":
    sys.exit(main())
