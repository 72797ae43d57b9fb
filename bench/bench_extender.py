"""Extender latency: /filter and /filter + /prioritize at 100, 1,000 and 5,000 nodes, both modes.

Starts the extender as a real uvicorn server in a child process (its own interpreter, telemetry
off, standalone binding) and drives it from a standard-library http.client on the same host over
one keep-alive connection, one request at a time, as kube-scheduler does. Request bodies are
encoded off the clock (that cost is kube-scheduler's); every request carries a new pod (fresh
UID and name) with the ONLINE intent, GPU lane ``online``, that half of the sample shapes host.
Cases:

* NodeNames mode (nodeCacheCapable): the node view is first filled with N realistic Node
  objects through one NodeList call; then /filter with 500 names (what kube-scheduler sends at
  5,000 nodes: 10 % of them) and /filter + /prioritize with all N names;
* NodeList mode: /filter and /filter + /prioritize with the full list of N Node objects.

    .venv/bin/python bench/bench_extender.py [--sizes 100,1000,5000] [--requests 200] [--out FILE]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from services.extender import samples  # noqa: E402

TARGETS_MS = {
    ("names", 500, "filter"): 2.0,
    ("names", 5000, "filter+prioritize"): 10.0,
    ("list", 1000, "filter"): 60.0,
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_server(home: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    (home / "configs").symlink_to(ROOT / "configs")
    env = {
        **os.environ,
        "PARFUSION_HOME": str(home),
        "PARFUSION_EXTENDER_TELEMETRY": "false",
        "PARFUSION_EXTENDER_MAX_BODY_BYTES": str(256 << 20),
        "PARFUSION_LOG_LEVEL": "WARNING",
    }
    env.pop("PARFUSION_API_TOKEN", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.extender", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=0.5).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("extender did not become healthy")


def _pod(i: int) -> dict:
    return samples.pod_object(
        f"bench-{i:06d}", uid=f"bench-uid-{i:06d}", intent=samples.ONLINE_INTENT
    )


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, int(round(q / 100 * len(ordered) + 0.5)) - 1))
    return ordered[k]


def _post(conn: http.client.HTTPConnection, path: str, body: bytes) -> bytes:
    conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    response = conn.getresponse()
    data = response.read()
    if response.status != 200:
        raise SystemExit(f"{path} answered {response.status}: {data[:200]!r}")
    return data


def _server_seconds(conn: http.client.HTTPConnection) -> dict[str, tuple[float, float]]:
    """verb -> (sum, count) of the extender's own request-duration histogram."""
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    out: dict[str, list[float]] = {}
    for line in text.splitlines():
        for part, slot in (("_sum{", 0), ("_count{", 1)):
            prefix = f"parfusion_extender_request_duration_seconds{part}"
            if line.startswith(prefix):
                verb = line.split('verb="', 1)[1].split('"', 1)[0]
                out.setdefault(verb, [0.0, 0.0])[slot] = float(line.rsplit(" ", 1)[1])
    return {k: (v[0], v[1]) for k, v in out.items()}


