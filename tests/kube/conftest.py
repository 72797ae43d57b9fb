"""A real Kubernetes control plane for the tests in this folder, once per session.

../shared/k8s (beside the repository) holds kube-apiserver, kube-scheduler and kubectl v1.36.2
and the ``control-plane`` script; etcd comes from Debian (``make test`` installs etcd-server as
root). Without them the tests skip and say why. Every port is a free one, so parallel runs never
collide, and the plane is always taken down.

``cluster`` is the whole PARFusion-on-Kubernetes picture: the CRDs, the admission policy that
marks pods carrying an intent, three fake Ready nodes, the extender (``kube_api: kubeconfig``)
that kube-scheduler calls with the shipped KubeSchedulerConfiguration (nodeCacheCapable,
extender binds, only for marked pods), and per node its own allocator and modeled node agent
(own ports, own PARFUSION_NODE_NAME) reconciling that node's intents.
"""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from parfusion.deploy_scheduler import SCHEDULER_NAME, scheduler_configuration
from services.core.podintent import MARKER
from tests.conftest import ROOT, free_port
from tests.stack import Stack, start_stack

# beside the repository (CI: a copy of shared/ next to the clone); PARFUSION_TEST_K8S_DIR
# points elsewhere (a git worktree whose parent has no shared/)
K8S = Path(os.environ.get("PARFUSION_TEST_K8S_DIR") or ROOT.parent / "shared" / "k8s")
NODES = {"node-a": 16, "node-b": 16, "node-c": 8}  # name -> CPUs (and allocator units)
STALE_S = 4.0  # the extender's node_state_stale_s here (30 s by default)


def _missing() -> str | None:
    if not (K8S / "control-plane").exists():
        return f"no Kubernetes test binaries at {K8S} (set PARFUSION_TEST_K8S_DIR)"
    for tool, package in (("etcd", "etcd-server"), ("openssl", "openssl"), ("curl", "curl")):
        if shutil.which(tool) is None:
            return f"{tool} not installed (apt-get install {package}; make test does it as root)"
    return None


@dataclass
class ControlPlane:
    directory: Path
    env: dict[str, str]
    extender_port: int  # kube-scheduler's configured extender URL

    @property
    def kubeconfig(self) -> str:
        return str(self.directory / "admin.kubeconfig")

    def script(self, *args: str, timeout: float = 90) -> str:
        done = subprocess.run(
            [str(K8S / "control-plane"), args[0], str(self.directory), *args[1:]],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if done.returncode != 0:
            raise RuntimeError(f"control-plane {args[0]} failed:\n{done.stdout}\n{done.stderr}")
        return done.stdout

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True) -> str:
        """kubectl's output; with check=False a failure returns its stderr instead of raising."""
        done = subprocess.run(
            [str(self.directory / "bin" / "kubectl"), *args],
            env={**self.env, "KUBECONFIG": self.kubeconfig},
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if check and done.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args)}: {done.stderr}")
        return done.stdout if done.returncode == 0 else done.stderr

    def apply(self, *docs: dict[str, Any]) -> str:
        return self.kubectl("apply", "-f", "-", stdin=yaml.safe_dump_all(docs))

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json"))

    def api(self) -> httpx.Client:
        """A keep-alive HTTPS client of the API server with the admin certificate."""
        pki = self.directory / "pki"
        tls = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        tls.load_cert_chain(pki / "admin.crt", pki / "admin.key")
        return httpx.Client(
            base_url=f"https://127.0.0.1:{self.env['API_PORT']}", verify=tls, timeout=30
        )


def apply_marker_policy(plane: ControlPlane) -> None:
    """Apply deploy/'s intent-marker admission policy and wait until the API server enforces it
    (policies load asynchronously): a dry-run pod with an intent comes back marked."""
    plane.kubectl("apply", "-f", str(ROOT / "deploy" / "30-intent-marker.yaml"))
    probe = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "marker-probe", "labels": {"parfusion.io/class": "BATCH"}},
        "spec": {
            "schedulerName": SCHEDULER_NAME,
            "containers": [{"name": "main", "image": "registry.invalid/none:0"}],
        },
    }

    def marked() -> bool:
        with plane.api() as api:
            reply = api.post(
                "/api/v1/namespaces/default/pods", params={"dryRun": "All"}, json=probe
            )
        reply.raise_for_status()
        resources = reply.json()["spec"]["containers"][0].get("resources") or {}
        return MARKER in (resources.get("requests") or {})

    wait_for(marked, "the intent-marker policy to take effect", timeout=30)


@dataclass
class Cluster:
    plane: ControlPlane
    extender: Stack
    nodes: dict[str, Stack] = field(default_factory=dict)

    @property
    def extender_url(self) -> str:
        return f"http://127.0.0.1:{self.plane.extender_port}"

    def extender_state(self) -> dict[str, Any]:
        return httpx.get(f"{self.extender_url}/state", timeout=5).json()

    def node_record(self, name: str) -> dict[str, Any] | None:
        nodes = self.extender_state()["nodes"]["nodes"]
        return next((n for n in nodes if n["name"] == name), None)


