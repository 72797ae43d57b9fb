"""`parfusion submit | intents | plan | policy`: the allocator's command-line client.

Each command talks gRPC to the allocator (``--address``; by default where this configuration
puts it, PARFUSION_ALLOCATOR_PORT and PARFUSION_HOST included, as `parfusion up` does) with a
deadline (``--timeout``); the API token rides along from PARFUSION_API_TOKEN. A failed call
prints its status code and details to stderr and exits non-zero: 1 for a refused call, 2 for a
bad intent file, 3 when the allocator cannot be reached.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import json_format

from parfusion.endpoints import address_of
from parfusion.v1 import allocator_pb2, allocator_pb2_grpc, intent_pb2
from services.allocator.watch import PlanMirror
from services.common.clients import channel
from services.common.errors import DomainError
from services.common.latency import format_ms
from services.core.convert import intents_in_file

CLASSES = ("ONLINE", "BATCH", "ROBOT", "URGENT")


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--address",
        help="allocator gRPC address (default: where this configuration puts it, "
        "PARFUSION_ALLOCATOR_PORT and PARFUSION_HOST included; 127.0.0.1:50051 out of the box)",
    )
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds per call (default 5)")
    parser.add_argument("--json", action="store_true", help="print the reply as proto JSON")


def _short(enum: Any, value: int, prefix: str) -> str:
    try:
        return str(enum.Name(value)).removeprefix(prefix)
    except ValueError:
        return str(value)


def _json(message: Any, indent: int | None = 2) -> str:
    return json_format.MessageToJson(
        message, preserving_proto_field_name=True, indent=indent, sort_keys=True
    )


def _call(
    ns: argparse.Namespace, fn: Callable[[allocator_pb2_grpc.AllocatorServiceStub], int]
) -> int:
    try:
        with channel(ns.address or address_of("allocator")) as ch:
            return fn(allocator_pb2_grpc.AllocatorServiceStub(ch))
    except grpc.RpcError as exc:
        code = exc.code()  # type: ignore[attr-defined]
        sys.stderr.write(f"error: {code.name}: {exc.details()}\n")  # type: ignore[attr-defined]
        return 3 if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) else 1


# --- submit ----------------------------------------------------------------------------------


def _configure_submit(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "file", type=Path, help="intent file: YAML or JSON, one intent, a list, or intents: [...]"
    )
    _common(parser)


def _run_submit(ns: argparse.Namespace) -> int:
    try:
        intents = intents_in_file(ns.file)
    except OSError as exc:
        sys.stderr.write(f"error: cannot read {ns.file}: {exc.strerror}\n")
        return 2
    except DomainError as exc:
        sys.stderr.write(f"error: INVALID_ARGUMENT: {exc}\n")
        return 2

    def submit(stub: allocator_pb2_grpc.AllocatorServiceStub) -> int:
        for intent in intents:
            reply = stub.SubmitIntent(
                allocator_pb2.SubmitIntentRequest(intent=intent), timeout=ns.timeout
            )
            if ns.json:
                sys.stdout.write(_json(reply) + "\n")
            else:
                verb = "unchanged (already stored)" if reply.already_existed else "stored"
                sys.stdout.write(f"{reply.intent.id}\t{reply.intent.name}\t{verb}\n")
        return 0

    return _call(ns, submit)


# --- intents ---------------------------------------------------------------------------------


def _configure_intents(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--class",
        dest="workload_class",
        choices=CLASSES,
        type=str.upper,
        help="only this workload class",
    )
    _common(parser)


def _run_intents(ns: argparse.Namespace) -> int:
    cls = intent_pb2.WORKLOAD_CLASS_UNSPECIFIED
    if ns.workload_class:
        cls = getattr(intent_pb2, f"WORKLOAD_CLASS_{ns.workload_class}")

    def show(stub: allocator_pb2_grpc.AllocatorServiceStub) -> int:
        reply = stub.ListIntents(
            allocator_pb2.ListIntentsRequest(workload_class=cls), timeout=ns.timeout
        )
        if ns.json:
            sys.stdout.write(_json(reply) + "\n")
            return 0
        rows: list[tuple[str, ...]] = [
            ("ID", "NAME", "CLASS", "PRIORITY", "DEADLINE_MS", "UNITS", "GPU")
        ]
        for i in reply.intents:
            units = f"{i.parallelism.min}-{i.parallelism.max or '*'}"
            gpu = f"{i.gpu.lane or 'any'}:{i.gpu.share:g}" if i.gpu.share else "-"
            deadline = f"{i.slo.deadline_ms:g}" if i.slo.deadline_ms else "-"
            rows.append(
                (
                    i.id,
                    i.name,
                    _short(intent_pb2.WorkloadClass, i.workload_class, "WORKLOAD_CLASS_"),
                    str(i.priority),
                    deadline,
                    units,
                    gpu,
                )
            )
        _table(rows)
        return 0

    return _call(ns, show)


# --- plan ------------------------------------------------------------------------------------


MAX_WATCH_COUNT = 10**9


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 0 <= value <= MAX_WATCH_COUNT:
        raise argparse.ArgumentTypeError(f"must be in [0, {MAX_WATCH_COUNT}], got {value}")
    return value


def _configure_plan(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--watch",
        action="store_true",
        help="show the plan, then follow it (WatchPlans with deltas): a line per intent whose "
        "workers, CPUs, level or state changed, or that left; Ctrl-C ends",
    )
    parser.add_argument(
        "--count", type=_count, default=0, help="with --watch: stop after N plans (0: never)"
    )
    _common(parser)


def _run_plan(ns: argparse.Namespace) -> int:
    def show(stub: allocator_pb2_grpc.AllocatorServiceStub) -> int:
        if ns.watch:
            return _watch(stub, ns)
        reply = stub.GetPlan(allocator_pb2.GetPlanRequest(), timeout=ns.timeout)
        if ns.json:
            sys.stdout.write(_json(reply) + "\n")
            return 0
        stale = "STALE (node agent not reporting)" if reply.node_stale else "fresh"
        _plan_table(reply.node_plan, reply.policy, stale)
        return 0

    return _call(ns, show)


def _watch(stub: allocator_pb2_grpc.AllocatorServiceStub, ns: argparse.Namespace) -> int:
    """Follow the plans: the first whole, then what each one changed (a delta per plan)."""
    stream = stub.WatchPlans(allocator_pb2.WatchPlansRequest(include_current=True, deltas=True))
    mirror = PlanMirror()
    seen = 0
    try:
        for reply in stream:
            before = dict(mirror.allocations)
            mirror.apply(reply)
            seen += 1
            if ns.json:
                sys.stdout.write(_json(reply, indent=None) + "\n")  # a line per message
            elif seen == 1:
                stale = "STALE (node agent not reporting)" if mirror.header.node_stale else "fresh"
                _plan_table(mirror.node_plan(), mirror.header.policy, stale)
            else:
                for line in _changes(mirror, before, reply):
                    sys.stdout.write(line + "\n")
            sys.stdout.flush()
            if ns.count and seen >= ns.count:
                break
    except KeyboardInterrupt:
        pass
    finally:
        stream.cancel()
    return 0


def _decision(a: intent_pb2.Allocation) -> tuple[str, ...]:
    return (
        str(a.workers),
        a.cgroup.cpuset_cpus or "-",
        _short(intent_pb2.DegradationLevel, a.degradation, "DEGRADATION_LEVEL_"),
        _short(intent_pb2.AllocationState, a.state, "ALLOCATION_STATE_"),
    )


def _changes(mirror: PlanMirror, before: dict[str, intent_pb2.Allocation], reply: Any) -> list[str]:
    """One line per intent whose decision (workers, CPUs, level, state) the plan changed."""
    head = f"{time.strftime('%H:%M:%S')}  generation {mirror.generation}"
    lines = []
    for a in reply.node_plan.allocations:
        now, old = _decision(a), before.get(a.intent_id)
        name = a.intent_name or a.intent_id
        if old is None:
            lines.append(
                f"{head}  {name}: joined, workers {now[0]} cpus {now[1]} {now[2]} {now[3]}"
            )
            continue
        was = _decision(old)
        moved = [
            f"{field} {w} -> {n}"
            for field, w, n in zip(("workers", "cpus", "level", "state"), was, now, strict=True)
            if w != n
        ]
        if moved:
            lines.append(f"{head}  {name}: {', '.join(moved)} ({a.reason})")
    for intent_id in reply.removed_intent_ids:
        old = before.get(intent_id)
        lines.append(f"{head}  {(old.intent_name if old else '') or intent_id}: left the plan")
    return lines


def _plan_table(plan: intent_pb2.NodePlan, policy: str, stale: str) -> None:
    """The plan's header line and a row per allocation, as `parfusion plan` prints them."""
    sys.stdout.write(
        f"policy {policy}  generation {plan.generation}  node {plan.node or '-'}  units {plan.cpu_units}"
        f"  contention {plan.contention:.2f}  telemetry {stale}  decision {plan.decision_ms:.3f} ms\n"
    )
    rows: list[tuple[str, ...]] = [
        (
            "INTENT",
            "CLASS",
            "WORKERS",
            "CPUS",
            "LEVEL",
            "P99_MS",
            "SLACK_MS",
            "RISK",
            "GPU",
            "STATE",
            "REASON",
        )
    ]
    for a in plan.allocations:
        gpu = f"{a.gpu_lane}:{a.gpu_share_percent:g}%" if a.gpu_lane or a.gpu_share_percent else "-"
        rows.append(
            (
                a.intent_name or a.intent_id,
                _short(intent_pb2.WorkloadClass, a.workload_class, "WORKLOAD_CLASS_"),
                str(a.workers),
                a.cgroup.cpuset_cpus or "-",
                _short(intent_pb2.DegradationLevel, a.degradation, "DEGRADATION_LEVEL_"),
                format_ms(a.predicted_p99_ms, unit=""),
                format_ms(a.slack_ms, unit=""),
                f"{a.deadline_risk:.2f}",
                gpu,
                _short(intent_pb2.AllocationState, a.state, "ALLOCATION_STATE_"),
                a.reason,
            )
        )
    _table(rows)


