"""A sampled log of what the models answered, never in a request's way.

A request is sampled once, from its request id (``sample_rate``; failures at
``failure_sample_rate``); its record (time, request id, key id, model, version, route,
status, latency, each input's digest and size, the answer's labels and scores) goes into a
bounded queue, and one background task sends it on. A full queue or a sink that fails
drops the record and counts it (``gateway_prediction_log_dropped_total``): the answer and
its latency never wait for the log.

Sinks, by ``url``:
- ``http(s)://``: CloudEvents 1.0 in binary mode, as KServe's payload logger sends them (a
  ``org.kubeflow.serving.inference.request`` and a ``.response`` event, ``ce-id`` the
  request id, the model in ``ce-inferenceservicename``), so a KServe logger consumer
  takes them unchanged (the ``cloudevents`` package is the one boundary);
- ``file://``: JSON lines, rotated to ``<file>.1`` past ``max_file_bytes``.
Inputs are never written, only their digest (SHA-256) and size.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
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
    """What the log says of one input: its SHA-256 and size (never the input itself)."""

    sha256: str
    size: int  # bytes

    @classmethod
    def of(cls, data: bytes) -> InputDigest:
        return cls(hashlib.sha256(data).hexdigest(), len(data))


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
    parts = urlsplit(settings.url)
    if parts.scheme in ("http", "https"):
        return CloudEventsSink(settings.url, settings.timeout_seconds, settings.source)
    return FileSink(Path(parts.path), settings.max_file_bytes)


def _fraction(request_id: str) -> float:
    """A stable number in [0, 1) from the request id: the same request is in or out
    wherever it is asked (the gateway's spans and logs carry the same id)."""
    return int.from_bytes(hashlib.blake2b(request_id.encode(), digest_size=8).digest()) / 2**64


class PredictionLog:
    """The sampler, the bounded queue and the sender (started in the app's lifespan)."""

    def __init__(self, settings: PredictionLogSettings, metrics: GatewayMetrics) -> None:
        self.settings = settings
        self.enabled = bool(settings.url) and (settings.sample_rate > 0 or settings.failure_sample_rate > 0)
        self._metrics = metrics
        self._queue: asyncio.Queue[PredictionRecord] | None = None
        self._task: asyncio.Task[None] | None = None
        self._sink: Sink | None = None

    def sampled(self, request_id: str, failed: bool) -> bool:
        rate = self.settings.failure_sample_rate if failed else self.settings.sample_rate
        return self.enabled and _fraction(request_id) < rate

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
        self._sink = make_sink(self.settings)
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
