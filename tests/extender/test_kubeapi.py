"""Bind through the official kubernetes client against a fake API server at the HTTP boundary.

No Kubernetes API server can run on this machine, so a tiny local HTTP server plays one: the
extender's kubernetes client reaches it through a generated kubeconfig, exactly as it would a
real one, and the test checks the Binding it POSTs and how API errors come back in Error.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from starlette.testclient import TestClient

from services.common.config import build_settings
from services.extender import samples
from services.extender.app import create_app
from services.extender.kubeapi import connect


class FakeApiServer:
    def __init__(self) -> None:
        self.requests: list[tuple[str, str, dict[str, Any] | None, dict[str, str]]] = []
        self.bind_status = 201
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *_: Any) -> None:
                pass

            def _reply(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length) or b"null")
                owner.requests.append(("POST", self.path, body, dict(self.headers)))
                if owner.bind_status == 201:
                    self._reply(
                        201,
                        {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201},
                    )
                else:
                    self._reply(
                        owner.bind_status,
                        {
                            "kind": "Status",
                            "apiVersion": "v1",
                            "status": "Failure",
                            "code": owner.bind_status,
                            "reason": "Conflict",
                            "message": 'pod "det-0" is already assigned to node "gpu-node-b"',
                        },
                    )

            def do_GET(self) -> None:  # noqa: N802
                owner.requests.append(("GET", self.path, None, dict(self.headers)))
                if self.path.startswith("/api/v1/nodes"):
                    self._reply(
                        200,
                        {
                            "kind": "NodeList",
                            "apiVersion": "v1",
                            "metadata": {},
                            "items": samples.sample_node_objects(),
                        },
                    )
                else:
                    self._reply(404, {"kind": "Status", "code": 404})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def api_server() -> Iterator[FakeApiServer]:
    server = FakeApiServer()
    server.thread.start()
    yield server
    server.server.shutdown()
    server.server.server_close()


def _kubeconfig(tmp: Path, url: str) -> Path:
    path = tmp / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": url}}],
                "users": [{"name": "sched", "user": {"token": "t0ken"}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "sched"}}],
                "current-context": "fake",
            }
        )
    )
    return path


def test_bind_creates_the_binding_through_the_api(home: Path, api_server: FakeApiServer) -> None:
    settings = build_settings(
        "extender",
        overrides={
            "telemetry": False,
            "kube_api": "kubeconfig",
            "kubeconfig": str(_kubeconfig(home, api_server.url)),
        },
    )
    pod = samples.pod_object("det-0", namespace="vision", intent=samples.ONLINE_INTENT)
    with TestClient(create_app(settings)) as c:
        c.post(
            "/filter",
            content=orjson.dumps(samples.extender_args(pod, samples.sample_node_objects(), False)),
        )
        m = pod["metadata"]
        bind = {
            "PodName": m["name"],
            "PodNamespace": m["namespace"],
            "PodUID": m["uid"],
            "Node": "gpu-node-a",
        }
        assert c.post("/bind", json=bind).json() == {"Error": ""}
        posts = [r for r in api_server.requests if r[0] == "POST"]
        assert len(posts) == 1
        _, path, body, headers = posts[0]
        assert path == "/api/v1/namespaces/vision/pods/det-0/binding"
        assert headers.get("authorization") == "Bearer t0ken"
        assert body["kind"] == "Binding"
        assert body["metadata"] == {"name": "det-0", "namespace": "vision", "uid": m["uid"]}
        assert body["target"] == {"apiVersion": "v1", "kind": "Node", "name": "gpu-node-a"}
        state = c.get("/state").json()
        assert state["bind_mode"] == "api" and state["bindings"][0]["mode"] == "api"

        api_server.bind_status = 409
        bind["PodName"] = "det-1"
        bind["PodUID"] = ""
        error = c.post("/bind", json=bind).json()["Error"]
        assert "409" in error and "already assigned" in error
        text = c.get("/metrics").text
        assert 'parfusion_extender_bindings_total{mode="api",outcome="error"} 1.0' in text


def test_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="kube_api"):
        connect("cluster")
    assert connect("standalone") is None
