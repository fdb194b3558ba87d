"""A sampled log of what the models answered, never in a request's way.

A request is sampled once (``sample_rate``, per API key ``key_sample_rates``; failures at
``failure_sample_rate``), from its trace id when it has one, as OpenTelemetry's
``TraceIdRatioBased`` sampler decides (the low 64 bits against the rate): with a log rate
at or under the trace ratio, every logged request has its trace. Without tracing, its
request id decides. Its record (time, request id, trace id, key id, model, version, route,
status, latency, each input's digest and size, the answer's labels and scores) goes into a
bounded queue, and one background task sends it on. A full queue or a sink that fails
drops the record and counts it (``gateway_prediction_log_dropped_total``): the answer and
its latency never wait for the log.

Sinks, by ``url``:
- ``http(s)://``: CloudEvents 1.0 in binary mode, as KServe's payload logger sends them (a
  ``org.kubeflow.serving.inference.request`` and a ``.response`` event, ``ce-id`` the
  request id, the model in ``ce-inferenceservicename``), so a KServe logger consumer
  takes them unchanged (the ``cloudevents`` package is the one boundary);
- ``redis(s)://``: a Redis Stream per model (gateway.shared.streams, built by the app);
- ``file://``: JSON lines, rotated to ``<file>.1`` past ``max_file_bytes``.
Inputs are written as their digest (SHA-256) and size; the inputs themselves only with
``capture_inputs``, each up to ``max_captured_bytes``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit

import httpx

from gateway import jsoncodec

if TYPE_CHECKING:
    from gateway.observe.metrics import GatewayMetrics
    from gateway.settings import PredictionLogSettings

logger = logging.getLogger("gateway.predictionlog")
REQUEST_TYPE = "org.kubeflow.serving.inference.request"
RESPONSE_TYPE = "org.kubeflow.serving.inference.response"


@dataclass(frozen=True)
class InputDigest:
    """What the log says of one input: its SHA-256 and size, and the input itself only
    when the operator opted in (``capture``: at most that many bytes)."""

    sha256: str
    size: int  # bytes
    data: str | None = None  # a text as sent, an image in base64

    @classmethod
    def of(cls, data: bytes, capture: int = 0, text: bool = False) -> InputDigest:
        kept = None
        if 0 < len(data) <= capture:
            kept = data.decode() if text else base64.b64encode(data).decode()
        return cls(hashlib.sha256(data).hexdigest(), len(data), kept)


@dataclass(frozen=True)
class PredictionRecord:
    """One sampled request and its answer (or its failure)."""

    request_id: str
    model: str
    route: str
    status: int
    latency_seconds: float
    client: str | None = None
    version: str = ""
    inputs: list[InputDigest] = field(default_factory=list)
    predictions: list[list[dict[str, Any]]] | None = None  # per input: label, score
    error: str | None = None  # the problem type of a failure
    trace_id: str | None = None
    time: float = field(default_factory=time.time)

    def document(self) -> dict[str, Any]:
        return asdict(self)


class Sink(Protocol):
    async def send(self, record: PredictionRecord) -> None: ...

    async def close(self) -> None: ...


class CloudEventsSink:
    """KServe's payload-logger format: a request and a response event per record."""

    def __init__(self, url: str, timeout: float, source: str) -> None:
        self._url = url
        self._source = source
        self._client = httpx.AsyncClient(timeout=timeout)

    async def send(self, record: PredictionRecord) -> None:
        from cloudevents.core.bindings import http
        from cloudevents.core.v1.event import CloudEvent

        request = {"inputs": [asdict(item) for item in record.inputs], "route": record.route}
        response = {
            key: value
            for key, value in record.document().items()
            if key not in ("inputs", "request_id", "model")
        }
        for kind, data in ((REQUEST_TYPE, request), (RESPONSE_TYPE, response)):
            event = CloudEvent(
                attributes={
                    "type": kind,
                    "source": self._source,
                    "id": record.request_id,
                    "datacontenttype": "application/json",
                    "inferenceservicename": record.model,
                    "component": "predictor",
                    "endpoint": record.version or "latest",
                },
                data=data,
            )
            message = http.to_binary_event(event)
            answer = await self._client.post(self._url, headers=message.headers, content=message.body)
            answer.raise_for_status()

    async def close(self) -> None:
        await self._client.aclose()


