"""Triton's gRPC protocol served by the gateway (KServe v2 ``GRPCInferenceService``): the
servicer that turns each call into the door's protocol-neutral call (gateway.rpc.door) and
its answer back into Triton's messages, and the server that runs it. With
gateway.triton.client (the client side), the one place ``grpc`` and Triton's protos are used.

- ``ModelInfer``'s tensors are handed over as ``/v2`` hands them over: a JSON-shaped header
  (names, datatypes, shapes, parameters) and the binary tensors, so one parser checks both
  doors' requests. ``raw_input_contents`` is taken as sent; typed ``contents`` are turned
  into the same wire bytes first.
- Errors: the gateway's error's HTTP status decides the gRPC code (:data:`STATUS_CODES`),
  unless the error names Triton's own (``rpc_code``); the message is the problem's detail;
  ``retry-after`` (seconds) goes in the trailing metadata of UNAVAILABLE and
  RESOURCE_EXHAUSTED, with the request id and the rate standing.
- An answer's trailing metadata carries ``x-request-id`` and the caller's rate standing.
- Every method is registered from the service's descriptor with its raw message
  (:func:`_handlers`): gRPC reads nothing before the door asks, once the caller is known;
  a method that names nothing (``ServerLive``) never reads its message, a model-scoped
  one reads at most :data:`SMALL_MESSAGE_BYTES` under the body budget.
- What the gateway does not serve is refused, counted and logged as any refusal, with a
  message that says so: the repository RPCs are PERMISSION_DENIED (model control is the
  admin surface's); shared memory, trace and log settings are UNIMPLEMENTED.
- The gRPC health protocol (``grpc.health.v1.Health``, what Kubernetes' gRPC probes call):
  SERVING while the door's readiness holds (``/v2``'s: every default and allow-listed model
  ready), NOT_SERVING otherwise, read again every ``health_seconds``; unauthenticated, as the
  HTTP probes are; the message, which anyone may send, is never read (:class:`DoorHealth`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
import numpy as np
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc

from gateway.errors import GatewayError, InvalidInputError, PayloadTooLargeError, quoted
from gateway.periodic import Periodic
from gateway.rpc.door import (
    SMALL_MESSAGE_BYTES,
    Answered,
    Door,
    InferMessage,
    ModelRef,
    ReadRef,
    Received,
    Rpc,
)
from gateway.serving.oip import (
    NOT_SERVED_CONTROL,
    NOT_SERVED_SETTINGS,
    NOT_SERVED_SHARED_MEMORY,
)
from gateway.shared.certificates import XFCC, TrustedProxies, grpc_peer_address, verified_name
from gateway.triton.tensors import DTYPES, Tensor, encode_bytes
from gateway.triton.wire import (
    RAW_OUTPUT_TAG,
    STREAM_INFER_RESPONSE_TAG,
    WireError,
    append_field,
    split_raw_inputs,
)

logger = logging.getLogger("gateway.grpc")
SERVICE_NAME = "inference.GRPCInferenceService"
# How long a call whose stream ended with no message waits for its cancellation.
EOF_GRACE_SECONDS = 0.1
T = TypeVar("T")

# HTTP status of the gateway's error -> gRPC code (the closest meaning).
STATUS_CODES: dict[int, grpc.StatusCode] = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    405: grpc.StatusCode.UNIMPLEMENTED,
    408: grpc.StatusCode.DEADLINE_EXCEEDED,
    409: grpc.StatusCode.FAILED_PRECONDITION,
    413: grpc.StatusCode.INVALID_ARGUMENT,  # a cap of the gateway's, not a retryable shortage
    415: grpc.StatusCode.INVALID_ARGUMENT,
    422: grpc.StatusCode.INVALID_ARGUMENT,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    431: grpc.StatusCode.INVALID_ARGUMENT,  # (HTTP only: gRPC metadata has its own cap)
    500: grpc.StatusCode.INTERNAL,
    502: grpc.StatusCode.INTERNAL,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}


def grpc_code(error: GatewayError) -> grpc.StatusCode:
    """The gRPC code of a refusal: the one it names (a spent body budget is a resource
    exhausted, as the door's own call cap answers; a version that is not a number is
    Triton's invalid argument), else by its HTTP status."""
    if error.rpc_code is not None:
        return grpc.StatusCode[error.rpc_code]
    return STATUS_CODES.get(error.status, grpc.StatusCode.INTERNAL)


# Typed contents fields by datatype (FP16 and BF16 have none: raw only).
_CONTENTS = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
}


