"""Smoke client for a running bridge: a mission, an urgent event, ticks, and the full cycle checked.

``python -m services.bridge.smoke [--url http://127.0.0.1:18083]`` starts a short mission, sends
an urgent event, ticks the robot (POST /api/tick; a background ticker only makes it faster) until
the mission completes, then checks the transitions, the urgent outcome and /metrics. Exits
non-zero on the first wrong answer. It refuses to run while another mission is active.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time

import httpx

from parfusion.endpoints import address_of

log = logging.getLogger("parfusion.bridge.smoke")

CYCLE = [
    "start_mission",
    "preempt",
    "checkpoint_saved",
    "start_urgent",
    "urgent_done",
    "resume",
    "restored",
    "compensated",
    "complete",
]


class SmokeFailure(AssertionError):
    pass


def _check(condition: bool, what: str) -> None:
    if not condition:
        raise SmokeFailure(what)
    log.info("ok: %s", what)


def default_url() -> str:
    return address_of("bridge")


def run(url: str, timeout_s: float) -> None:
    token = os.environ.get("PARFUSION_API_TOKEN")
    headers = {"authorization": f"Bearer {token}"} if token else {}
    with httpx.Client(base_url=url, headers=headers, timeout=5.0) as client:
        _check(client.get("/healthz").status_code == 200, f"{url}/healthz answers 200")
        state = client.get("/api/state").json()
        _check(state["accepts_mission"], f"robot is free for a mission (state {state['state']})")
        started = client.post(
            "/api/mission",
            json={
                "name": "smoke-mission",
                "steps": 10,
                "safe_point_interval": 5,
                "deadline_ms": 600_000,
            },
        )
        detail = "" if started.status_code == 201 else f": {started.text[:200]}"
        _check(
            started.status_code == 201,
            f"POST /api/mission -> 201 (got {started.status_code}{detail})",
        )
        mission_id = started.json()["mission_id"]
        queued = client.post(
            "/api/urgent", json={"name": "smoke-urgent", "deadline_ms": 60_000, "work": 2}
        )
        _check(queued.status_code == 202, f"POST /api/urgent -> 202 (got {queued.status_code})")
        urgent_id = queued.json()["urgent_id"]
        refused = client.post("/api/mission", json={"steps": 3})
        _check(
            refused.status_code == 409 and "state" in refused.json(),
            "a second mission gets 409 with the state",
        )
        give_up = time.monotonic() + timeout_s
        state = client.get("/api/state").json()
        while not (
            state["state"] in ("COMPLETED", "IDLE") and state["mission"]["id"] == mission_id
        ):
            if time.monotonic() > give_up:
                raise SmokeFailure(
                    f"mission did not complete within {timeout_s:.0f} s (state {state['state']})"
                )
            state = client.post("/api/tick", json={}).json()
        events = [t["event"] for t in state["transitions"]]
        _check(
            _contains_in_order(events, CYCLE),
            "transitions went RUNNING -> ... -> URGENT -> ... -> COMPLETED",
        )
        _check(state["mission"]["outcome"] == "met", "mission completed within its deadline")
        urgent = next((u for u in state["urgent"]["recent"] if u["id"] == urgent_id), None)
        _check(
            urgent is not None and urgent["outcome"] == "met",
            "urgent task completed within its deadline",
        )
        assert urgent is not None
        log.info(
            "urgent handled via allocator: %s (%s)",
            urgent["allocator"],
            state["allocator"].get("last_error") or "no error",
        )
        log.info("robot interface: %s", state["ros2"]["mode"])
        metrics = client.get("/metrics").text
        _check(
            "parfusion_bridge_preemption_latency_seconds_count" in metrics,
            "/metrics has the preemption latency",
        )


def _contains_in_order(events: list[str], wanted: list[str]) -> bool:
    position = 0
    for event in events:
        if position < len(wanted) and event == wanted[position]:
            position += 1
    return position == len(wanted)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m services.bridge.smoke", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--url", default=None, help="bridge base URL (default from configs/demo.yaml)"
    )
    parser.add_argument(
        "--timeout", type=float, default=30.0, help="seconds to wait for the mission"
    )
    ns = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per tick would bury the checks
    url = (ns.url or default_url()).rstrip("/")
    try:
        run(url, ns.timeout)
    except SmokeFailure as exc:
        log.error("FAILED: %s", exc)
        return 1
    except httpx.HTTPError as exc:
        log.error("FAILED: cannot talk to the bridge at %s: %s", url, exc)
        return 1
    log.info("bridge smoke passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