def _run_case(
    conn: http.client.HTTPConnection,
    body: Callable[[int], bytes],
    total: int,
    with_prioritize: bool,
    warmup: int,
) -> dict[str, float]:
    """One new pod per request: /filter, then /prioritize with the same body; times in ms."""
    times: list[float] = []
    for n in range(total):
        payload = body(n)
        start = time.perf_counter()
        _post(conn, "/filter", payload)
        if with_prioritize:
            _post(conn, "/prioritize", payload)
        elapsed = (time.perf_counter() - start) * 1000
        if n >= warmup:
            times.append(elapsed)
    return {
        "requests": len(times),
        "p50_ms": round(statistics.median(times), 3),
        "p90_ms": round(_percentile(times, 90), 3),
        "p99_ms": round(_percentile(times, 99), 3),
        "max_ms": round(max(times), 3),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="100,1000,5000")
    parser.add_argument("--requests", type=int, default=200, help="measured pods per case")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument(
        "--list-max", type=int, default=1000, help="largest NodeList size (full objects)"
    )
    parser.add_argument("--out", help="JSON results file (default results/bench/extender.json)")
    ns = parser.parse_args(argv)
    sizes = [int(s) for s in ns.sizes.split(",") if s]
    total = ns.requests + ns.warmup
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="parfusion-bench-") as tmp:
        proc, url = _start_server(Path(tmp))
        try:
            host, port = url.removeprefix("http://").split(":")
            # http.client: the lightest keep-alive HTTP/1.1 client in the standard library, so
            # the figures are mostly the server's (kube-scheduler's Go client is lighter still)
            conn = http.client.HTTPConnection(host, int(port), timeout=60)
            try:
                for size in sizes:
                    nodes = samples.cluster_node_objects(size)
                    prime = orjson.dumps(samples.extender_args(_pod(0), nodes, by_names=False))
                    _post(conn, "/filter", prime)
                    names = [n["metadata"]["name"] for n in nodes]
                    cases = []
                    if size >= 500:
                        cases.append(("names", 500, "filter", names[:500], False))
                    cases.append(("names", size, "filter+prioritize", names, True))
                    if size <= ns.list_max:
                        cases.append(("list", size, "filter", nodes, False))
                        cases.append(("list", size, "filter+prioritize", nodes, True))
                    for mode, count, verbs, payload, with_prioritize in cases:
                        key = "NodeNames" if mode == "names" else "Nodes"
                        shared = orjson.dumps(
                            payload if mode == "names" else {"metadata": {}, "items": payload}
                        )
                        other = "Nodes" if mode == "names" else "NodeNames"
                        base = len(results) * 10_000

                        def body(
                            i: int,
                            key: str = key,
                            shared: bytes = shared,
                            other: str = other,
                            base: int = base,
                        ) -> bytes:
                            # kube-scheduler's encoding cost is not the extender's: built off the clock
                            pod = orjson.dumps(_pod(base + i + 1))
                            return b'{"Pod":%b,"%b":%b,"%b":null}' % (
                                pod,
                                key.encode(),
                                shared,
                                other.encode(),
                            )

                        before = _server_seconds(conn)
                        conn.close()  # idle while bodies were built: reopen (uvicorn keep-alive is 5 s)
                        stats = _run_case(conn, body, total, with_prioritize, ns.warmup)
                        after = _server_seconds(conn)
                        # the extender's own time per pod (decode, decide, encode), warm-up included
                        server_ms = sum(
                            (after[v][0] - before.get(v, (0.0, 0.0))[0]) * 1000 / total
                            for v in ("filter", "prioritize")
                        )
                        stats["server_mean_ms"] = round(server_ms, 3)
                        target = TARGETS_MS.get((mode, count, verbs))
                        row = {
                            "mode": "NodeNames" if mode == "names" else "NodeList",
                            "view_nodes": size,
                            "candidates": count,
                            "verbs": verbs,
                            "body_bytes": len(body(0)),
                            **stats,
                            "target_p99_ms": target,
                            "meets_target": None if target is None else stats["p99_ms"] <= target,
                        }
                        results.append(row)
                        sys.stderr.write(json.dumps(row) + "\n")
            finally:
                conn.close()
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    out = Path(ns.out) if ns.out else ROOT / "results" / "bench" / "extender.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"load_average": os.getloadavg(), "cpus": os.cpu_count(), "requests": ns.requests}
    out.write_text(json.dumps({"meta": meta, "results": results}, indent=2) + "\n")
    print(
        "| mode | view nodes | candidates | verbs | body | p50 ms | p90 ms | p99 ms"
        " | extender's own mean ms | target p99 |"
    )
    print("|---|---:|---:|---|---:|---:|---:|---:|---:|---|")
    for r in results:
        verdict = (
            ""
            if r["target_p99_ms"] is None
            else f"<= {r['target_p99_ms']:g} ms ({'met' if r['meets_target'] else 'MISSED'})"
        )
        print(
            f"| {r['mode']} | {r['view_nodes']} | {r['candidates']} | {r['verbs']} | {r['body_bytes'] / 1024:.0f} KiB"
            f" | {r['p50_ms']} | {r['p90_ms']} | {r['p99_ms']} | {r['server_mean_ms']} | {verdict} |"
        )
    print(f"\nload average {meta['load_average']}, {meta['cpus']} CPUs; wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
