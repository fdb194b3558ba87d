"""One call's entry in the prediction log (gateway.observe.predictionlog), whichever door
it came through and whichever protocol it spoke.

A door opens :func:`logged` around the call; the dispatcher notes what it read (a
``/classify`` payload, or the Open Inference Protocol tensors of ``/v2`` and the gRPC
door) and what answered (the classifications, or a classifier's SCORES and LABELS) on
the call's :class:`LogEntry`. The record is built only when the call is sampled: its
inputs' digests (SHA-256, size; the inputs themselves only up to the log's capture size),
the model, version, route, status, latency, key id and trace id, and the predictions.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext
from dataclasses import dataclass, field
from time import perf_counter
from typing import TYPE_CHECKING, Any, Protocol

from gateway.errors import GatewayError
from gateway.observe.predictionlog import InputDigest, PredictionLog, PredictionRecord
from gateway.observe.tracing import current_trace_id

if TYPE_CHECKING:
    from gateway.serving.caller import Caller
    from gateway.serving.payload import ClassifyInput
    from gateway.triton.backend import Classification
    from gateway.triton.tensors import Tensor

LABELS = "LABELS"
SCORES = "SCORES"


class LoggedCall(Protocol):
    """What the log reads of a call (gateway.serving.dispatch.Call)."""

    request_id: str
    started: float
    caller: Caller | None
    logged: LogEntry | None

    @property
    def model(self) -> str | None: ...


@dataclass
class LogEntry:
    """What a call read and what answered it, as the dispatcher saw it (kept as it is:
    digests are computed only for a sampled call)."""

    payload: ClassifyInput | None = None
    tensors: Sequence[Tensor] = ()
    model: str = ""
    version: str = ""
    classifications: list[Classification] | None = None
    outputs: dict[str, Tensor] = field(default_factory=dict)

    def inputs(self, capture: int) -> list[InputDigest]:
        if self.payload is not None:
            digests = [InputDigest.of(image, capture) for image in self.payload.images]
            return digests + [InputDigest.of(t.encode(), capture, text=True) for t in self.payload.texts]
        digests = []
        for tensor in self.tensors:
            if tensor.datatype == "BYTES":  # each element (an image, a text) on its own
                digests += [
                    InputDigest.of(bytes(item), capture, text=_is_text(item))
                    for item in tensor.array.reshape(-1)
                ]
            else:
                digests.append(InputDigest.of(tensor.raw(), capture))
        return digests

    def predictions(self) -> list[list[dict[str, Any]]] | None:
        if self.classifications is not None:
            return [
                [{"label": p.label, "score": p.score} for p in c.predictions] for c in self.classifications
            ]
        scores = self.outputs.get(SCORES)
        if scores is None or scores.array.ndim != 2 or scores.datatype == "BYTES":
            return None  # not a classifier's scores (or the classification extension's strings)
        labels = self.outputs.get(LABELS)
        rows: list[list[dict[str, Any]]] = []
        for index, row in enumerate(scores.array.tolist()):
            names = None if labels is None else labels.array[index].tolist()
            rows.append(
                [
                    {"score": score} if names is None else {"label": _text(names[i]), "score": score}
                    for i, score in enumerate(row)
                ]
            )
        return rows


def _is_text(value: bytes) -> bool:
    try:
        value.decode()
    except UnicodeDecodeError:
        return False  # an image (kept in base64)
    return True


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _record(
    entry: LogEntry,
    call: LoggedCall,
    route: str,
    status: int,
    error: str | None,
    trace_id: str | None,
    capture: int,
) -> PredictionRecord:
    return PredictionRecord(
        request_id=call.request_id,
        model=entry.model or call.model or "",
        route=route,
        status=status,
        latency_seconds=round(perf_counter() - call.started, 6),
        client=None if call.caller is None else call.caller.client,
        version=entry.version,
        inputs=entry.inputs(capture),
        predictions=None if error is not None else entry.predictions(),
        error=error,
        trace_id=trace_id,
    )


# What a call is wrapped in when the log is off: nothing, and nothing made per call.
_OFF: AbstractAsyncContextManager[None] = nullcontext()


def logged(log: PredictionLog, call: LoggedCall, route: str) -> AbstractAsyncContextManager[None]:
    """The call, offered to the prediction log when sampled (its refusal with its status
    and kind); nothing is kept when the log is off."""
    return _logged(log, call, route) if log.enabled else _OFF


@asynccontextmanager
async def _logged(log: PredictionLog, call: LoggedCall, route: str) -> AsyncIterator[None]:
    entry = call.logged = LogEntry()
    trace_id = current_trace_id()
    client = None if call.caller is None else call.caller.client
    try:
        yield
    except GatewayError as exc:
        if log.sampled(call.request_id, True, client, trace_id):
            log.offer(_record(entry, call, route, exc.status, exc.slug, trace_id, log.capture))
        raise
    if log.sampled(call.request_id, False, client, trace_id):
        log.offer(_record(entry, call, route, 200, None, trace_id, log.capture))