def _parameter(value: Any) -> Any:
    kind = value.WhichOneof("parameter_choice")
    return None if kind is None else getattr(value, kind)


def _parameters(parameters: Any) -> dict[str, Any]:
    return {key: _parameter(value) for key, value in parameters.items()}


def _contents(tensor: Any) -> bytes:
    """Typed ``contents`` as the wire bytes ``raw_input_contents`` would carry."""
    if tensor.datatype == "BYTES":
        return encode_bytes(list(tensor.contents.bytes_contents))
    field = _CONTENTS.get(tensor.datatype)
    if field is None:
        raise InvalidInputError(
            f"input {tensor.name!r}: {tensor.datatype} is sent in raw_input_contents only"
        )
    values = getattr(tensor.contents, field)
    return np.asarray(values, dtype=np.dtype(DTYPES[tensor.datatype]).newbyteorder("<")).tobytes()


def request_header(
    request: Any, raw: Sequence[bytes | memoryview]
) -> tuple[dict[str, Any], bytes | memoryview]:
    """A ModelInferRequest as ``/v2``'s binary form: the JSON-shaped header and the tensors
    (``raw``: its raw input contents, taken out of the message on the wire)."""
    if raw:
        for tensor in request.inputs:
            if tensor.HasField("contents"):  # Triton's text, which its clients read
                raise InvalidInputError(
                    f"contents field must not be specified when using raw_input_contents for "
                    f"{quoted(tensor.name)} for model {quoted(request.model_name)}"
                )
        if len(raw) != len(request.inputs):
            raise InvalidInputError("raw_input_contents must hold one entry per input")
    inputs: list[dict[str, Any]] = []
    chunks: list[bytes | memoryview] = []
    for index, tensor in enumerate(request.inputs):
        data = raw[index] if raw else _contents(tensor)
        parameters = _parameters(tensor.parameters)
        parameters["binary_data_size"] = len(data)
        inputs.append(
            {
                "name": tensor.name,
                "datatype": tensor.datatype,
                "shape": list(tensor.shape),
                "parameters": parameters,
            }
        )
        chunks.append(data)
    header: dict[str, Any] = {"inputs": inputs}
    if request.id:
        header["id"] = request.id
    parameters = _parameters(request.parameters)
    # perf_analyzer sends it on every gRPC call; it concerns decoupled models' streams,
    # which the door does not serve (Triton ignores it for the others): not passed on.
    parameters.pop("triton_enable_empty_final_response", None)
    if parameters:
        header["parameters"] = parameters
    if request.outputs:
        header["outputs"] = [
            {
                "name": output.name,
                **({"parameters": _parameters(output.parameters)} if output.parameters else {}),
            }
            for output in request.outputs
        ]
    # one tensor (the usual call): a view into the message, not a copy of it
    return header, chunks[0] if len(chunks) == 1 else b"".join(chunks)


def infer_message(raw: bytes) -> InferMessage:
    """A ModelInferRequest off the wire, its raw contents as views (protobuf would copy
    each): read, the message costs itself and the tensors joined once (MESSAGE_COPIES)."""
    try:
        rest, contents = split_raw_inputs(raw)
        request = service_pb2.ModelInferRequest.FromString(rest)
    except (DecodeError, WireError):
        raise InvalidInputError("the message is not a ModelInferRequest") from None
    header, binary = request_header(request, contents)
    return InferMessage(request.model_name, request.model_version, request.id, header, binary, len(raw))


