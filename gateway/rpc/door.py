"""The gRPC door's work, protocol-neutral (gateway.rpc.service speaks the protocol): the
same rules as ``/v2``, from the same code.

Every call goes through the one caller pipeline before anything of its request is read
(gateway.serving.caller: the request id from ``x-request-id``, the API key from
``authorization: Bearer ...`` or ``x-api-key``, the tenant, rate and request quota), runs
in a server span continuing the caller's ``traceparent`` (with ``tracing.trust_inbound``),
and leaves one outcome (gateway.observe.outcome: ``gateway_requests_total``, the latency
and body histograms and an access-log line, with ``route`` the RPC, ``method`` ``GRPC``,
``status`` the HTTP status of the outcome, 499 for a client that went away, and ``model``
an exposed name only). The answer carries the request id (``x-request-id``) and the
caller's rate and quota standing in its metadata. ``ModelInfer`` goes through
Dispatcher.infer_request as ``/v2`` does (signature, caps, the kind's checks, TOP_K, image
quotas, pins, admission, breaker, the prediction metrics, drift and the prediction log),
under the client's deadline (``grpc-timeout``) when it is shorter than the gateway's own.

A message of any method is read only once its caller is known (a model-scoped one, at
most :data:`SMALL_MESSAGE_BYTES`, into room for what gRPC may hand over). A ``ModelInfer``
message is read only once the body budget it shares with HTTP (gateway.serving.budget)
has room for the largest message the door takes:
the reservation waits at most ``server.queue_seconds`` (then RESOURCE_EXHAUSTED, unread),
the read at most ``server.body_timeout_seconds``; once read, the call keeps what its
message and its conversion hold (:data:`MESSAGE_COPIES` times its size) until it ends.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from gateway import __version__
from gateway.errors import (
    ControlNotServedError,
    GatewayError,
    InvalidInputError,
    NotServedError,
    RequestTimeoutError,
    TritonTimeoutError,
    UnknownModelError,
)
from gateway.observe.metrics import GatewayMetrics
from gateway.observe.outcome import CLIENT_GONE
from gateway.observe.tracing import Tracing
from gateway.serving.budget import BodyBudget, Reservation
from gateway.serving.call import Call, bind
from gateway.serving.caller import Caller, CallerGate
from gateway.serving.dispatch import Dispatcher
from gateway.serving.exposure import Exposure
from gateway.serving.oip import EXTENSIONS, GATEWAY_NAME, SERVER_NAME
from gateway.serving.oipcall import OipAnswer, OipBody, OipCalls
from gateway.serving.readiness import Readiness
from gateway.serving.refusal import UnreadBody
from gateway.serving.scope import CallScope
from gateway.settings import Settings
from gateway.triton.backend import InferenceBackend
from gateway.triton.tensors import Tensor

logger = logging.getLogger("gateway.grpc")
T = TypeVar("T")
SERVICE = "/inference.GRPCInferenceService/"
# What a ModelInfer message costs the process while it is read and checked, in multiples
# of its size (measured: one 40 MiB call raised the RSS by 160 MiB): gRPC's buffer and the
# bytes it hands over, the tensors joined out of them (gateway.triton.wire keeps protobuf
# from copying them once more) and the elements decoded from those.
MESSAGE_COPIES = 4
# ... of which reading it holds two: gRPC's buffer and the bytes it hands over. That much
# is reserved before the read; the rest once the message is in (Reservation.grow).
READ_COPIES = 2
# The largest message of a method other than the inferences: each names a model and a
# version at most (tens of bytes). Read only once the caller is known, into room reserved
# for what gRPC may hand over, and refused before it is parsed when larger.
SMALL_MESSAGE_BYTES = 64 * 1024

Metadata = Sequence[tuple[str, str | bytes]]


@dataclass(frozen=True)
class ModelRef:
    """What a model-scoped message (metadata, config, readiness, statistics) names; read
    only when the door asks, once the caller is known."""

    name: str
    version: str


# A model-scoped call's message, read when the door asks.
ReadRef = Callable[[], Awaitable[ModelRef]]


@dataclass(frozen=True)
class Received:
    """An inference's message as it came: its size, and its parse (run once the room
    parsing it holds is reserved)."""

    size: int
    parse: Callable[[], InferMessage]


@dataclass(frozen=True)
class InferMessage:
    """A ModelInfer request as read: where it goes, and its tensors in ``/v2``'s binary
    form (the JSON-shaped header and the tensors' bytes); ``size`` is the message's."""

    name: str
    version: str
    request_id: str
    header: dict[str, Any]
    binary: bytes | memoryview
    size: int


# The message, the model and version that answered, and the outputs.
Answered = tuple[InferMessage, str, str, list[Tensor]]


@dataclass
class Rpc:
    """One RPC as the door sees it: the caller's metadata, and the metadata its answer
    (or refusal) carries back (the request id, the rate and quota standing)."""

    metadata: Metadata
    answer: dict[str, str] = field(default_factory=dict)
    certified: str | None = None  # the name of the client's verified TLS certificate
    # the HTTP/2 connection it came on (gRPC's peer, "ipv4:host:port"), read when asked:
    # only a refusal from the metadata needs it
    peer: Callable[[], str] | None = None


class Door(Protocol):
    """What the gRPC door does, protocol-neutral. Every call authenticates its metadata and
    raises GatewayError for what it refuses."""

    async def server_live(self, rpc: Rpc) -> bool: ...

    async def server_ready(self, rpc: Rpc) -> bool: ...

    async def model_ready(self, rpc: Rpc, read: ReadRef) -> bool: ...

    async def server_metadata(self, rpc: Rpc) -> tuple[str, str, list[str]]: ...

    async def model_metadata(self, rpc: Rpc, read: ReadRef) -> dict[str, Any]: ...

    async def model_config(self, rpc: Rpc, read: ReadRef) -> dict[str, Any]: ...

    async def model_statistics(self, rpc: Rpc, read: ReadRef) -> dict[str, Any]: ...

    async def not_served(self, rpc: Rpc, method: str, detail: str) -> None: ...

    async def readiness(self) -> bool:
        """Ready to serve (no key: what the health service reports)."""
        ...

    async def infer(
        self, rpc: Rpc, read: Callable[[], Awaitable[Received]], deadline: float | None
    ) -> Answered:
        """The message (``read`` once the caller is known and room is reserved), the model
        and version that answered (a rollout's canary may), and the outputs."""
        ...

    async def stream(
        self,
        rpc: Rpc,
        read: Callable[[], Awaitable[Received | None]],
        write: Callable[[Answered | GatewayError], Awaitable[None]],
        deadline: Callable[[], float | None],
    ) -> None:
        """A stream of inferences, each answered (or refused) in order on ``write``."""
        ...


def _headers(metadata: Metadata) -> list[tuple[bytes, bytes]]:
    """gRPC metadata as HTTP-style header pairs (binary ``-bin`` values left out)."""
    return [
        (key.lower().encode("latin-1"), value.encode("latin-1"))
        for key, value in metadata
        if isinstance(value, str) and not key.endswith("-bin")
    ]


class InferenceDoor:
    """Built by the runtime when ``GATEWAY_GRPC__PORT`` is set."""

    def __init__(
        self,
        settings: Settings,
        dispatcher: Dispatcher,
        exposure: Exposure,
        backend: InferenceBackend,
        metrics: GatewayMetrics,
        tracing: Tracing,
        gate: CallerGate,
        budget: BodyBudget,
        readiness: Readiness,
        oip_calls: OipCalls,
    ) -> None:
        self.settings = settings
        self.dispatcher = dispatcher
        self.exposure = exposure
        self.backend = backend
        self.metrics = metrics
        self.tracing = tracing
        self.gate = gate
        self.budget = budget
        self._readiness = readiness
        self.oip_calls = oip_calls
        # the largest OIP request the gateway takes (and its answer), no larger than one
        # call reading and checking it can hold within the body budget
        self.max_message_bytes = min(
            settings.max_json_body_bytes + 1024 * 1024,
            settings.server.max_body_bytes_in_flight // MESSAGE_COPIES,
        )

    def _rpc(self, name: str, rpc: Rpc, model: str = "", admit: bool = True) -> _Scope:
        """One RPC: its caller admitted (``admit`` False: its key checked, no rate or quota
        taken: a stream's opening), traced, its outcome recorded; its GatewayError
        propagates (the servicer maps it to a status code)."""
        return _Scope(self, name, rpc, model, admit)

    def _label(self, model: str) -> str:
        """A catalogued or allow-listed name only (looked up, not a set built per call)."""
        if not model:
            return ""
        known = self.exposure.catalog.find(model) is not None or self.exposure.non_classifier(model)
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
        return await self._readiness.ready()

    async def server_live(self, rpc: Rpc) -> bool:
        async with self._rpc("ServerLive", rpc):
            return await self._readiness.live()

    async def server_ready(self, rpc: Rpc) -> bool:
        async with self._rpc("ServerReady", rpc):
            return await self._readiness.ready()

    async def _ref(self, read: ReadRef, call: Call) -> ModelRef:
        """A model-scoped message, read once its caller is known (the scope admitted it)
        into room reserved for the largest message gRPC hands over (the reader refuses one
        over :data:`SMALL_MESSAGE_BYTES` before parsing it), under the request head's
        deadline: it is a head's size, so a client that opens the call and sends nothing
        (or trickles) holds it no longer than a request head; the model names the outcome."""
        server = self.settings.server
        ref, reservation = await self._receive(
            read, call, copies=1, seconds=min(server.header_timeout_seconds, server.body_timeout_seconds)
        )
        reservation.release()
        call.labels["model"] = self._label(ref.name)
        return ref

    async def model_ready(self, rpc: Rpc, read: ReadRef) -> bool:
        """As Triton answers: a model it does not know is not ready (no error)."""
        async with self._rpc("ModelReady", rpc) as call:
            ref = await self._ref(read, call)
            try:
                return await self.exposure.model_ready(ref.name, ref.version, call.caller)
            except UnknownModelError:
                return False

    async def server_metadata(self, rpc: Rpc) -> tuple[str, str, list[str]]:
        async with self._rpc("ServerMetadata", rpc):
            rpc.answer["server"] = f"{GATEWAY_NAME}/{__version__}"
            triton = await self.backend.server_status()
            return SERVER_NAME, triton.version or "", list(EXTENSIONS)

    async def model_metadata(self, rpc: Rpc, read: ReadRef) -> dict[str, Any]:
        async with self._rpc("ModelMetadata", rpc) as call:
            ref = await self._ref(read, call)
            self.exposure.target(ref.name, ref.version, caller=call.caller)  # 404 for a model not exposed
            return (await self.backend.model_signature(ref.name, ref.version)).as_json()

    async def model_config(self, rpc: Rpc, read: ReadRef) -> dict[str, Any]:
        async with self._rpc("ModelConfig", rpc) as call:
            ref = await self._ref(read, call)
            return await self.exposure.configuration(ref.name, ref.version, call.caller)

    async def model_statistics(self, rpc: Rpc, read: ReadRef) -> dict[str, Any]:
        async with self._rpc("ModelStatistics", rpc) as call:
            ref = await self._ref(read, call)
            return await self.exposure.statistics(ref.name or None, ref.version, call.caller)

    async def not_served(self, rpc: Rpc, method: str, detail: str) -> None:
        """A method of Triton's service the gateway does not serve: refused, counted (the
        repository's as a permission the door does not give: model control is /admin's)."""
        async with self._rpc(method, rpc):
            raise (ControlNotServedError if method.startswith("Repository") else NotServedError)(detail)

    async def _receive(
        self, read: Callable[[], Awaitable[T]], call: Call, copies: int, seconds: float | None = None
    ) -> tuple[T, Reservation]:
        """What ``read`` gives, read into room reserved in the caller's name for what
        reading the largest message gRPC may hand over holds (``copies`` of it, at most
        :data:`READ_COPIES`) before the read: a call that sends nothing holds no more than
        that, and a caller no more than its share (gateway.serving.budget). The message
        arrives within ``seconds`` (default ``server.body_timeout_seconds``) or the call is
        refused. The caller releases the reservation."""
        reservation = Reservation(self.budget, None if call.caller is None else call.caller.client)
        try:
            await reservation.reserve(
                min(copies, READ_COPIES) * self.max_message_bytes, self.settings.server.queue_seconds
            )
            try:
                async with asyncio.timeout(seconds or self.settings.server.body_timeout_seconds):
                    return await read(), reservation
            except TimeoutError:
                raise RequestTimeoutError("the message did not arrive in time") from None
        except BaseException:
            reservation.release()
            raise

    async def _read(
        self, read: Callable[[], Awaitable[Received | None]], call: Call
    ) -> tuple[InferMessage | None, Reservation]:
        """An inference's message (None: a stream's end), received (:meth:`_receive`),
        then parsed once the room grew to what it holds read and converted
        (:data:`MESSAGE_COPIES` times its size)."""
        received, reservation = await self._receive(read, call, MESSAGE_COPIES)
        try:
            if received is None:
                reservation.settle(0)
                return None, reservation
            need = MESSAGE_COPIES * received.size
            await reservation.grow(need, self.settings.server.queue_seconds)
            reservation.settle(need)
            return received.parse(), reservation
        except BaseException:
            reservation.release()
            raise

    async def infer(
        self, rpc: Rpc, read: Callable[[], Awaitable[Received]], deadline: float | None
    ) -> Answered:
        """The message, the model and version that answered (a rollout's canary may), and
        the outputs. The caller is known, and refused, before a byte of the message is read."""
        held: list[Reservation] = []
        try:
            async with self._rpc("ModelInfer", rpc) as call:
                # refused from its metadata, unread, as HTTP refuses from the headers, and
                # held as HTTP holds a refusal (gateway.serving.retries), keyed by the call's
                # HTTP/2 connection: a channel multiplexes its calls on one, so its
                # concurrent calls are a streak too; never past half the call's deadline
                # (the client hears UNAVAILABLE, not DEADLINE_EXCEEDED)
                peer = rpc.peer
                unread = UnreadBody(
                    small=True, connection_of=None if peer is None else lambda: ("grpc", peer())
                )
                messages: list[InferMessage] = []

                async def read_message() -> OipBody:
                    message, reservation = await self._read(read, call)
                    held.append(reservation)
                    assert message is not None  # a unary call's read raises instead
                    messages.append(message)
                    return self._body(call, message)

                done = await self._bounded(
                    self.oip_calls.infer(
                        call,
                        SERVICE + "ModelInfer",
                        unread,
                        read_message,
                        hold_at_most=None if deadline is None else deadline / 2,
                    ),
                    deadline,
                )
                return self._answered(messages[0], done)
        finally:
            for reservation in held:
                reservation.release()

    @staticmethod
    def _body(call: Call, message: InferMessage) -> OipBody:
        call.labels["body_bytes"] = message.size
        return OipBody(message.header, message.binary, len(message.binary), message.name, message.version)

    @classmethod
    def _already_read(cls, call: Call, message: InferMessage) -> Callable[[], Awaitable[OipBody]]:
        async def read() -> OipBody:
            return cls._body(call, message)

        return read

    @staticmethod
    def _answered(message: InferMessage, done: OipAnswer) -> Answered:
        outputs = list(done.result.outputs.values())
        return message, done.served.name, done.result.model_version, outputs

    async def stream(
        self,
        rpc: Rpc,
        read: Callable[[], Awaitable[Received | None]],
        write: Callable[[Answered | GatewayError], Awaitable[None]],
        deadline: Callable[[], float | None],
    ) -> None:
        """``ModelStreamInfer``: each message an inference under ``ModelInfer``'s rules,
        answered in order, a refused message with its error while the stream goes on, as
        Triton's does. Each message is admitted (its rate and quota) before it is read,
        and read into room reserved in the budget: a message refused from its caller ends
        the stream with that refusal (RESOURCE_EXHAUSTED and ``retry-after`` past its rate)
        and nothing more of it is read; so does a spent body budget or a message that does
        not arrive in time. The key is checked when the stream opens (401 ends it)."""
        async with self._rpc("ModelStreamInfer", rpc, admit=False):
            pass  # the stream's opening: counted once, as each of its messages is
        while True:
            each = Rpc(rpc.metadata, certified=rpc.certified)
            scope = self._rpc("ModelStreamInfer", each)
            held: list[Reservation] = []
            try:
                async with scope as call:  # admitted before its message is read
                    message, reservation = await self._read(read, call)
                    held.append(reservation)
                    if message is None:  # the stream's end: no call, its admission unused
                        scope.recorded = True
                        return
                    # the sequence ModelInfer and /v2 share (the refusal from the one rule
                    # included: no hold, the stream's connection is not a retry's)
                    done = await self._bounded(
                        self.oip_calls.infer(
                            call,
                            SERVICE + "ModelStreamInfer",
                            UnreadBody(small=True),
                            self._already_read(call, message),  # read: its end was to be seen
                        ),
                        deadline(),
                    )
                    answered = self._answered(message, done)
            except InvalidInputError as error:  # not a ModelInferRequest, or refused by the checks
                await write(error)
            except GatewayError as error:
                if not held:  # refused before its message was read: nothing more is read
                    raise
                await write(error)  # refused once read: answered, the stream goes on
            else:
                await write(answered)
            finally:
                for reservation in held:
                    reservation.release()


class _Scope:
    """What :meth:`InferenceDoor._rpc` opens and closes around a call: the call scope both
    doors share (gateway.serving.scope) and what is the gRPC door's own, its caller
    admitted from the metadata and its refusal's status (a class: the generator a
    context-manager decorator makes cost the door's every call a few us)."""

    __slots__ = ("admit", "call", "door", "model", "name", "opened", "recorded", "rpc")

    def __init__(self, door: InferenceDoor, name: str, rpc: Rpc, model: str, admit: bool) -> None:
        self.door, self.name, self.rpc, self.model, self.admit = door, name, rpc, model, admit
        self.recorded = False  # True: no outcome of its own (a stream's end)

    async def __aenter__(self) -> Call:
        door, rpc = self.door, self.rpc
        headers = _headers(rpc.metadata)
        opened = self.opened = CallScope(door.metrics, door.tracing, "GRPC", SERVICE + self.name, headers)
        rpc.answer["x-request-id"] = opened.request_id
        call = self.call = Call(opened.request_id, opened.started, labels={"model": door._label(self.model)})
        try:
            caller = (
                await door.gate.admit(opened.request_id, headers, rpc.certified)
                if self.admit
                else Caller(opened.request_id, await door.gate.identify(headers, rpc.certified))
            )
        except BaseException as error:
            self._close(error)
            raise
        rpc.answer.update({k.lower(): v for k, v in caller.limits.items()})
        return bind(call, caller, headers)  # as the HTTP door binds its requests

    async def __aexit__(self, kind: Any, error: BaseException | None, traceback: Any) -> None:
        self._close(error)

    def _close(self, error: BaseException | None) -> None:
        """The outcome: 200, the refusal's status, 499 for a caller gone, 500 for a bug
        (never a success)."""
        door, call, opened = self.door, self.call, self.opened
        if self.recorded:
            opened.close_unrecorded()
            return
        if error is None:
            status = 200
        elif isinstance(error, asyncio.CancelledError):
            status = CLIENT_GONE
        elif isinstance(error, GatewayError):
            status = error.status
            door.metrics.rejections.labels(error.slug).inc()
            if status >= 500:
                logger.warning("gRPC %s failed: %s (%s)", self.name, error.slug, error.detail)
        else:
            status = 500
        try:
            if call.caller is not None and call.caller.quota:
                self.rpc.answer.update({k.lower(): v for k, v in call.caller.standing().items()})
        finally:
            labels = call.labels
            opened.close(opened.path, status, labels["model"], labels.get("body_bytes", 0), error)