class FileSink:
    """JSON lines, rotated once to ``<path>.1`` when the file passes ``max_bytes``."""

    def __init__(self, path: Path, max_bytes: int) -> None:
        self._path = path
        self._max_bytes = max_bytes

    def _write(self, line: bytes) -> None:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            if self._path.stat().st_size + len(line) > self._max_bytes:
                self._path.replace(self._path.with_name(self._path.name + ".1"))
        with self._path.open("ab") as file:
            file.write(line)

    async def send(self, record: PredictionRecord) -> None:
        await asyncio.to_thread(self._write, jsoncodec.dumps(record.document()) + b"\n")

    async def close(self) -> None:
        return None


def make_sink(settings: PredictionLogSettings) -> Sink:
    """The HTTP or file sink of ``settings.url`` (the Redis one is the app's to build:
    gateway.shared is the one importer of redis)."""
    url = settings.url.get_secret_value()
    parts = urlsplit(url)
    if parts.scheme in ("http", "https"):
        return CloudEventsSink(url, settings.timeout_seconds, settings.source)
    if parts.scheme == "file":
        return FileSink(Path(parts.path), settings.max_file_bytes)
    raise ValueError(f"no sink of its own for {parts.scheme}://")


_LOW_64 = 2**64 - 1


def _fraction(request_id: str, trace_id: str | None) -> float:
    """A stable number in [0, 1): the trace id's low 64 bits, as OpenTelemetry's
    TraceIdRatioBased sampler reads them (the log's sample and the traces' are then one
    and the same cut), else a digest of the request id."""
    if trace_id is not None:
        return (int(trace_id, 16) & _LOW_64) / 2**64
    return int.from_bytes(hashlib.blake2b(request_id.encode(), digest_size=8).digest()) / 2**64


class PredictionLog:
    """The sampler, the bounded queue and the sender (started in the app's lifespan)."""

    def __init__(
        self,
        settings: PredictionLogSettings,
        metrics: GatewayMetrics,
        sink_factory: Callable[[PredictionLogSettings], Sink] = make_sink,
    ) -> None:
        self.settings = settings
        rates = (settings.sample_rate, settings.failure_sample_rate, *settings.key_sample_rates.values())
        self.enabled = bool(settings.url.get_secret_value()) and any(rate > 0 for rate in rates)
        self.capture = settings.max_captured_bytes if settings.capture_inputs else 0
        self._make_sink = sink_factory
        self._metrics = metrics
        self._queue: asyncio.Queue[PredictionRecord] | None = None
        self._task: asyncio.Task[None] | None = None
        self._sink: Sink | None = None

    def sampled(
        self, request_id: str, failed: bool, client: str | None = None, trace_id: str | None = None
    ) -> bool:
        """Whether this request is logged: its key's rate (failures: their own), decided
        by its trace id (else its request id)."""
        if failed:
            rate = self.settings.failure_sample_rate
        elif client is not None:
            rate = self.settings.key_sample_rates.get(client, self.settings.sample_rate)
        else:
            rate = self.settings.sample_rate
        return self.enabled and rate > 0 and _fraction(request_id, trace_id) < rate

    def offer(self, record: PredictionRecord) -> None:
        """Queue ``record`` for the sink, or drop it (counted) when the queue is full."""
        if self._queue is None:
            return
        try:
            self._queue.put_nowait(record)
        except asyncio.QueueFull:
            self._metrics.prediction_log_dropped.labels(reason="queue_full").inc()

    def start(self) -> None:
        if not self.enabled:
            return
        self._queue = asyncio.Queue(self.settings.max_queued)
        self._sink = self._make_sink(self.settings)
        self._task = asyncio.create_task(self._send_all(), name="prediction log")

    async def _send_all(self) -> None:
        queue, sink = self._queue, self._sink
        assert queue is not None
        assert sink is not None
        while True:
            record = await queue.get()
            try:
                await sink.send(record)
            except Exception as exc:  # any sink failure drops this record, never the sender
                self._metrics.prediction_log_dropped.labels(reason="sink_error").inc()
                logger.debug("prediction log: a record was dropped (%s)", type(exc).__name__)
            else:
                self._metrics.prediction_log_sent.inc()
            finally:
                queue.task_done()

    async def stop(self) -> None:
        """Send what is queued (bounded by the sink's timeout per record), then stop."""
        if self._task is None:
            return
        queue, sink = self._queue, self._sink
        assert queue is not None
        assert sink is not None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.settings.timeout_seconds * 2):
                await queue.join()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        await sink.close()