def infer_response(name: str, version: str, request_id: str, outputs: Sequence[Tensor]) -> bytes:
    """A serialised ModelInferResponse. Protobuf builds everything but the raw contents;
    those are appended on the wire (field 6, one entry per output, in order), as Triton
    sent them when passed through unchanged (Tensor.wire): not copied into a message and
    out of it again (tests/unit/test_grpc_wire_answer.py holds it against protobuf's own)."""
    response = service_pb2.ModelInferResponse(model_name=name, model_version=version, id=request_id)
    pieces: list[bytes | memoryview] = []
    for tensor in outputs:
        entry = response.outputs.add()
        entry.name, entry.datatype = tensor.name, tensor.datatype
        entry.shape.extend(tensor.shape)
        append_field(pieces, RAW_OUTPUT_TAG, tensor.raw_parts())
    return b"".join([response.SerializeToString(), *pieces])


def stream_response(answer: bytes) -> bytes:
    """A serialised ModelStreamInferResponse carrying a serialised ModelInferResponse."""
    pieces: list[bytes | memoryview] = []
    append_field(pieces, STREAM_INFER_RESPONSE_TAG, [answer])
    return b"".join(pieces)


class InferenceService(service_pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    """The servicer: each RPC to the door, its refusals to gRPC status codes."""

    def __init__(self, door: Door, certifies: bool = False, proxies: TrustedProxies | None = None) -> None:
        self._door = door
        # clients present certificates only over TLS with a client CA: without one, the
        # call's auth context (a dict built per call) has no name to give
        self._certifies = certifies
        # a mesh proxy that terminated the client's mTLS forwards what it verified (XFCC),
        # believed from the proxies auth.trusted_proxies names, as on the HTTP door
        self._proxies = proxies if proxies else None

    async def _run(self, context: Any, work: Callable[[Rpc], Awaitable[T]]) -> T:
        """``work`` on the call's metadata, a refusal aborted with its code. What the door
        gives back (the request id, the rate standing) goes in the trailing metadata, with
        the status, on an answer as on a refusal: initial metadata would cost a send of
        its own on every call (about 0.1 ms of the door's CPU)."""
        rpc = Rpc(
            tuple((item.key, item.value) for item in context.invocation_metadata() or ()), peer=context.peer
        )
        try:
            if self._certifies:
                rpc.certified = certified_name(context.auth_context())
            if rpc.certified is None and self._proxies is not None:
                rpc.certified = self._proxies.certified(
                    grpc_peer_address(context.peer()),
                    (v.encode("latin-1") for k, v in rpc.metadata if k == XFCC and isinstance(v, str)),
                )
            result = await work(rpc)
        except GatewayError as error:
            code, detail = grpc_code(error), error.detail
            retry = error.headers.get("Retry-After")
            limits = {k.lower(): v for k, v in error.headers.items() if k.startswith("RateLimit")}
            # The frames a refusal was raised through hold the message they read, and the
            # context managers it crossed made cycles of them that only the garbage
            # collector frees: the memory goes now (64 calls of 40 MiB left 250 MiB each
            # round to a collection that came seconds later, if at all).
            error.__traceback__ = error.__context__ = error.__cause__ = None
        else:
            context.set_trailing_metadata(tuple(rpc.answer.items()))
            return result
        # Aborted outside the handler, so the abort's exception does not keep the refusal.
        trailing = {**rpc.answer, **limits}
        if retry and code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED):
            trailing["retry-after"] = retry
        context.set_trailing_metadata(tuple(trailing.items()))
        # 5xx details are generic (the problem's detail never quotes Triton)
        await context.abort(code, detail)
        raise AssertionError("abort raises")  # for the type checker

    async def ServerLive(self, requests: Any, context: Any) -> Any:  # noqa: N802 (the RPC names)
        live = await self._run(context, self._door.server_live)
        return service_pb2.ServerLiveResponse(live=live)

    async def ServerReady(self, requests: Any, context: Any) -> Any:  # noqa: N802 (the RPC names)
        ready = await self._run(context, self._door.server_ready)
        return service_pb2.ServerReadyResponse(ready=ready)

    async def ModelReady(self, requests: Any, context: Any) -> Any:  # noqa: N802 (the RPC names)
        read = _model_ref(context, service_pb2.ModelReadyRequest)
        ready = await self._run(context, lambda rpc: self._door.model_ready(rpc, read))
        return service_pb2.ModelReadyResponse(ready=ready)

    async def ServerMetadata(self, requests: Any, context: Any) -> Any:  # noqa: N802 (the RPC names)
        name, version, extensions = await self._run(context, self._door.server_metadata)
        return service_pb2.ServerMetadataResponse(name=name, version=version, extensions=extensions)

    async def _model_document(
        self, context: Any, kind: Any, ask: Callable[[Rpc, ReadRef], Awaitable[Any]], message: Any
    ) -> Any:
        """A model's document (Triton's JSON, as the door gives it) as ``message``; the
        request (a ``kind``) read when the door asks."""
        read = _model_ref(context, kind)
        document = await self._run(context, lambda rpc: ask(rpc, read))
        return json_format.ParseDict(document, message, ignore_unknown_fields=True)

    async def ModelMetadata(self, requests: Any, context: Any) -> Any:  # noqa: N802 (the RPC names)
        return await self._model_document(
            context,
            service_pb2.ModelMetadataRequest,
            self._door.model_metadata,
            service_pb2.ModelMetadataResponse(),
        )

    async def ModelConfig(self, requests: Any, context: Any) -> Any:  # noqa: N802 (the RPC names)
        config = await self._model_document(
            context, service_pb2.ModelConfigRequest, self._door.model_config, model_config_pb2.ModelConfig()
        )
        return service_pb2.ModelConfigResponse(config=config)

    async def ModelStatistics(self, requests: Any, context: Any) -> Any:  # noqa: N802 (the RPC names)
        return await self._model_document(
            context,
            service_pb2.ModelStatisticsRequest,
            self._door.model_statistics,
            service_pb2.ModelStatisticsResponse(),
        )

    async def ModelInfer(self, requests: Any, context: Any) -> Any:  # noqa: N802 (the RPC names)
        """Registered as client-streaming (:func:`_handlers`), so the message is read here,
        when the door asks for it, not by gRPC before the call starts."""

        async def read() -> Received:
            raw = await context.read()
            if not isinstance(raw, bytes):  # grpc.aio.EOF: no message came
                # A client that cancels ends its stream first and is cancelled a moment
                # later: waited for, it is counted as gone (499), not as an empty call.
                await asyncio.sleep(EOF_GRACE_SECONDS)
                raise InvalidInputError("the call carried no ModelInferRequest")
            return Received(len(raw), lambda: infer_message(raw))

        async def work(rpc: Rpc) -> Any:
            message, model, version, outputs = await self._door.infer(rpc, read, context.time_remaining())
            return infer_response(model, version, message.request_id, outputs)

        return await self._run(context, work)

    async def ModelStreamInfer(self, requests: Any, context: Any) -> None:  # noqa: N802 (the RPC names)
        """Each message an inference (gateway.rpc.door: InferenceDoor.stream), read when
        the door asks for it; each answered in order, a refusal as the response's
        ``error_message`` (the stream goes on), as Triton answers on its stream."""

        async def read() -> Received | None:
            raw = await context.read()
            return Received(len(raw), lambda: infer_message(raw)) if isinstance(raw, bytes) else None

        async def write(result: Answered | GatewayError) -> None:
            if isinstance(result, GatewayError):
                response = service_pb2.ModelStreamInferResponse(
                    error_message=result.detail
                ).SerializeToString()
            else:
                message, model, version, outputs = result
                response = stream_response(infer_response(model, version, message.request_id, outputs))
            await context.write(response)

        async def work(rpc: Rpc) -> None:
            await self._door.stream(rpc, read, write, context.time_remaining)

        await self._run(context, work)

    def _refusal(method: str, detail: str) -> Any:  # noqa: N805 (builds the class's methods)
        async def refuse(self: InferenceService, requests: Any, context: Any) -> Any:
            await self._run(context, lambda rpc: self._door.not_served(rpc, method, detail))

        return refuse

    SystemSharedMemoryStatus = _refusal("SystemSharedMemoryStatus", NOT_SERVED_SHARED_MEMORY)
    SystemSharedMemoryRegister = _refusal("SystemSharedMemoryRegister", NOT_SERVED_SHARED_MEMORY)
    SystemSharedMemoryUnregister = _refusal("SystemSharedMemoryUnregister", NOT_SERVED_SHARED_MEMORY)
    CudaSharedMemoryStatus = _refusal("CudaSharedMemoryStatus", NOT_SERVED_SHARED_MEMORY)
    CudaSharedMemoryRegister = _refusal("CudaSharedMemoryRegister", NOT_SERVED_SHARED_MEMORY)
    CudaSharedMemoryUnregister = _refusal("CudaSharedMemoryUnregister", NOT_SERVED_SHARED_MEMORY)
    TraceSetting = _refusal("TraceSetting", NOT_SERVED_SETTINGS)
    LogSettings = _refusal("LogSettings", NOT_SERVED_SETTINGS)
    RepositoryIndex = _refusal("RepositoryIndex", NOT_SERVED_CONTROL)
    RepositoryModelLoad = _refusal("RepositoryModelLoad", NOT_SERVED_CONTROL)
    RepositoryModelUnload = _refusal("RepositoryModelUnload", NOT_SERVED_CONTROL)


