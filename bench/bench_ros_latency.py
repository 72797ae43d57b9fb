"""Urgent event over DDS to preemption and to the URGENT allocation, on real ROS 2 (Fast DDS).

Starts a real allocator and bridge through ``parfusion up`` (own processes, free ports, the
bridge's background ticker on) on a loopback-only ROS 2 domain of its own, and a robot-side rclpy
node in this process (tests/bridge/ros_peer.py). The robot starts a long mission through
/parfusion/start_mission; then, one at a time, after a random pause (so the event lands at a
random phase of the safe-point cycle), it publishes an urgent event on /parfusion/urgent and
records, against the time.time() just before the publish (one clock: same machine):

* received: the bridge queued the event (its ``arrived_at``): DDS delivery plus validation and
  the durable checkpoint write of the arrival;
* preempted: the bridge's transition to PREEMPTED (mission parked, checkpoint durable), by the
  bridge's clock, and when the robot received that state on /parfusion/robot_state (their
  difference per event: ``state_delivery``);
* allocation: the allocator's plan first carrying an allocation for the event's URGENT intent,
  as received on WatchPlans (the allocator replans every allocator.tick_ms).

The urgent task lasts four allocator ticks, so a plan sees its intent even when ticks run late;
the robot waits for the mission to run again before the next event.

    .venv/bin/python bench/bench_ros_latency.py [--events 200] [--tick-ms 200]
        [--safe-point 5] [--allocator-tick-ms 250] [--out results/bench_ros_latency.json]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from parfusion.v1 import allocator_pb2, allocator_pb2_grpc  # noqa: E402
from services.bridge.ros2 import START_SERVICE  # noqa: E402
from services.common.clients import channel  # noqa: E402
from tests.ros_domain import claim_domain  # noqa: E402
from tests.stack import start_stack  # noqa: E402

STEP_TIMEOUT_S = 30.0


class PlanWatcher:
    """First reception time of each intent name in the allocator's WatchPlans stream."""

    def __init__(self, address: str) -> None:
        self.first_seen: dict[str, float] = {}
        self._channel = channel(address)
        stub = allocator_pb2_grpc.AllocatorServiceStub(self._channel)
        self._stream = stub.WatchPlans(allocator_pb2.WatchPlansRequest(include_current=True))
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for response in self._stream:
                now = time.time()
                for allocation in response.node_plan.allocations:
                    self.first_seen.setdefault(allocation.intent_name, now)
        except Exception:  # cancelled on close
            pass

    def close(self) -> None:
        self._stream.cancel()
        self._channel.close()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q / 100.0 * len(ordered)) - 1)]


def summary(values_s: list[float]) -> dict[str, float]:
    ms = [v * 1000.0 for v in values_s]
    return {
        "n": len(ms),
        "p50_ms": round(percentile(ms, 50), 2),
        "p99_ms": round(percentile(ms, 99), 2),
        "mean_ms": round(statistics.fmean(ms), 2),
        "max_ms": round(max(ms), 2),
    }


def wait_for(peer: Any, start: int, match: Any) -> tuple[float, dict[str, Any]]:
    """The first state received at index >= start that ``match`` accepts (receive time, doc)."""
    found: list[tuple[float, dict[str, Any]]] = []

    def ready(received: Any) -> bool:
        found[:] = [item for item in received.states[start:] if match(item[1])]
        return bool(found)

    if not peer.wait_until(ready, STEP_TIMEOUT_S):
        raise TimeoutError("the bridge did not get there")
    return found[0]


def run(args: argparse.Namespace) -> dict[str, Any]:
    from tests.bridge.ros_peer import RobotPeer

    domain, lock = claim_domain()
    os.environ.update({"ROS_DOMAIN_ID": str(domain), "ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST"})
    home = Path(tempfile.mkdtemp(prefix="bench-ros-"))
    (home / "configs").symlink_to(ROOT / "configs")
    stack = start_stack(
        home,
        ["allocator", "bridge"],
        {
            "PARFUSION_BRIDGE_BACKGROUND_TICKER": "true",
            "PARFUSION_BRIDGE_TICK_MS": str(args.tick_ms),
            "PARFUSION_ALLOCATOR_TICK_MS": str(args.allocator_tick_ms),
            "PARFUSION_ALLOCATOR_SEED_INTENTS": "false",
            "PARFUSION_LOG_LEVEL": "WARNING",
        },
    )
    peer = RobotPeer("bench_robot", domain_id=domain)
    watcher = PlanWatcher(stack.address("allocator"))
    # the urgent task outlives a few allocator ticks (late ones too, on a busy machine), so a
    # plan shows its allocation
    work = math.ceil(4 * args.allocator_tick_ms / args.tick_ms) + 2
    rng = random.Random(args.seed)
    samples: dict[str, list[float]] = {
        "received": [],
        "preempted": [],
        "preempted_seen": [],
        "state_delivery": [],
        "allocation": [],
    }
    try:
        peer.wait_for_bridge()
        peer.set_parameters(steps=1_000_000, safe_point_interval=args.safe_point)
        ok, started = peer.call(START_SERVICE)
        if not ok:
            raise RuntimeError(f"mission refused: {started}")
        for i in range(args.events):
            time.sleep(rng.uniform(0.0, args.safe_point * args.tick_ms / 1000.0))
            name = f"bench-urgent-{i}"
            start = len(peer.received.states)
            sent = peer.publish_urgent({"name": name, "deadline_ms": 60_000, "work": work})
            seen, running = wait_for(
                peer,
                start,
                lambda d, n=name: d["state"] == "URGENT_TASK_RUNNING" and d["urgent_active"] == n,
            )
            preempted_seen, preempted = wait_for(
                peer,
                start,
                lambda d: d["state"] == "PREEMPTED" and d["event"] == "checkpoint_saved",
            )
            arrived = running["urgent"]["active"]["arrived_at"]
            samples["received"].append(arrived - sent)
            samples["preempted"].append(preempted["at"] - sent)
            samples["preempted_seen"].append(preempted_seen - sent)
            samples["state_delivery"].append(preempted_seen - preempted["at"])
            wait_for(peer, start, lambda d: d["event"] == "compensated")
            allocated = watcher.first_seen.get(name)
            if allocated is None:
                raise RuntimeError(
                    f"no allocation for {name} in the allocator's plans during its {work} ticks"
                )
            samples["allocation"].append(allocated - sent)
            if (i + 1) % 20 == 0:
                print(f"{i + 1}/{args.events} events", file=sys.stderr)
    finally:
        watcher.close()
        peer.close()
        stack.close()
        lock.close()
    return {
        "config": {
            "events": args.events,
            "bridge_tick_ms": args.tick_ms,
            "safe_point_interval": args.safe_point,
            "allocator_tick_ms": args.allocator_tick_ms,
            "urgent_work_ticks": work,
            "rmw": "rmw_fastrtps_cpp",
            "discovery": "LOCALHOST",
            "cpus": os.cpu_count(),
        },
        "from_publish": {
            key: summary(values) for key, values in samples.items() if key != "state_delivery"
        },
        "state_delivery": summary(samples["state_delivery"]),
        "samples_s": samples,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=200)
    parser.add_argument("--tick-ms", type=int, default=200)
    parser.add_argument("--safe-point", type=int, default=5)
    parser.add_argument("--allocator-tick-ms", type=int, default=250)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "bench_ros_latency.json")
    args = parser.parse_args(argv)
    result = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
