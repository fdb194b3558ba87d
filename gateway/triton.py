"""The gateway's only contact with Triton: an async gRPC backend.

Inference goes straight through Triton's generated gRPC stub (``ModelInferRequest``
protobufs built here, outputs read from ``raw_output_contents``): one path for images,
texts and the Open Inference Protocol, without tritonclient's per-call objects. Health,
metadata and model control use ``tritonclient.grpc.aio``. Triton's failures are
translated here, by gRPC status code and never by message text, into
:mod:`gateway.errors` (the pattern of httpx's ``map_httpcore_exceptions``). Triton's own
messages are logged, never returned to clients.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator, Sequence
from typing import Any

import grpc
import numpy as np
import tritonclient.grpc.aio as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException, triton_to_np_dtype

from gateway.backend import Classification, ModelStatus, RepositoryModel, ScoredLabel, ServerStatus
from gateway.breaker import CircuitBreaker, CircuitState
from gateway.errors import (
    GatewayError,
    InvalidImageError,
    InvalidInputError,
    ModelLoadError,
    NotFoundError,
    TritonFailureError,
    TritonTimeoutError,
    TritonUnavailableError,
)
from gateway.metrics import GatewayMetrics
from gateway.oip import ModelSignature, Tensor, TensorSpec
from gateway.settings import TritonSettings
from gateway.tracing import Tracing, grpc_status
from gateway.tritonserver import REPOSITORY_KEY_HEADER

logger = logging.getLogger("gateway.triton")

# tritonclient reports the gRPC status as str(grpc.StatusCode.X).
_INVALID = {"StatusCode.INVALID_ARGUMENT", "StatusCode.OUT_OF_RANGE"}
_UNAVAILABLE = {
    "StatusCode.UNAVAILABLE",
    "StatusCode.NOT_FOUND",  # the model is not loaded (unknown to Triton)
    "StatusCode.RESOURCE_EXHAUSTED",  # queue full
    "StatusCode.CANCELLED",
}
_TIMEOUT = {"StatusCode.DEADLINE_EXCEEDED"}
# How long a model's metadata is trusted for OIP checks (a failed call forgets it at once).
SIGNATURE_TTL_SECONDS = 30.0
# The Python backend answers INTERNAL while it replaces a stub process it found unhealthy
# (after a stall, say): transient, so the client hears 503 + Retry-After, not 502.
_STUB_RESTARTING = ("Stub process", "health mutex")
# When several inputs fail differently, the client hears the most actionable error.
_SEVERITY: dict[type[GatewayError], int] = {
    TritonUnavailableError: 3,
    TritonTimeoutError: 2,
    TritonFailureError: 1,
}


def map_triton_error(
    exc: InferenceServerException, *, retry_after: int, invalid: InvalidInputError | None = None
) -> GatewayError:
    """Translate one tritonclient exception into the gateway's error tree.

    ``invalid`` is what INVALID_ARGUMENT means for this call (by default: an image the
    model's preprocessing could not decode).
    """
    status = exc.status() or ""
    if status in _INVALID:
        return invalid or InvalidImageError(
            "the model's preprocessing rejected the input (corrupt or truncated data)"
        )
    if status in _UNAVAILABLE or any(mark in (exc.message() or "") for mark in _STUB_RESTARTING):
        return TritonUnavailableError(
            "Triton or the model is not available", headers={"Retry-After": str(retry_after)}
        )
    if status in _TIMEOUT:
        return TritonTimeoutError("Triton did not answer in time")
    return TritonFailureError("Triton failed to process the request")


def channel_options(settings: TritonSettings, max_send_bytes: int) -> list[tuple[str, int]]:
    """gRPC channel options, set on purpose rather than left at gRPC's defaults (a 120 s
    reconnect backoff kept the gateway answering 503 for 30 s after Triton was back)."""
    backoff_ms = int(settings.reconnect_backoff_max_seconds * 1000)
    return [
        ("grpc.max_send_message_length", max_send_bytes),
        ("grpc.max_receive_message_length", 4 * 1024 * 1024),  # top-k answers are small
        ("grpc.initial_reconnect_backoff_ms", min(100, backoff_ms)),
        ("grpc.min_reconnect_backoff_ms", min(100, backoff_ms)),
        ("grpc.max_reconnect_backoff_ms", backoff_ms),
        ("grpc.keepalive_time_ms", int(settings.keepalive_seconds * 1000)),
        ("grpc.keepalive_timeout_ms", int(min(settings.keepalive_seconds, 5) * 1000)),
        # No pings on an idle channel (Triton's default ping policy would answer too_many_pings);
        # the breaker's probe keeps the channel busy anyway.
        ("grpc.keepalive_permit_without_calls", 0),
        ("grpc.http2.max_pings_without_data", 0),
    ]


def _strings(items: Sequence[Any]) -> list[str]:
    return [item.decode("utf-8", "replace") if isinstance(item, bytes) else str(item) for item in items]


def _bytes_contents(elements: Sequence[bytes]) -> bytes:
    """A BYTES tensor's raw contents: each element as a 4-byte little-endian length and its bytes."""
    return b"".join(len(element).to_bytes(4, "little") + element for element in elements)


