"""The dashboard's view of the other services: one short-deadline call per question, never a hang.

gRPC calls use the generated sync stubs run in worker threads (so a slow service blocks a thread
for at most its timeout, never the event loop); the bridge and extender are plain HTTP through
httpx. Every read returns a :class:`Reading` that either holds the answer or says, in words a
panel can show, that the service is unreachable at its address.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import grpc
import httpx

from parfusion.v1 import (
    allocator_pb2,
    allocator_pb2_grpc,
    gpulane_pb2,
    gpulane_pb2_grpc,
    intent_pb2,
    nodeagent_pb2,
    nodeagent_pb2_grpc,
    telemetry_pb2,
)
from services.common.clients import channel

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class Reading(Generic[T]):
    """One service's answer, or why there is none (``error`` is shown verbatim in its panel)."""

    service: str
    address: str
    value: T | None = None
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error


class ActionError(Exception):
    """A mutating call failed; the message is what the dashboard shows next to the button."""


@dataclass(frozen=True)
class Endpoints:
    allocator: str
    nodeagent: str
    gpulane: str
    bridge_url: str
    extender_url: str


def describe_rpc_error(service: str, address: str, exc: grpc.RpcError) -> str:
    code = exc.code() if hasattr(exc, "code") else None
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return f"{service} unreachable at {address}"
    details = exc.details() if hasattr(exc, "details") else str(exc)
    name = code.name if code is not None else "ERROR"
    return f"{service} at {address} answered {name}: {details}"