def _model_ref(context: Any, kind: Any) -> ReadRef:
    """The reader of a model-scoped call's message (a ``kind``: ModelMetadataRequest and
    the like): its raw bytes read when the door asks, refused unparsed past
    :data:`SMALL_MESSAGE_BYTES`."""

    async def read() -> ModelRef:
        raw = await context.read()
        if not isinstance(raw, bytes):  # grpc.aio.EOF
            raise InvalidInputError(f"the call carried no {kind.DESCRIPTOR.name}")
        if len(raw) > SMALL_MESSAGE_BYTES:
            raise PayloadTooLargeError(
                f"a {kind.DESCRIPTOR.name} is at most {SMALL_MESSAGE_BYTES} bytes; this one is {len(raw)}"
            )
        try:
            request = kind.FromString(raw)
        except DecodeError:
            raise InvalidInputError(f"the message is not a {kind.DESCRIPTOR.name}") from None
        return ModelRef(request.name, request.version)

    return read


def certified_name(auth: dict[str, list[bytes]] | None) -> str | None:
    """The name a verified client certificate gives (gateway.shared.certificates, as the
    HTTP door names a forwarded one: the same certificate, the same name), when the call
    came over TLS with one (gRPC checked it against the CA); 401 for a name not usable."""
    if not auth or auth.get("transport_security_type") != [b"ssl"]:
        return None
    pem = auth.get("x509_pem_cert")
    common, alternative = (
        [value.decode("utf-8", "replace") for value in auth.get(field) or ()]
        for field in ("x509_common_name", "x509_subject_alternative_name")
    )
    return verified_name(pem[0] if pem else None, common, alternative)


