"""The gRPC door's work, protocol-neutral (gateway.triton.frontdoor speaks the protocol):
the same rules as ``/v2``, from the same code.

Every call: the API key from the metadata (``authorization: Bearer ...`` or ``x-api-key``,
as on HTTP) and its rate limit; a server span continuing the caller's ``traceparent``
(with ``tracing.trust_inbound``); ``gateway_requests_total`` and the latency histogram with
``route`` the RPC (``/inference.GRPCInferenceService/ModelInfer``), ``method`` ``GRPC``,
``status`` the HTTP status of the outcome and ``model`` an exposed name only. ``ModelInfer``
goes through Dispatcher.infer_request as ``/v2`` does (signature, caps, the kind's checks,
TOP_K, pins, admission, breaker, the prediction metrics and drift), under the client's
deadline (``grpc-timeout``) when it is shorter than the gateway's own.

A ``ModelInfer`` message is read only once its caller is known and the body budget it
shares with HTTP (gateway.serving.budget) has room for the largest message the door takes:
the reservation waits at most ``server.queue_seconds`` (then RESOURCE_EXHAUSTED, unread),
the read at most ``server.body_timeout_seconds``; once read, the call keeps what its
message and its conversion hold (:data:`MESSAGE_COPIES` times its size) until it ends.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from time import perf_counter
from typing import Any, TypeVar

from gateway import __version__
from gateway.errors import (
    GatewayError,
    RateLimitedError,
    RequestTimeoutError,
    TritonTimeoutError,
    UnauthorizedError,
)
from gateway.observe.metrics import GatewayMetrics
from gateway.observe.tracing import Tracing, describe_server_span
from gateway.serving.admission import tenant_of
from gateway.serving.budget import BodyBudget, Reservation
from gateway.serving.dispatch import Call, Dispatcher
from gateway.serving.oip import EXTENSIONS
from gateway.settings import Settings
from gateway.shared.keyfiles import ApiKey, KeyRing, find_key
from gateway.shared.ratelimit import RateLimiter
from gateway.triton.backend import InferenceBackend
from gateway.triton.frontdoor import InferMessage, Metadata
from gateway.triton.tensors import Tensor

logger = logging.getLogger("gateway.grpc")
T = TypeVar("T")
SERVICE = "/inference.GRPCInferenceService/"
# What a ModelInfer message costs the process while it is read and checked, in multiples
# of its size (measured: one 40 MiB call raised the RSS by 160 MiB): gRPC's buffer and the
# bytes it hands over, the tensors joined out of them (gateway.triton.wire keeps protobuf
# from copying them once more) and the elements decoded from those.
MESSAGE_COPIES = 4


def _headers(metadata: Metadata) -> list[tuple[bytes, bytes]]:
    """gRPC metadata as HTTP-style header pairs (binary ``-bin`` values left out)."""
    return [
        (key.lower().encode("latin-1"), value.encode("latin-1"))
        for key, value in metadata
        if isinstance(value, str) and not key.endswith("-bin")
    ]


class InferenceDoor:
    """Built by the app's lifespan when ``GATEWAY_GRPC__PORT`` is set."""

    def __init__(
        self,
        settings: Settings,
        dispatcher: Dispatcher,
        backend: InferenceBackend,
        metrics: GatewayMetrics,
        tracing: Tracing,
        keys: KeyRing | None,
        limiter: RateLimiter,
        budget: BodyBudget,
    ) -> None:
        self.settings = settings
        self.dispatcher = dispatcher
        self.backend = backend
        self.metrics = metrics
        self.tracing = tracing
        self.keys = keys
        self.limiter = limiter
        self.budget = budget
        # the largest OIP request the gateway takes (and its answer), no larger than one
        # call reading and checking it can hold within the body budget
        self.max_message_bytes = min(
            settings.max_json_body_bytes + 1024 * 1024,
            settings.server.max_body_bytes_in_flight // MESSAGE_COPIES,
        )

    async def _authorize(self, headers: list[tuple[bytes, bytes]]) -> ApiKey | None:
        """The key (None: keys are off), or the refusal."""
        if self.keys is None:
            return None
        key = find_key(self.keys.keys, headers)
        if key is None:
            raise UnauthorizedError("an API key is required: authorization: Bearer <key>, or x-api-key")
        verdict = await self.limiter.check(key)
        if verdict is not None and verdict.wait:
            self.metrics.client_requests.labels(client=key.id, outcome="rate_limited").inc()
            raise RateLimitedError(
                f"the rate for this key is {verdict.rate:g} requests a second", retry_after=verdict.wait
            )
        quotas = self.dispatcher.quotas
        if key.quotas and quotas is not None:
            await quotas.charge(key, "requests", 1)  # 429 quota-exceeded once spent
        self.metrics.client_requests.labels(client=key.id, outcome="allowed").inc()
        return key

    @asynccontextmanager
    async def _rpc(self, rpc: str, metadata: Metadata, model: str = "") -> AsyncIterator[Call]:
        """One RPC: authenticated, traced, counted; its GatewayError propagates (the
        servicer maps it to a status code)."""
        route = SERVICE + rpc
        headers = _headers(metadata)
        started = perf_counter()
        status = 500  # until it ends otherwise: a bug is not a success
        labels: dict[str, str] = {"model": self._label(model)}
        with self.tracing.server_span("GRPC", route, headers) as span:
            try:
                key = await self._authorize(headers)
                if key is None:
                    yield Call(uuid.uuid4().hex, started, labels=labels)
                else:
                    tenant = tenant_of(key, self.settings.tiers)
                    yield Call(uuid.uuid4().hex, started, key.id, tenant=tenant, labels=labels)
                status = 200
            except asyncio.CancelledError:
                status = 499  # the client went away (nginx's code, as on HTTP)
                raise
            except GatewayError as error:
                status = error.status
                self.metrics.rejections.labels(reason=error.slug).inc()
                if status >= 500:
                    logger.warning("gRPC %s failed: %s (%s)", rpc, error.slug, error.detail)
                raise
            finally:
                label = labels["model"]
                describe_server_span(span, "GRPC", route, status)
                self.metrics.child(self.metrics.requests, route, "GRPC", str(status), label).inc()
                self.metrics.child(self.metrics.request_duration, route, "GRPC", label).observe(
                    perf_counter() - started
                )

    def _label(self, model: str) -> str:
        """A catalogued or allow-listed name only (looked up, not a set built per call)."""
        known = self.dispatcher.catalog.find(model) is not None or model in self.dispatcher.v2_models
        return model if known else ""

    async def _bounded(self, work: Awaitable[T], deadline: float | None) -> T:
        """``work`` under the client's deadline (the gateway's own apply inside it)."""
        if deadline is None:
            return await work
        try:
            async with asyncio.timeout(max(deadline, 0.0)):
                return await work
        except TimeoutError:
            raise TritonTimeoutError("the call's deadline passed") from None

    async def readiness(self) -> bool:
        return await self.dispatcher.server_ready()

    async def server_live(self, metadata: Metadata) -> bool:
        async with self._rpc("ServerLive", metadata):
            return await self.dispatcher.server_live()

    async def server_ready(self, metadata: Metadata) -> bool:
        async with self._rpc("ServerReady", metadata):
            return await self.dispatcher.server_ready()

    async def model_ready(self, metadata: Metadata, name: str, version: str) -> bool:
        async with self._rpc("ModelReady", metadata, name):
            return await self.dispatcher.model_ready(name, version)

    async def server_metadata(self, metadata: Metadata) -> tuple[str, str, list[str]]:
        async with self._rpc("ServerMetadata", metadata):
            return "triton-gateway", __version__, list(EXTENSIONS)

    async def model_metadata(self, metadata: Metadata, name: str, version: str) -> dict[str, Any]:
        async with self._rpc("ModelMetadata", metadata, name):
            self.dispatcher.oip_target(name, version)  # 404 for a model that is not exposed
            return (await self.backend.model_signature(name, version)).as_json()

    async def model_config(self, metadata: Metadata, name: str, version: str) -> dict[str, Any]:
        async with self._rpc("ModelConfig", metadata, name):
            return await self.dispatcher.configuration(name, version)

    async def model_statistics(self, metadata: Metadata, name: str, version: str) -> dict[str, Any]:
        async with self._rpc("ModelStatistics", metadata, name):
            return await self.dispatcher.statistics(name or None, version)

    async def _read(
        self, read: Callable[[], Awaitable[InferMessage]], reservation: Reservation
    ) -> InferMessage:
        """The call's message, read into room reserved for the largest one."""
        await reservation.reserve(MESSAGE_COPIES * self.max_message_bytes, self.settings.server.queue_seconds)
        try:
            async with asyncio.timeout(self.settings.server.body_timeout_seconds):
                message = await read()
        except TimeoutError:
            raise RequestTimeoutError("the message did not arrive in time") from None
        reservation.settle(MESSAGE_COPIES * message.size)
        return message

    async def infer(
        self,
        metadata: Metadata,
        read: Callable[[], Awaitable[InferMessage]],
        deadline: float | None,
    ) -> tuple[InferMessage, str, str, list[Tensor]]:
        """The message, the model and version that answered (a rollout's canary may), and
        the outputs. The caller is known, and refused, before a byte of the message is read."""
        reservation = Reservation(self.budget)
        try:
            async with self._rpc("ModelInfer", metadata) as call:

                async def work() -> tuple[InferMessage, str, str, list[Tensor]]:
                    message = await self._read(read, reservation)
                    call.model = self._label(message.name) or None
                    target = self.dispatcher.oip_target(
                        message.name, message.version
                    )  # the pin applies to an unversioned call
                    _, answer, served = await self.dispatcher.infer_request(
                        target, message.header, message.binary, len(message.binary), call, self.settings
                    )
                    return message, served.name, answer.model_version, list(answer.outputs.values())

                return await self._bounded(work(), deadline)
        finally:
            reservation.release()
