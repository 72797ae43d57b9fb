"""The shared HTTP pieces against hostile clients, over real sockets and a real uvicorn: token
edge cases are 401 (never 500), slow or idle clients are cut off, connections are capped, and
every response carries the security headers."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from services.common.config import build_settings
from services.common.http import (
    CONTENT_SECURITY_POLICY,
    SecurityHeadersMiddleware,
    TokenMiddleware,
    uvicorn_config,
)
from services.common.tokens import token_matches
from tests.conftest import free_port

TOKEN = "s3cret-token"


def _app() -> Starlette:
    async def echo(_request: Request) -> JSONResponse:
        return JSONResponse({"ok": True})

    return Starlette(
        routes=[Route("/thing", echo, methods=["GET", "POST"])],
        middleware=[
            Middleware(SecurityHeadersMiddleware),
            Middleware(TokenMiddleware, token=TOKEN),
        ],
    )


Serve = Callable[..., int]


@pytest.fixture
def serve() -> Iterator[Serve]:
    """Run the app under the services' own uvicorn config on a free port (in a thread)."""
    servers: list[tuple[uvicorn.Server, threading.Thread]] = []

    def start(**settings: object) -> int:
        port = free_port()
        config = uvicorn_config(
            _app(), build_settings("extender", overrides={"port": port, **settings}, env={})
        )
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + 10
        while not server.started:
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.02)
        servers.append((server, thread))
        return port

    yield start
    for server, thread in servers:
        server.should_exit = True
        thread.join(10)


def _exchange(port: int, raw: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(raw)
        chunks = []
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)


def _request(method: str, headers: bytes = b"", body: bytes = b"") -> bytes:
    return (
        f"{method} /thing HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        f"Content-Length: {len(body)}\r\n".encode()
        + headers
        + b"\r\n"
        + body
    )


def _status(reply: bytes) -> int:
    return int(reply.split(b" ", 2)[1])


def _closed_by_server(s: socket.socket) -> bool:
    """True when the server closed the connection (EOF or reset) within the socket timeout."""
    try:
        return s.recv(1024) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_token_edge_cases_are_401_and_the_right_token_passes(serve: Serve) -> None:
    port = serve()
    for header in (
        b"X-API-Token: \xff\xfe\r\n",
        "Authorization: Bearer é\r\n".encode(),
        b"Authorization: Bearer \xc3\r\n",
        b"Authorization: Bearer\r\n",
        b"Authorization: Basic " + TOKEN.encode() + b"\r\n",
        b"X-API-Token: \r\n",
        b"",
    ):
        reply = _exchange(port, _request("POST", header, b"{}"))
        assert _status(reply) == 401, header
        assert b"missing or invalid API token" in reply
    ok = _exchange(port, _request("POST", f"Authorization: Bearer {TOKEN}\r\n".encode(), b"{}"))
    assert _status(ok) == 200
    assert _status(_exchange(port, _request("GET"))) == 200  # reads need no token


def test_token_matches_any_input_without_raising() -> None:
    assert token_matches("é", "é") and token_matches(b"abc", "abc")
    for given in (None, "", "\udcff", "\ud800", "é", b"\xff", "abc "):
        assert not token_matches(given, "abc")


def test_every_response_carries_the_security_headers(serve: Serve) -> None:
    port = serve()
    reply = _exchange(port, _request("GET")).decode("latin-1").lower()
    assert f"content-security-policy: {CONTENT_SECURITY_POLICY}".lower() in reply
    assert "script-src 'self';" in reply and "unsafe-inline" not in reply.split("style-src")[0]
    assert "x-content-type-options: nosniff" in reply


def test_idle_and_trickling_clients_are_cut_off(serve: Serve) -> None:
    port = serve(http_header_timeout_s=0.5, http_keep_alive_s=1)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as idle:
        assert _closed_by_server(idle)  # connected, never sent a byte
    with socket.create_connection(("127.0.0.1", port), timeout=10) as slow:
        slow.settimeout(0.2)
        closed = False
        for byte in b"GET /thing HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 200:
            try:
                slow.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
            if _closed_by_server(slow):
                closed = True
                break
        assert closed, "a client trickling its headers kept its connection"
    with socket.create_connection(("127.0.0.1", port), timeout=10) as kept:
        kept.sendall(b"GET /thing HTTP/1.1\r\nHost: x\r\n\r\n")
        assert kept.recv(65536).startswith(b"HTTP/1.1 200")
        assert _closed_by_server(kept)  # idle after a response: the keep-alive timeout
    assert _status(_exchange(port, _request("GET"))) == 200  # and the service still answers


def test_connections_beyond_the_limit_are_closed_and_oversized_headers_refused(
    serve: Serve,
) -> None:
    port = serve(http_max_connections=4, http_header_timeout_s=30, http_max_header_bytes=4096)
    held = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(4)]
    try:
        time.sleep(0.2)  # let the server accept them
        with socket.create_connection(("127.0.0.1", port), timeout=10) as extra:
            assert _closed_by_server(extra)
    finally:
        for s in held:
            s.close()
    time.sleep(0.2)
    big = _exchange(port, _request("GET", b"X-Pad: " + b"a" * 8192 + b"\r\n"))
    assert _status(big) == 431 and b'"request headers over 4096 bytes"' in big
    # a block still arriving is refused once it passes the cap, before its end
    with socket.create_connection(("127.0.0.1", port), timeout=10) as growing:
        growing.sendall(b"GET /thing HTTP/1.1\r\nHost: x\r\n")
        for _ in range(6):
            try:
                growing.sendall(b"X-Pad: " + b"a" * 1000 + b"\r\n")
            except (BrokenPipeError, ConnectionResetError):
                break
            time.sleep(0.05)
        assert growing.recv(65536).startswith(b"HTTP/1.1 431")
    assert _status(_exchange(port, _request("GET"))) == 200