def _handlers(servicer: InferenceService) -> dict[str, Any]:
    """Every method of Triton's service, taken from its descriptor (a method the protos
    gain is registered the same way, and tests/integration/test_every_door.py walks them
    all), registered as client-streaming with the raw message: a unary handler gets its
    message read in full by gRPC before it runs, so neither the caller nor the body budget
    could come first. Here nothing is read until the door asks, once the caller is known
    (a method that names nothing, say ServerLive, never reads its message at all). On the
    wire a unary call and a client-streaming one are the same; unary clients cannot tell.
    ``ModelInfer``'s and ``ModelStreamInfer``'s answers are serialised by the servicer."""
    generated: dict[str, Any] = {}

    class Collector:
        def add_generic_rpc_handlers(self, handlers: Any) -> None:
            pass

        def add_registered_method_handlers(self, service: str, handlers: dict[str, Any]) -> None:
            generated.update(handlers)

    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(servicer, Collector())
    handlers: dict[str, Any] = {}
    for method in service_pb2.DESCRIPTOR.services_by_name[SERVICE_NAME.rsplit(".", 1)[1]].methods:
        behaviour = getattr(servicer, method.name)
        if method.server_streaming:
            handlers[method.name] = grpc.stream_stream_rpc_method_handler(
                behaviour, request_deserializer=None, response_serializer=None
            )
            continue
        serialize = None if method.name == "ModelInfer" else generated[method.name].response_serializer
        handlers[method.name] = grpc.stream_unary_rpc_method_handler(
            behaviour, request_deserializer=None, response_serializer=serialize
        )
    return handlers