class ServiceClients:
    """Channels and stubs for allocator, nodeagent, gpulane; an httpx client for the HTTP services."""

    def __init__(self, endpoints: Endpoints, *, timeout_s: float, token: str | None) -> None:
        self.endpoints = endpoints
        self.timeout_s = timeout_s
        self._token = token
        self._channels = {
            "allocator": channel(endpoints.allocator, token),
            "nodeagent": channel(endpoints.nodeagent, token),
            "gpulane": channel(endpoints.gpulane, token),
        }
        self.allocator = allocator_pb2_grpc.AllocatorServiceStub(self._channels["allocator"])
        self.nodeagent = nodeagent_pb2_grpc.NodeAgentServiceStub(self._channels["nodeagent"])
        self.gpulane = gpulane_pb2_grpc.GpuLaneServiceStub(self._channels["gpulane"])
        # its own threads: a poll of seven calls plus previews never queue behind other work
        self._threads = ThreadPoolExecutor(max_workers=16, thread_name_prefix="dashboard-rpc")
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.AsyncClient(timeout=httpx.Timeout(timeout_s), headers=headers)

    async def close(self) -> None:
        await self.http.aclose()
        for ch in self._channels.values():
            ch.close()
        self._threads.shutdown(wait=False, cancel_futures=True)

    def address(self, service: str) -> str:
        return {
            "allocator": self.endpoints.allocator,
            "nodeagent": self.endpoints.nodeagent,
            "gpulane": self.endpoints.gpulane,
            "bridge": self.endpoints.bridge_url,
            "extender": self.endpoints.extender_url,
        }[service]

    async def _rpc(self, service: str, fn: Callable[..., T], request: Any) -> Reading[T]:
        address = self.address(service)
        try:
            call = functools.partial(fn, request, timeout=self.timeout_s)
            value = await asyncio.get_running_loop().run_in_executor(self._threads, call)
        except grpc.RpcError as exc:
            return Reading(service, address, error=describe_rpc_error(service, address, exc))
        return Reading(service, address, value=value)

    async def _http(self, service: str, method: str, path: str, body: Any = None) -> Reading[Any]:
        base = self.address(service)
        try:
            response = await self.http.request(method, base + path, json=body)
        except httpx.HTTPError:
            return Reading(service, base, error=f"{service} unreachable at {base}")
        try:
            payload = response.json()
        except ValueError:
            payload = {"raw": response.text[:200]}
        if response.status_code >= 400:
            message = payload.get("error") if isinstance(payload, dict) else None
            detail = message or response.text[:200]
            return Reading(
                service,
                base,
                value=payload,
                error=f"{service} answered {response.status_code}: {detail}",
            )
        return Reading(service, base, value=payload)

    # --- reads (the observer's poll) ---------------------------------------------------------

    async def get_plan(self) -> Reading[allocator_pb2.GetPlanResponse]:
        return await self._rpc("allocator", self.allocator.GetPlan, allocator_pb2.GetPlanRequest())

    async def list_intents(self) -> Reading[allocator_pb2.ListIntentsResponse]:
        return await self._rpc(
            "allocator", self.allocator.ListIntents, allocator_pb2.ListIntentsRequest()
        )

    async def list_policies(self) -> Reading[allocator_pb2.ListPoliciesResponse]:
        return await self._rpc(
            "allocator", self.allocator.ListPolicies, allocator_pb2.ListPoliciesRequest()
        )

    async def node_telemetry(self) -> Reading[nodeagent_pb2.GetNodeTelemetryResponse]:
        return await self._rpc(
            "nodeagent", self.nodeagent.GetNodeTelemetry, nodeagent_pb2.GetNodeTelemetryRequest()
        )

    async def gpu_telemetry(self) -> Reading[gpulane_pb2.GetGpuTelemetryResponse]:
        return await self._rpc(
            "gpulane", self.gpulane.GetGpuTelemetry, gpulane_pb2.GetGpuTelemetryRequest()
        )

    async def bridge_state(self) -> Reading[Any]:
        return await self._http("bridge", "GET", "/api/state")

    async def extender_health(self) -> Reading[Any]:
        return await self._http("extender", "GET", "/healthz")

    # --- what-if ------------------------------------------------------------------------------

    async def preview_plan(
        self, *, cpu: float, gpu: float, network: float, arrival_rate_scale: float, policy: str = ""
    ) -> Reading[allocator_pb2.PreviewPlanResponse]:
        request = allocator_pb2.PreviewPlanRequest(
            disturbance=telemetry_pb2.Disturbance(
                cpu_pressure=cpu,
                gpu_pressure=gpu,
                network_pressure=network,
                duration_s=60.0,
                source="dashboard-what-if",
            ),
            arrival_rate_scale=arrival_rate_scale,
            policy=policy,
        )
        return await self._rpc("allocator", self.allocator.PreviewPlan, request)

    # --- actions (raise ActionError with a showable message) ----------------------------------

    async def _act(self, reading: Reading[T]) -> T:
        if not reading.ok or reading.value is None:
            raise ActionError(reading.error or f"{reading.service} returned nothing")
        return reading.value

    async def set_policy(self, name: str) -> allocator_pb2.SetPolicyResponse:
        return await self._act(
            await self._rpc(
                "allocator", self.allocator.SetPolicy, allocator_pb2.SetPolicyRequest(name=name)
            )
        )

    async def submit_intent(self, intent: intent_pb2.ResourceIntent) -> Any:
        return await self._act(
            await self._rpc(
                "allocator",
                self.allocator.SubmitIntent,
                allocator_pb2.SubmitIntentRequest(intent=intent),
            )
        )

    async def inject_disturbance(
        self, *, cpu: float, gpu: float, network: float, duration_s: float, source: str
    ) -> nodeagent_pb2.InjectDisturbanceResponse:
        request = nodeagent_pb2.InjectDisturbanceRequest(
            disturbance=telemetry_pb2.Disturbance(
                cpu_pressure=cpu,
                gpu_pressure=gpu,
                network_pressure=network,
                duration_s=duration_s,
                source=source,
            )
        )
        return await self._act(
            await self._rpc("nodeagent", self.nodeagent.InjectDisturbance, request)
        )

    async def bridge_post(self, path: str, body: dict[str, Any]) -> Any:
        return await self._act(await self._http("bridge", "POST", path, body))

    async def bridge_delete(self, path: str) -> Any:
        return await self._act(await self._http("bridge", "DELETE", path))
