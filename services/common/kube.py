"""Kubernetes API access shared by the allocator and the extender: the client and list + watch.

One client for the project: the official ``kubernetes`` package (synchronous; docs/architecture.md
says why). ``connect`` turns a service's ``kube_api`` setting into an ApiClient (None for
``standalone``). ``Informer`` keeps one resource's objects current on a daemon thread the way
client-go's reflector does: list (keeping the list's resourceVersion), then watch from it with
bookmarks; an expired resourceVersion (410 Gone) re-lists; any other error backs off
exponentially (with jitter) and re-lists. Objects are decoded with msgspec into the small
struct the caller names, never into the client's generated models, so a watch over thousands
of pods costs little CPU.
"""

from __future__ import annotations

import contextlib
import json
import logging
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import msgspec

log = logging.getLogger(__name__)

MODES = ("standalone", "incluster", "kubeconfig")
T = TypeVar("T")


def connect(service: str, mode: str, kubeconfig: str = "") -> tuple[Any, str] | None:
    """(kubernetes.client.ApiClient, description) for ``mode``; None for standalone.
    Raises ValueError on an unknown mode (the message names ``<service>.kube_api``)."""
    if mode not in MODES:
        raise ValueError(f"{service}.kube_api must be one of {', '.join(MODES)}, got {mode!r}")
    if mode == "standalone":
        return None
    from kubernetes import client, config

    if mode == "incluster":
        config.load_incluster_config()
        api_client = client.ApiClient()
        description = "in-cluster service account"
    else:
        api_client = config.new_client_from_config(config_file=kubeconfig or None)
        description = f"kubeconfig {kubeconfig or '(default)'}"
    log.info("kubernetes API access", extra={"for": service, "mode": mode, "via": description})
    return api_client, description


def api_error_message(exc: Exception) -> str:
    """A one-line reason from an ApiException (status, reason and the Status message)."""
    status = getattr(exc, "status", None)
    reason = getattr(exc, "reason", None)
    body = getattr(exc, "body", None)
    detail = ""
    if body:
        try:
            detail = msgspec.json.decode(body).get("message", "")
        except (msgspec.DecodeError, AttributeError):
            detail = str(body)[:200]
    if status is None:
        return f"{type(exc).__name__}: {exc}"
    return f"API {status} {reason or ''}: {detail}".strip()


class ObjectMeta(msgspec.Struct):
    name: str = ""
    namespace: str = ""
    uid: str = ""
    resourceVersion: str = ""  # noqa: N815 (the API's spelling)
    generation: int = 0
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    deletionTimestamp: str | None = None  # noqa: N815


class PodSpecHead(msgspec.Struct):
    nodeName: str = ""  # noqa: N815


class PodStatusHead(msgspec.Struct):
    phase: str = ""


class PodHead(msgspec.Struct):
    """The parts of a pod that say where it runs and which intent it carries."""

    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)
    spec: PodSpecHead = msgspec.field(default_factory=PodSpecHead)
    status: PodStatusHead = msgspec.field(default_factory=PodStatusHead)

    @property
    def finished(self) -> bool:
        """Succeeded, Failed or being deleted: it holds nothing on its node any more."""
        return self.status.phase in ("Succeeded", "Failed") or bool(self.metadata.deletionTimestamp)


def request(
    api_client: Any,
    method: str,
    path: str,
    query: list[tuple[str, Any]] | None = None,
    timeout: float | tuple[float, float] | None = None,
    body: dict[str, Any] | None = None,
) -> Any:
    """One call through the client's connection pool and credentials, without its generated
    models and argument validation (about 0.8-1 ms of CPU per call on their own, which a
    Binding per pod pays). The urllib3 response, unread; ApiException for a status >= 400."""
    headers = {"Accept": "application/json"}
    if body is not None:
        headers["Content-Type"] = "application/json"
    method, url, headers, body, _ = api_client.param_serialize(
        method, path, query_params=query, header_params=headers, body=body,
        auth_settings=["BearerToken"],
    )  # fmt: skip
    response = api_client.call_api(
        method, url, header_params=headers, body=body, _request_timeout=timeout
    )
    if response.status >= 400:
        from kubernetes.client.exceptions import ApiException

        raise ApiException(status=response.status, reason=response.reason, body=response.read())
    return response.response


class _Listed(msgspec.Struct):
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)
    items: list[msgspec.Raw] = msgspec.field(default_factory=list)


class _Event(msgspec.Struct):
    type: str
    object: msgspec.Raw


class _Gone(Exception):
    """The watch's resourceVersion is too old (410): list again."""


@dataclass
class ResourcePath:
    """Where a resource's list/watch lives: ``/api/v1/pods`` or ``/apis/g/v/plural``."""

    path: str
    field_selector: str = ""
    label_selector: str = ""

    def query(self, **extra: Any) -> list[tuple[str, Any]]:
        params: list[tuple[str, Any]] = []
        if self.field_selector:
            params.append(("fieldSelector", self.field_selector))
        if self.label_selector:
            params.append(("labelSelector", self.label_selector))
        params += [(k, v) for k, v in extra.items() if v is not None]
        return params