HEALTH_SERVICE = "grpc.health.v1.Health"


class DoorHealth:
    """The gRPC health protocol (``grpc.health.v1.Health``, what Kubernetes' gRPC probes
    call): SERVING or NOT_SERVING, the door's readiness. Anyone may call it (probes carry no
    key), so it never reads the call's message: gRPC takes a message whole, up to the door's
    largest (44 MiB), before a handler can look at it, and 16 anonymous checks naming a
    40 MiB service took the gateway from 110 to a 670 MiB peak (368 MiB after) even with at
    most two read at once, since a read given up on is still taken in by gRPC. So the
    answer is the status of the whole door whatever service the message names (a probe
    names "" or the inference service; another name is not NOT_FOUND, as it is in gRPC's
    own health service), and a call that never sends its message is answered at once.
    ``Watch`` sends the status, then each change. At most ``max_watches`` watches are open
    at once, the rest refused at once (RESOURCE_EXHAUSTED): a ``Watch`` stays open, and
    without a bound of their own anonymous watches took every call the door runs (16 of
    16: a keyed client refused). ``Check`` is not counted with them, so watches never
    refuse a probe's check."""

    def __init__(self, max_watches: int) -> None:
        from grpc_health.v1 import health_pb2

        self._pb = health_pb2
        self.status = health_pb2.HealthCheckResponse.NOT_SERVING
        self._changed = asyncio.Event()
        self._max_watches = max_watches
        self._watches = 0

    def set(self, serving: bool) -> None:
        response = self._pb.HealthCheckResponse
        status = response.SERVING if serving else response.NOT_SERVING
        if status != self.status:
            self.status = status
            self._changed.set()
            self._changed = asyncio.Event()

    def _answer(self) -> bytes:
        return bytes(self._pb.HealthCheckResponse(status=self.status).SerializeToString())

    async def check(self, requests: Any, context: Any) -> bytes:
        return self._answer()  # the message unread (the class says why)

    async def watch(self, requests: Any, context: Any) -> None:
        if self._watches >= self._max_watches:
            await context.abort(
                grpc.StatusCode.RESOURCE_EXHAUSTED, f"{self._max_watches} health watches are open already"
            )
        self._watches += 1
        try:
            while True:
                changed = self._changed
                await context.write(self._answer())
                await changed.wait()
        finally:
            self._watches -= 1

    def handlers(self) -> dict[str, Any]:
        """Both methods registered client-streaming with the raw message, which they never
        read (a unary handler would have gRPC read it whole before the handler runs)."""
        return {
            "Check": grpc.stream_unary_rpc_method_handler(
                self.check, request_deserializer=None, response_serializer=None
            ),
            "Watch": grpc.stream_stream_rpc_method_handler(
                self.watch, request_deserializer=None, response_serializer=None
            ),
        }


async def _health(door: Door, health: DoorHealth) -> None:
    try:
        ready = await door.readiness()
    except GatewayError:
        ready = False
    health.set(ready)


class FrontDoor:
    """The running gRPC server and its health loop."""

    def __init__(self, server: Any, health: Periodic) -> None:
        self.server = server
        self.health = health

    async def stop(self, grace: float) -> None:
        await self.health.stop()
        await self.server.stop(grace)