# --- policy ----------------------------------------------------------------------------------


def _configure_policy(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", nargs="?", help="policy to switch to; omit to list them")
    _common(parser)


def _run_policy(ns: argparse.Namespace) -> int:
    def run(stub: allocator_pb2_grpc.AllocatorServiceStub) -> int:
        if ns.name:
            reply = stub.SetPolicy(allocator_pb2.SetPolicyRequest(name=ns.name), timeout=ns.timeout)
            if ns.json:
                sys.stdout.write(_json(reply) + "\n")
            else:
                sys.stdout.write(f"active policy: {reply.active} (was {reply.previous})\n")
            return 0
        listing = stub.ListPolicies(allocator_pb2.ListPoliciesRequest(), timeout=ns.timeout)
        if ns.json:
            sys.stdout.write(_json(listing) + "\n")
            return 0
        rows: list[tuple[str, ...]] = [("", "POLICY", "KIND", "DESCRIPTION")]
        rows += [
            ("*" if p.name == listing.active else "", p.name, p.kind, p.description)
            for p in listing.policies
        ]
        _table(rows)
        return 0

    return _call(ns, run)


def _table(rows: Sequence[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        sys.stdout.write(
            "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() + "\n"
        )


def register(commands: Any) -> None:
    commands.command(
        ("submit",),
        "submit ResourceIntents from a YAML or JSON file",
        _configure_submit,
        _run_submit,
    )
    commands.command(("intents",), "list the stored intents", _configure_intents, _run_intents)
    commands.command(("plan",), "show the current node plan", _configure_plan, _run_plan)
    commands.command(
        ("policy",),
        "list the policies (active one marked *) or switch to NAME",
        _configure_policy,
        _run_policy,
    )