@dataclass
class Informer(Generic[T]):
    """List + watch one resource into ``on_sync`` (the full set after each list) and
    ``on_event`` (``ADDED``/``MODIFIED``/``DELETED`` with the decoded object) callbacks, both
    called on the informer's thread. ``key`` names an object (default namespace/name)."""

    api_client: Any
    resource: ResourcePath
    kind: type[T]
    on_sync: Callable[[dict[str, T]], None]
    on_event: Callable[[str, str, T], None]
    name: str = "informer"
    timeout_s: float = 10.0
    watch_s: int = 240  # server-side watch timeout: the watch is renewed from the last version
    backoff_s: tuple[float, float] = (0.2, 10.0)
    key: Callable[[T], str] = field(default=lambda obj: _default_key(obj))
    resource_version: str = ""
    synced: threading.Event = field(default_factory=threading.Event)
    errors: int = 0
    last_error: str = ""
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _response: Any = None

    def __post_init__(self) -> None:
        self._item = msgspec.json.Decoder(self.kind)
        self._list = msgspec.json.Decoder(_Listed)
        self._event = msgspec.json.Decoder(_Event)

    def start(self) -> Informer[T]:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        response = self._response
        if response is not None:  # unblock a read waiting on the watch stream
            with contextlib.suppress(Exception):  # the stream may already be gone
                response.shutdown()
        if self._thread is not None:
            self._thread.join(timeout)

    # --- the loop ----------------------------------------------------------------------------

    def _run(self) -> None:
        delay = self.backoff_s[0]
        while not self._stop.is_set():
            try:
                if not self.resource_version:
                    self._relist()
                self._watch()
                delay = self.backoff_s[0]
            except _Gone:
                self.resource_version = ""  # re-list at once: nothing is wrong but our version
            except Exception as exc:  # unreachable API server, 5xx, bad TLS: back off, re-list
                if self._stop.is_set():
                    return
                self.errors += 1
                self.last_error = f"{type(exc).__name__}: {exc}"[:300]
                log.warning(
                    "list/watch of %s failed, retrying in ~%.1fs: %s",
                    self.name,
                    delay,
                    self.last_error,
                    extra={"informer": self.name, "error": self.last_error, "retry_s": delay},
                )
                self.resource_version = ""
                self._stop.wait(delay * (0.5 + random.random()))
                delay = min(delay * 2, self.backoff_s[1])

    def _call(self, **params: Any) -> Any:
        """GET the resource (a list, or with watch=True a stream); the urllib3 response."""
        watching = bool(params.get("watch"))
        # a watch may stay silent until its server-side timeout: read timeout beyond that
        timeout = (self.timeout_s, self.watch_s + self.timeout_s) if watching else self.timeout_s
        return request(
            self.api_client, "GET", self.resource.path, self.resource.query(**params), timeout
        )

    def _relist(self) -> None:
        response = self._call()
        listed = self._list.decode(response.data)
        objects = {}
        for raw in listed.items:
            obj = self._item.decode(raw)
            objects[self.key(obj)] = obj
        self.resource_version = str(listed.metadata.get("resourceVersion", ""))
        self.on_sync(objects)
        self.synced.set()

    def _watch(self) -> None:
        response = self._call(
            watch=True,
            resourceVersion=self.resource_version,
            allowWatchBookmarks=True,
            timeoutSeconds=self.watch_s,
        )
        self._response = response
        try:
            for line in _lines(response):
                if self._stop.is_set():
                    return
                event = self._event.decode(line)
                if event.type == "ERROR":
                    status = json.loads(bytes(event.object))
                    if status.get("code") == 410:
                        raise _Gone()
                    raise RuntimeError(f"watch error: {status.get('message', status)}")
                meta = msgspec.json.decode(event.object, type=_MetaOnly).metadata
                if meta.resourceVersion:
                    self.resource_version = meta.resourceVersion
                if event.type == "BOOKMARK":
                    continue
                obj = self._item.decode(event.object)
                self.on_event(event.type, self.key(obj), obj)
        finally:
            self._response = None
            with contextlib.suppress(Exception):  # the stream may already be gone
                response.release_conn()


class _MetaOnly(msgspec.Struct):
    metadata: ObjectMeta = msgspec.field(default_factory=ObjectMeta)


def _default_key(obj: Any) -> str:
    meta = obj.metadata
    namespace = getattr(meta, "namespace", "")
    return f"{namespace}/{meta.name}" if namespace else meta.name


def _lines(response: Any) -> Iterator[bytes]:
    """Newline-delimited watch events from the chunked response."""
    pending = b""
    for chunk in response.stream(amt=None, decode_content=False):
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            if line.strip():
                yield line
    if pending.strip():
        yield pending


class TokenBucket:
    """At most ``rate`` per second on average, bursts up to ``burst``: bounds API writes."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic):
        self.rate, self.burst, self._clock = rate, float(burst), clock
        self._tokens = float(burst)
        self._at = clock()

    def take(self) -> bool:
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens >= 1:
            self._tokens -= 1
            return True
        return False