def wait_for(check: Callable[[], Any], what: str, timeout: float = 20.0) -> Any:
    """Poll until ``check()`` is truthy; fail naming ``what`` and the last value."""
    deadline = time.monotonic() + timeout
    value = None
    while time.monotonic() < deadline:
        try:
            value = check()
        except (RuntimeError, httpx.HTTPError, KeyError) as exc:
            value = exc
        else:
            if value:
                return value
        time.sleep(0.25)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {value!r}")


def scheduler_config(extender_port: int) -> dict[str, Any]:
    """The shipped KubeSchedulerConfiguration (deploy/scheduler/) with the local extender URL;
    control-plane sets the kubeconfig and turns leader election off."""
    config = scheduler_configuration()
    config.pop("leaderElection", None)
    config["extenders"][0]["urlPrefix"] = f"http://127.0.0.1:{extender_port}"
    return config


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """etcd + kube-apiserver + kube-scheduler (calling the extender on ``extender_port``)."""
    reason = _missing()
    if reason:
        pytest.skip(reason)
    directory = tmp_path_factory.mktemp("control-plane")
    ports = {k: str(free_port()) for k in ("ETCD_PORT", "ETCD_PEER_PORT", "API_PORT", "SCHED_PORT")}
    plane = ControlPlane(directory, {**os.environ, **ports}, extender_port=free_port())
    config = directory / "scheduler.yaml"
    config.write_text(yaml.safe_dump(scheduler_config(plane.extender_port)))
    try:
        plane.script("up", str(config))
        yield plane
    finally:
        plane.script("down")


def _home(tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    home = tmp_path_factory.mktemp(name)
    (home / "configs").symlink_to(ROOT / "configs")
    return home


@pytest.fixture(scope="session")
def cluster(
    control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    plane = control_plane
    plane.kubectl("apply", "-f", str(ROOT / "deploy" / "01-crd-resourceintent.yaml"))
    plane.kubectl("apply", "-f", str(ROOT / "deploy" / "02-crd-nodeintentstate.yaml"))
    plane.kubectl("wait", "--for=condition=Established", "crd", "--all", "--timeout=30s")
    # the shipped scheduler calls the extender only for marked pods: the policy marks them
    apply_marker_policy(plane)
    for name, cpus in NODES.items():
        plane.script("node", name, str(cpus), "64Gi")
    kube = {"PARFUSION_EXTENDER_KUBE_API": "kubeconfig"}
    stacks: list[Stack] = []
    failed: list[str] = []
    try:
        extender = start_stack(
            _home(tmp_path_factory, "extender"),
            ["extender"],
            {
                **kube,
                "PARFUSION_EXTENDER_KUBECONFIG": plane.kubeconfig,
                "PARFUSION_EXTENDER_PORT": str(plane.extender_port),
                "PARFUSION_EXTENDER_TELEMETRY": "false",
                "PARFUSION_EXTENDER_NODE_STATE_STALE_S": str(STALE_S),
            },
        )
        stacks.append(extender)
        result = Cluster(plane, extender)

        def node_stack(name: str) -> Stack:
            return start_stack(
                _home(tmp_path_factory, name),
                ["allocator", "nodeagent"],
                {
                    "PARFUSION_NODE_NAME": name,
                    "PARFUSION_ALLOCATOR_KUBE_API": "kubeconfig",
                    "PARFUSION_ALLOCATOR_KUBECONFIG": plane.kubeconfig,
                    "PARFUSION_ALLOCATOR_SEED_INTENTS": "false",
                    "PARFUSION_ALLOCATOR_CPU_UNITS": str(NODES[name]),
                    "PARFUSION_ALLOCATOR_STATE_HEARTBEAT_S": "1.0",
                    "PARFUSION_ALLOCATOR_STATE_MIN_INTERVAL_S": "0.5",
                    "PARFUSION_ALLOCATOR_STATUS_INTERVAL_S": "0.5",
                    "PARFUSION_ALLOCATOR_STATUS_MIN_INTERVAL_S": "1.0",
                },
            )

        # the three nodes start (and stop) side by side: each is a few processes of its own
        with ThreadPoolExecutor(len(NODES)) as pool:
            futures = {name: pool.submit(node_stack, name) for name in NODES}
            for name, future in futures.items():
                try:
                    result.nodes[name] = future.result()
                except Exception:
                    failed.append(name)
            stacks += result.nodes.values()
            if failed:
                raise RuntimeError(f"node stacks did not start: {failed}")
        yield result
    finally:
        with ThreadPoolExecutor(max(1, len(stacks))) as pool:
            list(pool.map(Stack.close, stacks))