def _bytes_elements(raw: bytes) -> list[bytes]:
    """The elements of a BYTES tensor's raw contents."""
    elements, at, end = [], 0, len(raw)
    while at < end:
        size = int.from_bytes(raw[at : at + 4], "little")
        elements.append(raw[at + 4 : at + 4 + size])
        at += 4 + size
    return elements


def _contents(tensor: Tensor) -> bytes:
    if tensor.datatype == "BYTES":
        return _bytes_contents([bytes(item) for item in tensor.array.reshape(-1)])
    dtype = np.dtype(triton_to_np_dtype(tensor.datatype)).newbyteorder("<")
    return np.ascontiguousarray(tensor.array, dtype=dtype).tobytes()


class _Outputs:
    """One inference response: its outputs by name, decoded on demand."""

    def __init__(self, response: Any) -> None:
        self.model_version = str(response.model_version)
        self._by_name = {
            output.name: (output, raw)
            for output, raw in zip(response.outputs, response.raw_output_contents, strict=True)
        }

    def names(self) -> list[str]:
        return list(self._by_name)

    def rows(self, name: str) -> list[Any]:
        """A [batch, n] output as one list per row (BYTES rows as bytes)."""
        array = self.array(name)
        return array.tolist() if array.dtype != np.object_ else [list(row) for row in array]

    def array(self, name: str) -> np.ndarray[Any, Any]:
        output, raw = self._by_name[name]
        shape = tuple(int(d) for d in output.shape)
        if output.datatype == "BYTES":
            return np.array(_bytes_elements(raw), dtype=np.object_).reshape(shape)
        dtype = np.dtype(triton_to_np_dtype(output.datatype)).newbyteorder("<")
        return np.frombuffer(raw, dtype=dtype).reshape(shape)

    def tensor(self, name: str) -> Tensor:
        return Tensor(name, self._by_name[name][0].datatype, self.array(name))


def _classifications(result: _Outputs, truncated: Sequence[bool] | None = None) -> list[Classification]:
    """One Classification per row of an ensemble's LABELS, SCORES and CLASS_IDS."""
    scores = result.rows("SCORES")
    cuts: Sequence[bool | None] = truncated if truncated is not None else [None] * len(scores)
    return [
        Classification(
            predictions=[
                ScoredLabel(label=label, score=float(score), class_id=int(class_id))
                for label, score, class_id in zip(_strings(labels), row, ids, strict=True)
            ],
            model_version=result.model_version,
            truncated=None if cut is None else bool(cut),
        )
        for labels, row, ids, cut in zip(
            result.rows("LABELS"), scores, result.rows("CLASS_IDS"), cuts, strict=True
        )
    ]