@dataclass(frozen=True)
class DoorLimits:
    """What the gRPC door lets one connection and all of them hold (gateway.settings
    GrpcSettings says each one's meaning)."""

    max_message_bytes: int
    max_calls: int
    max_streams: int
    max_connections: int
    max_health_watches: int
    handshake_seconds: float
    idle_seconds: float
    age_seconds: float
    age_grace_seconds: float
    compressed_messages: bool = False

    def options(self) -> list[tuple[str, int]]:
        """The gRPC server's channel arguments for these limits."""
        return [
            ("grpc.max_receive_message_length", self.max_message_bytes),
            ("grpc.max_send_message_length", self.max_message_bytes),
            ("grpc.max_concurrent_streams", self.max_streams),
            # a stream counts against max_concurrent_streams until gRPC has freed it, not only
            # until the client reset it: past that, new streams are refused (RST_STREAM) before
            # a handler runs. HTTP/2's rapid reset (opening calls and resetting each at once,
            # CVE-2023-44487) from one anonymous connection, 430,000 streams in 10 s: without
            # it, a keyed client's calls timed out (118 of 119) and RSS rose +244 MiB; with it
            # (1.9 million streams), about 1 % reached a handler, keyed p99 70 ms. gRPC's
            # default today, pinned so an upgrade cannot turn it off.
            ("grpc.http.overload_protection", 1),
            # Without it, gRPC widens each stream's flow-control window to its bandwidth-delay
            # estimate and takes in whole messages nobody has asked to read (16 unread calls of
            # 40 MiB: +649 MiB; with it, +2.5 MiB): a call's message arrives when it is read.
            ("grpc.http2.bdp_probe", 0),
            # Every connection under a deadline no byte extends, as on the HTTP door: one that
            # has not finished its handshake (TLS, the HTTP/2 preface and SETTINGS) by the
            # head's deadline is closed; one with no call open for idle_seconds is told to go
            # (PINGs do not count as calls); every one is told to go at age_seconds, its calls
            # given age_grace_seconds to end. Without them, a socket that sent nothing was held
            # 120 s (gRPC's handshake default) and one that sent the preface, for good.
            ("grpc.server_handshake_timeout_ms", _ms(self.handshake_seconds)),
            ("grpc.max_connection_idle_ms", _ms(self.idle_seconds)),
            ("grpc.max_connection_age_ms", _ms(self.age_seconds)),
            ("grpc.max_connection_age_grace_ms", _ms(self.age_grace_seconds)),
            # past it, a new connection is closed at once (file descriptors and per-connection
            # memory bounded, as uvicorn's limit_concurrency bounds the HTTP door's)
            ("grpc.max_allowed_incoming_connections", self.max_connections),
            # messages sent compressed (gzip, deflate) taken only when allowed: gRPC inflates
            # one whole, up to max_message_bytes, before anything can look at it (when health
            # checks were still read, 16 anonymous ones of 40 KB on the wire, 40 MiB inflated,
            # took the gateway's RSS from 283 to 847 MiB; a keyed call's 40 KB is 40 MiB of its
            # body budget) (bit 0: identity only)
            ("grpc.compression_enabled_algorithms_bitset", 0b111 if self.compressed_messages else 0b1),
        ]


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


async def serve(
    door: Door,
    host: str,
    port: int,
    limits: DoorLimits,
    health_seconds: float = 2.0,
    tls: tuple[bytes, bytes, bytes | None] | None = None,
    proxies: TrustedProxies | None = None,
) -> FrontDoor:
    """Start the gRPC door on ``host:port`` (an aio server, on the running loop), with the
    health service, under ``limits`` (calls at once past which RESOURCE_EXHAUSTED comes at
    once, streams per connection, connections and their deadlines); over TLS with ``tls``
    (PEM: chain, key, and the CAs client certificates must come from, or None)."""
    server = grpc.aio.server(options=limits.options(), maximum_concurrent_rpcs=limits.max_calls)
    certifies = tls is not None and tls[2] is not None
    handlers = _handlers(InferenceService(door, certifies, proxies))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)
    health = DoorHealth(limits.max_health_watches)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(HEALTH_SERVICE, health.handlers()),)
    )
    server.add_registered_method_handlers(HEALTH_SERVICE, health.handlers())
    if tls is None:
        bound = server.add_insecure_port(f"{host}:{port}")
    else:  # (certificate chain, key, client CAs: when given, a client certificate is required)
        chain, key, client_ca = tls
        credentials = grpc.ssl_server_credentials(
            [(key, chain)], root_certificates=client_ca, require_client_auth=client_ca is not None
        )
        bound = server.add_secure_port(f"{host}:{port}", credentials)
    if bound == 0:
        raise OSError(f"the gRPC door cannot listen on {host}:{port}")
    await _health(door, health)  # a status before the first call
    await server.start()
    loop = Periodic("grpc health", health_seconds, lambda: _health(door, health), logger)
    loop.start()
    logger.info("gRPC door listening on %s:%d", host, bound)
    return FrontDoor(server, loop)
