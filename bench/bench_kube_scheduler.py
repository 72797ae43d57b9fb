"""What the extender costs a real kube-scheduler: pods/s with and without it, A/B alternated.

One real control plane (../shared/k8s/control-plane: etcd, kube-apiserver, kube-scheduler
v1.36.2) with N fake Ready nodes; the extender runs as its own process (``kube_api:
kubeconfig``: it watches nodes, NodeIntentStates and bound pods), and deploy/'s admission policy
(30-intent-marker.yaml) is applied, so the pods are created as a user writes them, without the
``parfusion.io/intent`` marker, and the API server adds it to those with an intent. Per phase
kube-scheduler (profile ``parfusion-scheduler``) is started afresh with one
KubeSchedulerConfiguration: C = the shipped one (deploy/scheduler/: the extender with filter,
prioritize, bind and preempt, nodeCacheCapable, called only for pods requesting the marker), B =
C with ``managedResources: []`` (the extender for every pod, the configuration shipped before the
policy), A = no extender. In A and B NodeResourcesFit ignores the marker, as the managed resource
makes it ignored in C, so the three schedule the same pods. D (not run by default) = C with
kube-scheduler binding instead of the extender; ``--binder scheduler`` drops the extender's bind
verb from B and C as well.
Phases alternate A B C A B C ... per mode:

* ``backlog``: P pods (half with an intent) are created while no scheduler runs; the clock runs
  from the scheduler's readiness to the last pod bound: how fast a backlog drains;
* ``stream``: the scheduler runs and pods are created as fast as the creator threads can; the
  clock runs from the first pod created to the last pod bound;
* ``qps`` selects kube-scheduler's client rate limit: ``raised`` (5,000/s) or ``default`` (50/s,
  where the client limit, not the scheduler, sets the pace).

Reported per phase: pods/s, nodes used, kube-scheduler's scheduling-algorithm median and p99 (its
own histogram: filter and score, the extender's calls included), the extender's per-verb median and p99 (its histogram), and CPU ms per pod of
every process (kube-scheduler, kube-apiserver, etcd, extender) from /proc. The machine is
shared: compare the ratio within one run, not the absolute rates across runs.

    .venv/bin/python bench/bench_kube_scheduler.py [--nodes 1000] [--pods 1000] [--rounds 2]
        [--modes backlog,stream] [--qps raised] [--arms A,B,C] [--binder extender]
        [--out results/bench/kube_scheduler.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kube_measure import (  # noqa: E402
    counter,
    cpu_seconds,
    histogram,
    ms,
    quantile,
    ratios,
    table,
)

from parfusion.deploy_scheduler import SCHEDULER_NAME, scheduler_configuration  # noqa: E402
from services.common.kube import Informer, PodHead, ResourcePath, connect  # noqa: E402
from services.core.podintent import MARKER  # noqa: E402

K8S = Path(os.environ.get("PARFUSION_TEST_K8S_DIR") or ROOT.parent / "shared" / "k8s")
INTENT = {
    "workloadClass": "ONLINE",
    "priority": 600,
    "slo": {"deadlineMs": 80},
    "parallelism": {"min": 1, "max": 2},
    "speedup": {"parallelFraction": 0.9, "baseServiceMs": 20},
}
QPS = {"raised": 5000, "default": 50}
# A = no extender; B = the extender for every pod (managedResources: []); C = deploy/'s
# configuration: the extender only for pods requesting MARKER, which the admission policy adds;
# D = C with kube-scheduler binding (no bindVerb)
ARMS = ("A", "B", "C", "D")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Bench:
    def __init__(self, workdir: Path, nodes: int, pods: int, binder: str = "extender") -> None:
        self.dir = workdir / "cp"
        self.nodes, self.pods, self.binder = nodes, pods, binder
        self.ports = {
            k: str(free_port()) for k in ("ETCD_PORT", "ETCD_PEER_PORT", "API_PORT", "SCHED_PORT")
        }
        self.env = {**os.environ, **self.ports}
        self.kubeconfig = str(self.dir / "admin.kubeconfig")
        self.extender_port = free_port()
        self.scheduler: subprocess.Popen[bytes] | None = None
        self.extender: subprocess.Popen[bytes] | None = None
        self.workdir = workdir

    # --- plumbing ----------------------------------------------------------------------------

    def script(self, *args: str) -> None:
        subprocess.run(
            [str(K8S / "control-plane"), args[0], str(self.dir), *args[1:]],
            env=self.env,
            check=True,
            capture_output=True,
            timeout=120,
        )

    def pid(self, name: str) -> int:
        return int((self.dir / "run" / f"{name}.pid").read_text())

    def kubectl(self, *args: str) -> str:
        return subprocess.run(
            [str(self.dir / "bin" / "kubectl"), "--kubeconfig", self.kubeconfig, *args],
            check=True,
            capture_output=True,
            text=True,
            timeout=300,
        ).stdout

    def up(self) -> None:
        self.script("up")
        self.stop_scheduler(self.pid("kube-scheduler"))
        api_client, _ = connect("bench", "kubeconfig", self.kubeconfig) or (None, "")
        self.api_client = api_client
        for crd in ("01-crd-resourceintent.yaml", "02-crd-nodeintentstate.yaml"):
            self.kubectl("apply", "-f", str(ROOT / "deploy" / crd))
        self.kubectl("apply", "-f", str(ROOT / "deploy" / "30-intent-marker.yaml"))
        self._make_nodes()
        self._wait_for_the_policy()

    def _wait_for_the_policy(self) -> None:
        """The policy loads asynchronously: wait until a dry-run pod with an intent is marked."""
        deadline = time.monotonic() + 60
        with self.http() as http:
            while time.monotonic() < deadline:
                reply = http.post(
                    "/api/v1/namespaces/default/pods",
                    params={"dryRun": "All"},
                    json=self.pod(0, "policy-probe"),
                )
                reply.raise_for_status()
                if self.marked(reply.json()):
                    return
                time.sleep(0.3)
        raise SystemExit("the intent-marker admission policy did not take effect")

    @staticmethod
    def marked(pod: dict[str, Any]) -> bool:
        return any(
            MARKER in ((c.get("resources") or {}).get("requests") or {})
            for c in pod["spec"]["containers"]
        )

    def http(self) -> httpx.Client:
        """A keep-alive HTTPS client with the admin certificate (the creators' own, per thread:
        the generated client's model building would make the creator the bottleneck)."""
        pki = self.dir / "pki"
        tls = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        tls.load_cert_chain(pki / "admin.crt", pki / "admin.key")
        return httpx.Client(
            base_url=f"https://127.0.0.1:{self.ports['API_PORT']}", verify=tls, timeout=30
        )

    def _make_nodes(self) -> None:
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        resources = {"cpu": "16", "memory": "64Gi", "pods": "110"}
        ready = {"type": "Ready", "status": "True", "reason": "Bench", "message": "fake node"}
        ready |= {"lastHeartbeatTime": now, "lastTransitionTime": now}
        local = threading.local()

        def make(i: int) -> None:
            if not hasattr(local, "http"):
                local.http = self.http()
            name = f"node-{i:05d}"
            node = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
                "status": {"capacity": resources, "allocatable": resources, "conditions": [ready]},
            }
            local.http.post("/api/v1/nodes", json=node).raise_for_status()
            # the API server taints a new node not-ready; the absent node controller lifts it
            local.http.patch(
                f"/api/v1/nodes/{name}",
                content=json.dumps({"spec": {"taints": None}}),
                headers={"Content-Type": "application/merge-patch+json"},
            ).raise_for_status()
            status = local.http.get(f"/api/v1/nodes/{name}").json()["status"]
            if not status.get("allocatable"):  # status dropped on create: set it
                local.http.patch(
                    f"/api/v1/nodes/{name}/status",
                    content=json.dumps({"status": node["status"]}),
                    headers={"Content-Type": "application/merge-patch+json"},
                ).raise_for_status()

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(make, range(self.nodes)))

    def start_extender(self) -> None:
        home = self.workdir / "extender-home"
        home.mkdir(exist_ok=True)
        if not (home / "configs").exists():
            (home / "configs").symlink_to(ROOT / "configs")
        env = {
            **os.environ,
            "PARFUSION_HOME": str(home),
            "PARFUSION_EXTENDER_KUBE_API": "kubeconfig",
            "PARFUSION_EXTENDER_KUBECONFIG": self.kubeconfig,
            "PARFUSION_EXTENDER_TELEMETRY": "false",
            "PARFUSION_LOG_LEVEL": "WARNING",
        }
        env.pop("PARFUSION_API_TOKEN", None)
        self.extender = subprocess.Popen(
            [sys.executable, "-m", "services.extender", "--port", str(self.extender_port)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=(self.workdir / "extender.log").open("wb"),
        )
        url = f"http://127.0.0.1:{self.extender_port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                state = httpx.get(f"{url}/state", timeout=2).json()
                if state["nodes"]["count"] >= self.nodes:
                    return
            except (httpx.HTTPError, KeyError, TypeError):
                pass
            time.sleep(0.3)
        raise SystemExit("the extender did not learn the nodes")

    def scheduler_config(self, arm: str, qps: int) -> Path:
        config: dict[str, Any] = scheduler_configuration()  # C: deploy/scheduler/
        config["leaderElection"] = {"leaderElect": False}
        config["clientConnection"] = {"kubeconfig": self.kubeconfig, "qps": qps, "burst": qps}
        [extender] = config["extenders"]
        extender["urlPrefix"] = f"http://127.0.0.1:{self.extender_port}"
        if self.binder == "scheduler" or arm == "D":
            del extender["bindVerb"]
        if arm not in ("C", "D"):
            # the marker is no managed resource here: NodeResourcesFit must ignore it (no node
            # advertises it), so all arms schedule the same pods
            fit = {"name": "NodeResourcesFit", "args": {"ignoredResources": [MARKER]}}
            config["profiles"] = [{"schedulerName": SCHEDULER_NAME, "pluginConfig": [fit]}]
            extender["managedResources"] = []
        if arm == "A":
            del config["extenders"]
        path = self.workdir / f"scheduler-{arm}-{qps}.yaml"
        path.write_text(yaml.safe_dump(config))
        return path

    def start_scheduler(self, config: Path) -> float:
        """Start kube-scheduler; the monotonic time it answered /readyz."""
        log = (self.dir / "logs" / "kube-scheduler.log").open("ab")
        self.scheduler = subprocess.Popen(
            [
                str(self.dir / "bin" / "kube-scheduler"),
                f"--config={config}",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.ports['SCHED_PORT']}",
                "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
                "--v=1",
            ],
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        (self.dir / "run" / "kube-scheduler.pid").write_text(str(self.scheduler.pid))
        url = f"https://127.0.0.1:{self.ports['SCHED_PORT']}/readyz"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(url, verify=False, timeout=1).status_code == 200:
                    return time.monotonic()
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise SystemExit("kube-scheduler did not become ready")

    def stop_scheduler(self, pid: int | None = None) -> None:
        pid = pid or (self.scheduler.pid if self.scheduler else None)
        if pid is None:
            return
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        if self.scheduler is not None and self.scheduler.pid == pid:
            self.scheduler.wait(10)
            self.scheduler = None
        else:
            for _ in range(100):
                if not Path(f"/proc/{pid}").exists():
                    break
                time.sleep(0.05)

    def scheduler_metrics(self) -> str:
        pki = self.dir / "pki"
        tls = ssl.create_default_context()
        tls.check_hostname, tls.verify_mode = False, ssl.CERT_NONE
        tls.load_cert_chain(pki / "admin.crt", pki / "admin.key")
        url = f"https://127.0.0.1:{self.ports['SCHED_PORT']}/metrics"
        return httpx.get(url, verify=tls, timeout=10).text

    def extender_metrics(self) -> str:
        return httpx.get(f"http://127.0.0.1:{self.extender_port}/metrics", timeout=10).text

    def down(self) -> None:
        self.stop_scheduler()
        if self.extender is not None:
            self.extender.terminate()
            self.extender.wait(10)
        self.script("down")

    # --- pods --------------------------------------------------------------------------------

    def pod(self, i: int, phase: str) -> dict[str, Any]:
        """Every second pod carries an intent, none the marker (the policy adds it)."""
        meta: dict[str, Any] = {"name": f"{phase}-{i:05d}", "labels": {"bench": phase}}
        resources: dict[str, Any] = {"requests": {"cpu": "100m", "memory": "128Mi"}}
        if i % 2 == 0:
            meta["annotations"] = {"parfusion.io/intent": json.dumps(INTENT)}
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": meta,
            "spec": {
                "schedulerName": SCHEDULER_NAME,
                "containers": [
                    {
                        "name": "main",
                        "image": "registry.invalid/none:0",
                        "resources": resources,
                    }
                ],
            },
        }

    def create_pods(self, phase: str) -> float:
        """Create the phase's pods (8 threads, keep-alive); the time the first was created.
        Fails unless the API server marked exactly the pods with an intent."""
        local = threading.local()
        wrong: list[str] = []

        def make(i: int) -> None:
            if not hasattr(local, "http"):
                local.http = self.http()
            reply = local.http.post("/api/v1/namespaces/default/pods", json=self.pod(i, phase))
            reply.raise_for_status()
            if self.marked(reply.json()) != (i % 2 == 0):
                wrong.append(reply.json()["metadata"]["name"])

        started = time.monotonic()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(make, range(self.pods)))
        if wrong:
            raise SystemExit(f"{len(wrong)} pods marked wrongly by the policy, e.g. {wrong[0]}")
        return started

    def delete_pods(self) -> None:
        """Delete every pod at once (no kubelet: grace 0) and wait until the list is empty."""
        with self.http() as http:
            http.delete(
                "/api/v1/namespaces/default/pods", params={"gracePeriodSeconds": 0}
            ).raise_for_status()
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                left = http.get("/api/v1/namespaces/default/pods", params={"limit": 1}).json()
                if not left.get("items"):
                    return
                time.sleep(0.5)
        raise SystemExit("pods were not deleted")

    # --- one phase ---------------------------------------------------------------------------

    def phase(self, label: str, mode: str, qps: str, index: int) -> dict[str, Any]:
        with_extender = label != "A"
        name = f"p{index}{label.lower()}"
        bound: dict[str, float] = {}
        nodes_used: dict[str, int] = {}
        done = threading.Event()
        lock = threading.Lock()

        def note(kind: str, key: str, pod: PodHead) -> None:
            if kind == "DELETED" or not pod.spec.nodeName or not key.startswith(f"default/{name}"):
                return
            with lock:
                if key not in bound:
                    bound[key] = time.monotonic()
                    nodes_used[pod.spec.nodeName] = nodes_used.get(pod.spec.nodeName, 0) + 1
                    if len(bound) >= self.pods:
                        done.set()

        watch = Informer(
            self.api_client,
            ResourcePath("/api/v1/pods", field_selector="spec.nodeName!="),
            PodHead,
            lambda objects: None,
            note,
            name="bench-bound",
        ).start()
        watch.synced.wait(30)
        config = self.scheduler_config(label, QPS[qps])
        pids = {"kube-apiserver": self.pid("kube-apiserver"), "etcd": self.pid("etcd")}
        if self.extender is not None:
            pids["extender"] = self.extender.pid
        if mode == "backlog":
            self.create_pods(name)
            cpu0 = {k: cpu_seconds(p) for k, p in pids.items()}
            ext0 = self.extender_metrics() if self.extender else ""
            t0 = self.start_scheduler(config)
            pids["kube-scheduler"] = self.scheduler.pid  # type: ignore[union-attr]
            cpu0["kube-scheduler"] = cpu_seconds(pids["kube-scheduler"])
        else:
            self.start_scheduler(config)
            pids["kube-scheduler"] = self.scheduler.pid  # type: ignore[union-attr]
            cpu0 = {k: cpu_seconds(p) for k, p in pids.items()}
            ext0 = self.extender_metrics() if self.extender else ""
            t0 = self.create_pods(name)
        finished = done.wait(600)
        t1 = max(bound.values()) if bound else time.monotonic()
        cpu1 = {k: cpu_seconds(p) for k, p in pids.items()}
        sched = self.scheduler_metrics()
        if "scheduler_scheduling_algorithm_duration_seconds" not in sched:
            print("kube-scheduler /metrics:", sched[:300], file=sys.stderr)
        ext1 = self.extender_metrics() if self.extender else ""
        watch.stop()
        self.stop_scheduler()
        self.delete_pods()
        # the algorithm (filter and score, the extender's calls included), not the attempt
        # (which includes waiting for the asynchronous binding behind a backlog)
        attempt = histogram(sched, "scheduler_scheduling_algorithm_duration_seconds")
        row: dict[str, Any] = {
            "phase": label,
            "mode": mode,
            "qps": qps,
            "round": index,
            "pods": len(bound),
            "complete": finished,
            "seconds": round(t1 - t0, 3),
            "pods_per_s": round(len(bound) / (t1 - t0), 1) if t1 > t0 else None,
            "nodes_used": len(nodes_used),
            "scheduler_algorithm_ms": {
                "p50": ms(quantile({}, attempt, 0.5)),
                "p99": ms(quantile({}, attempt, 0.99)),
            },
            "cpu_ms_per_pod": {
                k: round((cpu1[k] - cpu0[k]) * 1000 / max(1, len(bound)), 3) for k in pids
            },
        }
        if with_extender:
            verbs = {}
            for verb in ("filter", "prioritize", "bind"):
                match = f'verb="{verb}"'
                before = histogram(ext0, "parfusion_extender_request_duration_seconds", match)
                after = histogram(ext1, "parfusion_extender_request_duration_seconds", match)
                verbs[verb] = {
                    "p50": ms(quantile(before, after, 0.5)),
                    "p99": ms(quantile(before, after, 0.99)),
                    # how many calls kube-scheduler made: C calls only for pods with the marker
                    "calls": int(after.get(float("inf"), 0.0) - before.get(float("inf"), 0.0)),
                }
            row["extender_ms"] = verbs
            # binds the extender refused on its re-check: each sends the pod back to the queue
            name = "parfusion_extender_bindings_total"
            row["binds_refused"] = int(
                counter(ext1, name, 'outcome="refused"') - counter(ext0, name, 'outcome="refused"')
            )
        return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=2, help="A/B pairs per mode")
    parser.add_argument("--modes", default="backlog,stream")
    parser.add_argument("--qps", default="raised", help="raised, default or both")
    parser.add_argument("--arms", default="A,B,C", help="phases per round, in order (A-D)")
    parser.add_argument(
        "--binder",
        choices=("extender", "scheduler"),
        default="extender",
        help="who binds in B and C: the extender (bindVerb, as deploy/) or kube-scheduler",
    )
    parser.add_argument("--out", default=str(ROOT / "results" / "bench" / "kube_scheduler.json"))
    ns = parser.parse_args(argv)
    if not (K8S / "control-plane").exists() or shutil.which("etcd") is None:
        print(f"needs {K8S}/control-plane and etcd (apt-get install etcd-server)", file=sys.stderr)
        return 2
    qps_modes = ["raised", "default"] if ns.qps == "both" else [ns.qps]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # tear the plane down on TERM
    workdir = Path(tempfile.mkdtemp(prefix="bench-kube-"))
    bench = Bench(workdir, ns.nodes, ns.pods, ns.binder)
    rows: list[dict[str, Any]] = []
    load_at_start = os.getloadavg()
    try:
        t = time.monotonic()
        bench.up()
        print(f"control plane + {ns.nodes} nodes in {time.monotonic() - t:.1f}s", flush=True)
        bench.start_extender()
        print(f"+ extender: {time.monotonic() - t:.1f}s", flush=True)
        for qps in qps_modes:
            for mode in ns.modes.split(","):
                for index in range(ns.rounds):
                    for label in ns.arms.split(","):
                        row = bench.phase(label, mode, qps, index)
                        rows.append(row)
                        print(json.dumps(row), flush=True)
    finally:
        bench.down()
        shutil.rmtree(workdir, ignore_errors=True)
    result = {
        "nodes": ns.nodes,
        "pods": ns.pods,
        "binder": ns.binder,
        "cpus": os.cpu_count(),
        "load_at_start": load_at_start,  # 1, 5, 15 min: the machine is shared
        "load_at_end": os.getloadavg(),
        "rows": rows,
        "with_over_without": ratios(rows, ARMS),
    }
    out = Path(ns.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(table(rows))
    print("with/without (median pods/s, per arm):", result["with_over_without"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