class TritonBackend:
    """Implements :class:`gateway.backend.InferenceBackend` over ``tritonclient.grpc.aio``.

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
        self._model_infer = service_pb2_grpc.GRPCInferenceServiceStub(self._channel).ModelInfer
        self._signatures: dict[tuple[str, str], tuple[float, ModelSignature]] = {}
        # Triton's gRPC front end expects a restricted protocol's header under this prefix.
        key = settings.repository_key.get_secret_value()
        self._repository_headers = {f"triton-grpc-protocol-{REPOSITORY_KEY_HEADER}": key} if key else {}
        self._breaker = CircuitBreaker(on_change=lambda state: metrics.circuit.state(state.value))
        self._probe_task = asyncio.create_task(self._probe_loop(), name="triton-probe")

    async def close(self) -> None:
        self._probe_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._probe_task
        await self._client.close()
        await self._channel.close()

    async def _probe_once(self) -> bool:
        try:
            return bool(
                await self._client.is_server_ready(client_timeout=self._settings.probe_timeout_seconds)
            )
        except InferenceServerException:
            return False

    async def _probe_loop(self) -> None:
        """Feeds the breaker: Triton's readiness every interval, or at once when a call failed."""
        while True:
            self._breaker.on_probe(await self._probe_once())
            self._breaker.wake.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._settings.probe_interval_seconds):
                    await self._breaker.wake.wait()

    def _admit(self, model: str) -> None:
        """Fail fast while Triton is known to be down."""
        if not self._breaker.allow():
            self._metrics.triton_failures.labels(model=model, code="CIRCUIT_OPEN").inc()
            raise TritonUnavailableError(
                "Triton is unavailable", headers={"Retry-After": str(self._settings.retry_after_seconds)}
            )

    @contextlib.contextmanager
    def _circuit(self, model: str) -> Iterator[None]:
        """Around one request's Triton calls: refused at once while the circuit is open;
        its outcome (whatever it is, cancellation included) is reported to the breaker, so
        a half-open trial always concludes."""
        self._admit(model)
        try:
            yield
        except (TritonUnavailableError, TritonTimeoutError):
            self._breaker.on_unreachable()
            raise
        except BaseException:
            self._breaker.on_other_outcome()
            raise
        else:
            self._breaker.on_success()

    def _error(
        self, exc: InferenceServerException, model: str, what: str, invalid: InvalidInputError | None = None
    ) -> GatewayError:
        logger.warning("triton %s on %s: %s", exc.status(), what, exc.message())
        code = (exc.status() or "UNKNOWN").removeprefix("StatusCode.")
        self._metrics.triton_failures.labels(model=model, code=code).inc()
        error = map_triton_error(exc, retry_after=self._settings.retry_after_seconds, invalid=invalid)
        error.__cause__ = exc
        return error

    async def _infer(
        self,
        model: str,
        version: str,
        inputs: Sequence[Tensor],
        request_id: str,
        outputs: Sequence[str] = (),
    ) -> _Outputs:
        """One inference call: timed, traced (its ``traceparent`` goes along as gRPC
        metadata, so Triton's spans join the request's trace), under the call deadline.
        gRPC errors come out as tritonclient's InferenceServerException (status, message)."""
        request = service_pb2.ModelInferRequest(model_name=model, model_version=version, id=request_id)
        nbytes = 0
        for tensor in inputs:
            entry = request.inputs.add()
            entry.name, entry.datatype = tensor.name, tensor.datatype
            entry.shape.extend(tensor.shape)
            raw = _contents(tensor)
            nbytes += len(raw)
            request.raw_input_contents.append(raw)
        for name in outputs:
            request.outputs.add().name = name
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
                grpc_status(str(rpc_error.code()))
                raise InferenceServerException(
                    msg=rpc_error.details() or "", status=str(rpc_error.code())
                ) from None
            grpc_status("OK")
            return _Outputs(response)

    async def _classify_one(
        self, model: str, version: str, data: bytes, top_k: int, request_id: str
    ) -> Classification:
        inputs = [
            Tensor("IMAGE", "BYTES", np.array([[data]], dtype=np.object_)),
            Tensor("TOP_K", "INT32", np.array([[top_k]], dtype=np.int32)),
        ]
        return _classifications(await self._infer(model, version, inputs, request_id))[0]

    async def classify_images(
        self, model: str, version: str, images: Sequence[bytes], top_k: int, request_id: str
    ) -> list[Classification]:
        # One Triton request per input: Triton's dynamic batcher merges them into one
        # batch, and a bad input fails only its own request, so the error names it.
        with self._circuit(model):
            outcomes = await asyncio.gather(
                *(self._classify_one(model, version, data, top_k, request_id) for data in images),
                return_exceptions=True,
            )
            return self._collect(model, request_id, outcomes)

    def _collect(self, model: str, request_id: str, outcomes: list[Any]) -> list[Classification]:
        """Per-image outcomes -> the results in order, or the most actionable error."""
        results: list[Classification] = []
        failures: list[tuple[int, GatewayError]] = []
        for index, outcome in enumerate(outcomes):
            if isinstance(outcome, InferenceServerException):
                failures.append(
                    (index, self._error(outcome, model, f"input {index} of request {request_id}"))
                )
            elif isinstance(outcome, BaseException):
                raise outcome
            else:
                results.append(outcome)
        if not failures:
            return results
        upstream = [(i, e) for i, e in failures if not isinstance(e, InvalidImageError)]
        if upstream:
            index, error = max(upstream, key=lambda pair: _SEVERITY.get(type(pair[1]), 0))
            raise error
        index, error = failures[0]
        error.errors = [{"input_index": i, "detail": e.detail} for i, e in failures]
        raise error.at(index)

    async def classify_texts(
        self,
        model: str,
        version: str,
        texts: Sequence[str],
        top_k: int,
        candidate_labels: Sequence[str] | None,
        request_id: str,
    ) -> list[Classification]:
        # Texts go as one batch: the tokenizer pads to the longest of them, and they
        # were validated here, so there is no bad input to isolate.
        count = len(texts)
        inputs = [
            Tensor("TEXT", "BYTES", np.array([[t.encode("utf-8")] for t in texts], dtype=np.object_)),
            Tensor("TOP_K", "INT32", np.full((count, 1), top_k, dtype=np.int32)),
        ]
        if candidate_labels is not None:
            row = [label.encode("utf-8") for label in candidate_labels]
            inputs.append(Tensor("CANDIDATE_LABELS", "BYTES", np.array([row] * count, dtype=np.object_)))
        with self._circuit(model):
            try:
                result = await self._infer(model, version, inputs, request_id)
            except InferenceServerException as exc:
                invalid = InvalidInputError("the text model rejected the input")
                raise self._error(exc, model, f"request {request_id}", invalid) from exc
        return _classifications(result, truncated=result.array("TRUNCATED").reshape(-1).tolist())

    async def model_signature(self, model: str, version: str) -> ModelSignature:
        """The model's inputs and outputs from Triton's metadata, kept for a short while
        (``signature_ttl_seconds``): every OIP request is checked against it."""
        key = (model, version)
        cached = self._signatures.get(key)
        now = asyncio.get_running_loop().time()
        if cached is not None and cached[0] > now:
            return cached[1]
        self._admit(model)
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
            if exc.status() == "StatusCode.NOT_FOUND":  # metadata of a model or version Triton lacks
                raise NotFoundError("there is no such model version") from exc
            raise self._error(exc, model, f"metadata of {model}") from exc

        optional = {item.name for item in config.input if item.optional}

        def specs(tensors: Any) -> tuple[TensorSpec, ...]:
            return tuple(
                TensorSpec(t.name, t.datatype, tuple(int(d) for d in t.shape), t.name in optional)
                for t in tensors
            )

        signature = ModelSignature(
            name=metadata.name,
            versions=tuple(metadata.versions),
            platform=metadata.platform,
            inputs=specs(metadata.inputs),
            outputs=specs(metadata.outputs),
        )
        self._signatures[key] = (now + SIGNATURE_TTL_SECONDS, signature)
        return signature

    async def infer_tensors(
        self, model: str, version: str, inputs: Sequence[Tensor], outputs: Sequence[str], request_id: str
    ) -> tuple[str, list[Tensor]]:
        """One inference on checked tensors; returns the version that answered and the
        outputs (all of the model's when none are named)."""
        with self._circuit(model):
            try:
                result = await self._infer(model, version, inputs, request_id, outputs)
            except InferenceServerException as exc:
                self._signatures.pop((model, version), None)  # the model may have changed
                invalid = InvalidInputError("the model rejected the input")
                raise self._error(exc, model, f"request {request_id}", invalid) from exc
        return result.model_version, [result.tensor(name) for name in result.names()]

    async def label_set(self, model: str) -> list[str] | None:
        query = grpcclient.InferInput("QUERY", [1], "INT32")
        query.set_data_from_numpy(np.zeros(1, dtype=np.int32))
        try:
            result = await self._client.infer(
                model, [query], client_timeout=self._settings.health_timeout_seconds
            )
        except InferenceServerException:
            return None
        return _strings(result.as_numpy("LABELS"))

    async def repository_index(self) -> list[RepositoryModel]:
        self._admit("")  # known down: refused at once
        try:
            index = await self._client.get_model_repository_index(
                headers=self._repository_headers, client_timeout=self._settings.health_timeout_seconds
            )
        except InferenceServerException as exc:
            raise self._error(exc, "", "repository index") from exc
        return [RepositoryModel(m.name, m.version, m.state, m.reason) for m in index.models]

    async def load_model(self, model: str) -> None:
        try:
            await self._client.load_model(
                model, headers=self._repository_headers, client_timeout=self._settings.load_timeout_seconds
            )
        except InferenceServerException as exc:
            if exc.status() in _UNAVAILABLE | _TIMEOUT and "load" not in (exc.message() or ""):
                raise self._error(exc, model, f"load of {model}") from exc
            logger.warning("triton could not load %s: %s", model, exc.message())
            raise ModelLoadError(f"Triton could not load {model}: {exc.message()}"[:1000]) from exc
        finally:
            self._signatures.clear()  # what a model accepts may have changed

    async def unload_model(self, model: str, *, dependents: bool) -> None:
        try:
            await self._client.unload_model(
                model,
                headers=self._repository_headers,
                unload_dependents=dependents,
                client_timeout=self._settings.load_timeout_seconds,
            )
        except InferenceServerException as exc:
            raise self._error(exc, model, f"unload of {model}") from exc
        finally:
            self._signatures.clear()

    async def server_status(self) -> ServerStatus:
        if self._breaker.state is CircuitState.OPEN:
            return ServerStatus(live=False)  # known down: /readyz answers at once
        timeout = self._settings.health_timeout_seconds
        try:
            live = bool(await self._client.is_server_live(client_timeout=timeout))
            metadata = await self._client.get_server_metadata(client_timeout=timeout)
        except InferenceServerException:
            return ServerStatus(live=False)
        return ServerStatus(live=live, version=str(metadata.version))

    async def model_status(self, model: str, version: str) -> ModelStatus:
        if self._breaker.state is CircuitState.OPEN:
            return ModelStatus(name=model, ready=False)
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
