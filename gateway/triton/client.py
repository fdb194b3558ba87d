"""The gateway's only contact with Triton: an async gRPC backend.

Implements the narrow transport of :mod:`gateway.triton.backend`. Inference goes straight
through Triton's generated gRPC stub (``ModelInferRequest`` protobufs built here, raw
contents through :mod:`gateway.triton.tensors`): one path for every kind and for the Open
Inference Protocol. Health, metadata, configuration and model control use
``tritonclient.grpc.aio``. Triton's failures are translated here, keyed on
``grpc.StatusCode`` itself (one table, every member mapped), into :mod:`gateway.errors`
(the pattern of httpx's ``map_httpcore_exceptions``). Triton's own messages are logged,
never returned to clients.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import grpc
import tritonclient.grpc.aio as grpcclient
from google.protobuf import json_format
from tritonclient.grpc import service_pb2
from tritonclient.utils import InferenceServerException

from gateway.errors import (
    GatewayError,
    InvalidImageError,
    InvalidInputError,
    ModelLoadError,
    NotFoundError,
    TritonFailureError,
    TritonTimeoutError,
    TritonUnavailableError,
    UnknownModelError,
)
from gateway.observe.metrics import GatewayMetrics
from gateway.observe.tracing import Tracing, grpc_status
from gateway.settings import TritonSettings
from gateway.triton.backend import (
    InferResult,
    ModelConfig,
    ModelSignature,
    ModelStatus,
    RepositoryModel,
    ServerStatus,
    TensorSpec,
)
from gateway.triton.tensors import Tensor, TensorDataError, from_raw
from gateway.triton.wire import RAW_INPUT_TAG, append_field

logger = logging.getLogger("gateway.triton")

# How long a model's metadata is trusted for OIP checks (a failed call forgets it at once).
# The gRPC metadata / HTTP header that carries the key of Triton's restricted APIs.
REPOSITORY_KEY_HEADER = "triton-gateway-admin-key"
# The Python backend answers INTERNAL while it replaces a stub process it found unhealthy
# (after a stall, say): transient, so the client hears 503 + Retry-After, not 502. The one
# place a message is read: Triton gives this condition no status code of its own.
_STUB_RESTARTING = ("Stub process", "health mutex")
# Every gRPC status code, and what it means for the client (InvalidInputError: the call's
# own "invalid" error). tests/unit/test_triton_errors.py walks grpc.StatusCode so that a
# code cannot go unmapped.
STATUS_ERRORS: dict[grpc.StatusCode, type[GatewayError]] = {
    grpc.StatusCode.OK: TritonFailureError,  # an error carrying OK is Triton's fault
    grpc.StatusCode.CANCELLED: TritonUnavailableError,
    grpc.StatusCode.UNKNOWN: TritonFailureError,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidInputError,
    grpc.StatusCode.DEADLINE_EXCEEDED: TritonTimeoutError,
    grpc.StatusCode.NOT_FOUND: TritonUnavailableError,  # the model is not loaded (now)
    grpc.StatusCode.ALREADY_EXISTS: TritonFailureError,
    grpc.StatusCode.PERMISSION_DENIED: TritonFailureError,  # the gateway's key is wrong
    grpc.StatusCode.RESOURCE_EXHAUSTED: TritonUnavailableError,  # queue full
    grpc.StatusCode.FAILED_PRECONDITION: TritonFailureError,
    grpc.StatusCode.ABORTED: TritonUnavailableError,
    grpc.StatusCode.OUT_OF_RANGE: InvalidInputError,
    grpc.StatusCode.UNIMPLEMENTED: TritonFailureError,
    grpc.StatusCode.INTERNAL: TritonFailureError,
    grpc.StatusCode.UNAVAILABLE: TritonUnavailableError,
    grpc.StatusCode.DATA_LOSS: TritonFailureError,
    grpc.StatusCode.UNAUTHENTICATED: TritonFailureError,
}


def status_code(exc: InferenceServerException) -> grpc.StatusCode:
    """The gRPC status of a tritonclient error (which reports it as ``str(StatusCode.X)``)."""
    name = (exc.status() or "").removeprefix("StatusCode.")
    return grpc.StatusCode.__members__.get(name, grpc.StatusCode.UNKNOWN)


def map_status(
    code: grpc.StatusCode, message: str, *, retry_after: int, invalid: InvalidInputError | None = None
) -> GatewayError:
    """Translate one failed Triton call into the gateway's error tree.

    ``invalid`` is what INVALID_ARGUMENT means for this call (by default: an image the
    model's preprocessing could not decode).
    """
    kind = STATUS_ERRORS[code]
    if kind is TritonFailureError and any(mark in message for mark in _STUB_RESTARTING):
        kind = TritonUnavailableError
    if kind is InvalidInputError:
        return invalid or InvalidImageError(
            "the model's preprocessing rejected the input (corrupt or truncated data)"
        )
    if kind is TritonUnavailableError:
        return TritonUnavailableError("Triton or the model is not available", retry_after=retry_after)
    if kind is TritonTimeoutError:
        return TritonTimeoutError("Triton did not answer in time")
    return TritonFailureError("Triton failed to process the request")


def map_triton_error(
    exc: InferenceServerException, *, retry_after: int, invalid: InvalidInputError | None = None
) -> GatewayError:
    """:func:`map_status` for a tritonclient exception."""
    return map_status(status_code(exc), exc.message() or "", retry_after=retry_after, invalid=invalid)


def channel_options(settings: TritonSettings, max_send_bytes: int) -> list[tuple[str, int | str]]:
    """gRPC channel options, set on purpose rather than left at gRPC's defaults (a 120 s
    reconnect backoff kept the gateway answering 503 for 30 s after Triton was back)."""
    backoff_ms = int(settings.reconnect_backoff_max_seconds * 1000)
    return [
        ("grpc.max_send_message_length", max_send_bytes),
        # /v2 serves any catalogued model: its outputs may be large (embeddings, logits)
        ("grpc.max_receive_message_length", settings.max_receive_bytes),
        ("grpc.initial_reconnect_backoff_ms", min(100, backoff_ms)),
        ("grpc.min_reconnect_backoff_ms", min(100, backoff_ms)),
        ("grpc.max_reconnect_backoff_ms", backoff_ms),
        ("grpc.keepalive_time_ms", int(settings.keepalive_seconds * 1000)),
        ("grpc.keepalive_timeout_ms", int(min(settings.keepalive_seconds, 5) * 1000)),
        # No pings on an idle channel (Triton's default ping policy would answer too_many_pings);
        # the breaker's probe keeps the channel busy anyway.
        ("grpc.keepalive_permit_without_calls", 0),
        ("grpc.http2.max_pings_without_data", 0),
        # several replicas under shortest_queue are one channel each (gateway.serving.placement)
        (
            "grpc.lb_policy_name",
            "pick_first" if settings.load_balancing == "shortest_queue" else settings.load_balancing,
        ),
        # new Triton replicas are found when the name is resolved again: at most this often
        ("grpc.dns_min_time_between_resolutions_ms", 5000),
    ]


# Fields whose text must stay text though it may look like a number.
_TEXT_FIELDS = frozenset(
    {"name", "version", "string_value", "platform", "backend", "key", "model_name", "label_filename"}
)


def http_json(message: Any) -> dict[str, Any]:
    """A protobuf message as Triton's HTTP protocol writes it: field names as in the proto,
    and 64-bit integers as numbers (protobuf's JSON mapping writes them as text, which
    perf_analyzer and tritonclient do not expect)."""

    def numbers(value: Any, key: str = "") -> Any:
        if isinstance(value, dict):
            return {k: numbers(v, k) for k, v in value.items()}
        if isinstance(value, list):
            return [numbers(v, key) for v in value]
        if isinstance(value, str) and key not in _TEXT_FIELDS and value.lstrip("-").isdigit():
            return int(value)
        return value

    try:  # every field, zeros included, as Triton's HTTP endpoint writes them
        document = json_format.MessageToDict(
            message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
        )
    except TypeError:  # protobuf < 5.26 names the option differently
        document = json_format.MessageToDict(
            message,
            preserving_proto_field_name=True,
            including_default_value_fields=True,  # type: ignore[call-arg]
        )
    return dict(numbers(document))


MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"
SERVER_LIVE = "/inference.GRPCInferenceService/ServerLive"


def infer_request_bytes(
    model: str,
    version: str,
    inputs: Sequence[Tensor],
    request_id: str,
    outputs: Sequence[str] = (),
    priority: int = 0,
    classes: Mapping[str, int] | None = None,
) -> tuple[bytes, int]:
    """A serialised ModelInferRequest, and its input bytes. Protobuf builds everything but
    the raw contents; those are appended on the wire (field 7, one entry per input, in
    input order: a repeated field may come in any position), so the inputs are copied once
    (into the joined message) instead of into each element's prefix, the message and its
    serialisation. Parsed by Triton exactly as the generated message would be
    (tests/unit/test_triton_wire.py)."""
    request = service_pb2.ModelInferRequest(model_name=model, model_version=version, id=request_id)
    if priority:
        # the ensemble passes it to every step (Triton 2.51: tests/integration/test_triton_priority.py)
        request.parameters["priority"].uint64_param = priority
    pieces: list[bytes | memoryview] = []
    nbytes = 0
    for tensor in inputs:
        entry = request.inputs.add()
        entry.name, entry.datatype = tensor.name, tensor.datatype
        entry.shape.extend(tensor.shape)
        nbytes += append_field(pieces, RAW_INPUT_TAG, tensor.raw_parts())
    for name in outputs:
        output = request.outputs.add(name=name)
        if classes and name in classes:
            output.parameters["classification"].int64_param = classes[name]
    return b"".join([request.SerializeToString(), *pieces]), nbytes


class TritonBackend:
    """Implements :class:`gateway.triton.backend.InferenceBackend` over ``tritonclient.grpc.aio``.

    Build it inside a running event loop (the app's lifespan) and ``close()`` it there.
    """

    def __init__(
        self, settings: TritonSettings, metrics: GatewayMetrics, tracing: Tracing, max_send_bytes: int
    ) -> None:
        self._settings = settings
        self._metrics = metrics
        self._tracing = tracing
        options = channel_options(settings, max_send_bytes)
        self._client = grpcclient.InferenceServerClient(settings.url, channel_args=options)
        # inference: Triton's generated stub on a channel of its own
        self._channel = grpc.aio.insecure_channel(settings.url, options=options)
        # the request goes as bytes the gateway serialises itself (infer_request_bytes): the
        # inputs are copied once, not four times (an 8-image request is 1.8 MB)
        self._model_infer = self._channel.unary_unary(
            MODEL_INFER,
            request_serializer=None,
            response_deserializer=service_pb2.ModelInferResponse.FromString,
        )
        # Liveness on the inference channel: the breaker's probe and /readyz must vouch for
        # the connection requests take. Asked on tritonclient's own channel, it said live
        # while the inference channel still dialled the address a restarted Triton had left
        # (503s behind a 200 /readyz: tests/unit/test_triton_channel.py).
        self._server_live = self._channel.unary_unary(
            SERVER_LIVE,
            request_serializer=service_pb2.ServerLiveRequest.SerializeToString,
            response_deserializer=service_pb2.ServerLiveResponse.FromString,
        )
        # Triton's gRPC front end expects a restricted protocol's header under this prefix.
        key = settings.repository_key.get_secret_value()
        self._repository_headers = {f"triton-grpc-protocol-{REPOSITORY_KEY_HEADER}": key} if key else {}

    async def close(self) -> None:
        await self._client.close()
        await self._channel.close()

    async def is_live(self, within: float) -> bool:
        # Liveness, not readiness: Triton's strict readiness turns false as soon as any model
        # is unloaded (an /admin unload, a catalog model taken out), which must not open the
        # circuit for every other model; a model that is not ready answers UNAVAILABLE itself.
        try:
            answer = await self._server_live(service_pb2.ServerLiveRequest(), timeout=within)
        except grpc.aio.AioRpcError:
            return False
        return bool(answer.live)

    def _error(
        self,
        code: grpc.StatusCode,
        message: str,
        model: str,
        what: str,
        invalid: InvalidInputError | None = None,
    ) -> GatewayError:
        logger.warning("triton %s on %s: %s", code.name, what, message)
        self._metrics.triton_failures.labels(model=model, code=code.name).inc()
        return map_status(code, message, retry_after=self._settings.retry_after_seconds, invalid=invalid)

    def _client_error(
        self, exc: InferenceServerException, what: str, level: int = logging.WARNING
    ) -> GatewayError:
        """A tritonclient (metadata, configuration, control) call's failure, mapped and
        chained; not an inference failure, so not counted as one."""
        code = status_code(exc)
        logger.log(level, "triton %s on %s: %s", code.name, what, exc.message())
        error = map_status(code, exc.message() or "", retry_after=self._settings.retry_after_seconds)
        error.__cause__ = exc
        return error

    async def infer(
        self,
        model: str,
        version: str,
        inputs: Sequence[Tensor],
        request_id: str,
        outputs: Sequence[str] = (),
        invalid: InvalidInputError | None = None,
        priority: int = 0,
        classes: Mapping[str, int] | None = None,
    ) -> InferResult:
        """One inference call: timed, traced (its ``traceparent`` goes along as gRPC
        metadata, so Triton's spans join the request's trace), under the call deadline."""
        request, nbytes = infer_request_bytes(model, version, inputs, request_id, outputs, priority, classes)
        with (
            self._tracing.triton_call(model, version, len(inputs), nbytes) as metadata,
            self._metrics.time_triton_call(model, version),
        ):
            try:
                response = await self._model_infer(
                    request,
                    metadata=tuple(metadata.items()) if metadata else None,
                    timeout=self._settings.timeout_seconds,
                )
            except grpc.aio.AioRpcError as rpc_error:
                code = rpc_error.code()
                grpc_status(code.name, code.value[0])
                error = self._error(
                    rpc_error.code(), rpc_error.details() or "", model, f"request {request_id}", invalid
                )
                raise error from None
            grpc_status(grpc.StatusCode.OK.name, grpc.StatusCode.OK.value[0])
        try:
            tensors = {
                output.name: from_raw(output.name, output.datatype, raw, output.shape)
                for output, raw in zip(response.outputs, response.raw_output_contents, strict=True)
            }
        except (TensorDataError, ValueError) as exc:
            logger.error("triton answered %s with outputs that do not decode: %s", model, exc)
            raise TritonFailureError("Triton failed to process the request") from exc
        return InferResult(str(response.model_version), tensors)

    async def model_signature(self, model: str, version: str) -> ModelSignature:
        """The model's inputs and outputs from Triton's metadata and configuration."""
        try:
            metadata = await self._client.get_model_metadata(
                model, version, client_timeout=self._settings.health_timeout_seconds
            )
            config = (
                await self._client.get_model_config(
                    model, version, client_timeout=self._settings.health_timeout_seconds
                )
            ).config
        except InferenceServerException as exc:
            if status_code(exc) is grpc.StatusCode.NOT_FOUND:  # a model or version Triton lacks
                raise UnknownModelError(model, version) from exc
            raise self._client_error(exc, f"metadata of {model}") from exc

        optional = {item.name for item in config.input if item.optional}

        def specs(tensors: Any) -> tuple[TensorSpec, ...]:
            return tuple(
                TensorSpec(t.name, t.datatype, tuple(int(d) for d in t.shape), t.name in optional)
                for t in tensors
            )

        return ModelSignature(
            name=metadata.name,
            versions=tuple(metadata.versions),
            platform=metadata.platform,
            inputs=specs(metadata.inputs),
            outputs=specs(metadata.outputs),
        )

    async def model_config(self, model: str) -> ModelConfig:
        timeout = self._settings.health_timeout_seconds
        try:
            config = (await self._client.get_model_config(model, client_timeout=timeout)).config
        except InferenceServerException as exc:
            if status_code(exc) in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT):
                raise NotFoundError(f"Triton has no loaded model {model!r}") from exc
            raise self._client_error(exc, f"configuration of {model}", logging.DEBUG) from exc
        return ModelConfig(
            name=config.name,
            platform=config.platform or config.backend,
            max_batch_size=int(config.max_batch_size),
            parameters={key: value.string_value for key, value in config.parameters.items()},
            inputs=tuple(item.name for item in config.input),
            steps=tuple(step.model_name for step in config.ensemble_scheduling.step),
        )

    async def _document(self, call: Any, model: str, version: str, what: str) -> dict[str, Any]:
        """A tritonclient call answering a message about ``model``, as Triton's HTTP JSON;
        NotFoundError for a model or version Triton has not loaded."""
        try:
            answer = await call(model, version, client_timeout=self._settings.health_timeout_seconds)
        except InferenceServerException as exc:
            if status_code(exc) in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT):
                raise UnknownModelError(model, version) from exc
            raise self._client_error(exc, what, logging.DEBUG) from exc
        return http_json(answer)

    async def model_config_document(self, model: str, version: str) -> dict[str, Any]:
        document = await self._document(
            self._client.get_model_config, model, version, f"configuration of {model}"
        )
        return dict(document["config"])

    async def statistics(self, model: str, version: str) -> dict[str, Any]:
        what = f"statistics of {model or 'every model'}"
        return await self._document(self._client.get_inference_statistics, model, version, what)

    async def repository_index(self) -> list[RepositoryModel]:
        try:
            index = await self._client.get_model_repository_index(
                headers=self._repository_headers, client_timeout=self._settings.health_timeout_seconds
            )
        except InferenceServerException as exc:
            # read every few seconds by the catalog: a refusal is its business to report
            raise self._client_error(exc, "repository index", logging.DEBUG) from exc
        return [RepositoryModel(m.name, m.version, m.state, m.reason) for m in index.models]

    async def load_model(self, model: str) -> None:
        try:
            await self._client.load_model(
                model, headers=self._repository_headers, client_timeout=self._settings.load_timeout_seconds
            )
        except InferenceServerException as exc:
            transient = STATUS_ERRORS[status_code(exc)] in (TritonUnavailableError, TritonTimeoutError)
            # Triton reports a failed load as UNAVAILABLE / INTERNAL with "load" in its reason.
            if transient and "load" not in (exc.message() or ""):
                raise self._client_error(exc, f"load of {model}") from exc
            logger.warning("triton could not load %s: %s", model, exc.message())
            raise ModelLoadError(f"Triton could not load {model}: {exc.message()}"[:1000]) from exc

    async def unload_model(self, model: str, *, dependents: bool) -> None:
        try:
            await self._client.unload_model(
                model,
                headers=self._repository_headers,
                unload_dependents=dependents,
                client_timeout=self._settings.load_timeout_seconds,
            )
        except InferenceServerException as exc:
            raise self._client_error(exc, f"unload of {model}") from exc

    async def server_status(self) -> ServerStatus:
        timeout = self._settings.health_timeout_seconds
        if not await self.is_live(timeout):
            return ServerStatus(live=False)
        try:
            metadata = await self._client.get_server_metadata(client_timeout=timeout)
        except InferenceServerException:
            return ServerStatus(live=False)
        return ServerStatus(live=True, version=str(metadata.version))

    async def model_status(self, model: str, version: str) -> ModelStatus:
        timeout = self._settings.health_timeout_seconds
        try:
            ready = bool(await self._client.is_model_ready(model, version, client_timeout=timeout))
            if not ready:
                return ModelStatus(name=model, ready=False)
            # without a version: the metadata then lists every version Triton has ready
            metadata = await self._client.get_model_metadata(model, client_timeout=timeout)
            config = (await self._client.get_model_config(model, version, client_timeout=timeout)).config
        except InferenceServerException:
            return ModelStatus(name=model, ready=False)
        steps = [
            (step.model_name, "" if step.model_version < 0 else str(step.model_version))
            for step in config.ensemble_scheduling.step
        ]
        composing = await asyncio.gather(*(self.model_status(name, ver) for name, ver in steps))
        return ModelStatus(
            name=model,
            ready=all(step.ready for step in composing),
            versions=list(metadata.versions),
            platform=str(metadata.platform),
            composing=list(composing),
        )
