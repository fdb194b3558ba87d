"""The gateway's only contact with OpenTelemetry: spans for a request, its steps and its
Triton calls, W3C Trace Context in (HTTP headers) and out (gRPC metadata to Triton).

Off by default. When off, :class:`Tracing` holds no provider, every span is a shared no-op
context and no ``traceparent`` goes to Triton: nothing is allocated per request. When on,
spans go through a batching processor to an OTLP/HTTP exporter on its own thread, so a
slow or dead collector costs the request nothing (a full queue drops spans, never waits).

Sampling is parent-based: a caller's sampled flag is honoured; a request without one
starts a trace sampled at ``sample_ratio``. Only sampled calls carry ``traceparent`` to
Triton, which is started with ``rate=0`` so it traces exactly those (see
:func:`triton_trace_args`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import Span, SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from gateway import __version__
from gateway.settings import TracingSettings

_PROPAGATOR = TraceContextTextMapPropagator()
_CONTEXT_HEADERS = (b"traceparent", b"tracestate")
_NO_SPAN = contextlib.nullcontext(trace.INVALID_SPAN)
_NO_METADATA: contextlib.nullcontext[None] = contextlib.nullcontext(None)


def current_trace() -> tuple[str | None, bool]:
    """The trace id (32 hex digits) of the request being handled, or None (tracing off),
    and whether that trace is recorded (an exemplar worth keeping)."""
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None, False
    return trace.format_trace_id(context.trace_id), context.trace_flags.sampled


def current_trace_id() -> str | None:
    """The trace id of the request being handled, or None (tracing off)."""
    return current_trace()[0]


def describe_server_span(span: Span, method: str, route: str, status: int) -> None:
    """Name the server span after the route template that answered (HTTP semconv), with
    the status code; a 5xx is the server's error, a 4xx the client's (status left unset)."""
    if not span.is_recording():
        return
    span.update_name(f"{method} {route}")
    span.set_attribute("http.route", route)
    span.set_attribute("http.response.status_code", status)
    if status >= 500:
        span.set_status(Status(StatusCode.ERROR))


def record_problem(problem_type: str, status: int) -> None:
    """Mark the current span with the problem a client was answered with (never its input)."""
    span = trace.get_current_span()
    if not span.is_recording():
        return
    span.set_attribute("error.type", problem_type)
    if status >= 500:
        span.set_status(Status(StatusCode.ERROR, problem_type))


def triton_trace_args(settings: TracingSettings, service_name: str = "triton-inference-server") -> list[str]:
    """``tritonserver`` flags that make Triton export its spans to the same collector, for
    exactly the requests the gateway sends a ``traceparent`` with (``rate=0``: no trace of
    its own choosing). Empty when tracing is off: Triton then traces nothing."""
    if not settings.enabled:
        return []
    return [
        "--trace-config=mode=opentelemetry",
        f"--trace-config=opentelemetry,url={settings.endpoint}",
        f"--trace-config=opentelemetry,resource=service.name={service_name}",
        "--trace-config=opentelemetry,bsp_schedule_delay=1000",
        "--trace-config=rate=0",
        "--trace-config=count=-1",
        "--trace-config=level=TIMESTAMPS",
    ]


class Tracing:
    """Spans for the app: no-ops until :meth:`start` (in the lifespan) builds the provider,
    and for good when tracing is off."""

    def __init__(self, settings: TracingSettings) -> None:
        self.settings = settings
        self._provider: TracerProvider | None = None
        self._tracer: trace.Tracer | None = None

    def start(self) -> None:
        """Build the provider and its exporter thread (tracing on only)."""
        settings = self.settings
        if not settings.enabled or self._provider is not None:
            return
        self._provider = TracerProvider(
            resource=Resource.create({"service.name": settings.service_name, "service.version": __version__}),
            sampler=ParentBased(TraceIdRatioBased(settings.sample_ratio)),
        )
        exporter = OTLPSpanExporter(endpoint=settings.endpoint, timeout=settings.export_timeout_seconds)
        self._provider.add_span_processor(
            BatchSpanProcessor(
                exporter,
                max_queue_size=settings.max_queued_spans,
                schedule_delay_millis=settings.export_delay_seconds * 1000,
                export_timeout_millis=settings.export_timeout_seconds * 1000,
            )
        )
        self._tracer = self._provider.get_tracer("triton-gateway", __version__)

    def shutdown(self) -> None:
        """Flush what is queued (bounded by the export timeout) and stop the exporter thread."""
        provider, self._provider, self._tracer = self._provider, None, None
        if provider is not None:
            provider.shutdown()

    def server_span(self, method: str, path: str, headers: list[tuple[bytes, bytes]]) -> Any:
        """The request's SERVER span, continuing the caller's trace when it sent one.
        ``method`` and ``path`` are the client's input: pass them bounded."""
        if self._tracer is None:
            return _NO_SPAN
        if not self.settings.trust_inbound:
            headers = []  # the caller's context is not ours to continue (tracing.trust_inbound)
        carrier = {
            name.decode("latin-1"): value.decode("latin-1")
            for name, value in headers
            if name in _CONTEXT_HEADERS
        }
        parent = _PROPAGATOR.extract(carrier) if carrier else None
        return self._tracer.start_as_current_span(
            method,
            context=parent,
            kind=SpanKind.SERVER,
            attributes={"http.request.method": method, "url.path": path},
            record_exception=False,
            set_status_on_exception=False,
        )

    def span(self, name: str, attributes: Mapping[str, Any] | None = None) -> Any:
        """An INTERNAL span for one step of the request (reading the body, validation...)."""
        if self._tracer is None:
            return _NO_SPAN
        return self._tracer.start_as_current_span(
            name, attributes=attributes, record_exception=False, set_status_on_exception=False
        )

    def triton_call(
        self, model: str, version: str, inputs: int, request_bytes: int
    ) -> contextlib.AbstractContextManager[dict[str, str] | None]:
        """A CLIENT span around one gRPC inference call; gives the gRPC metadata that carries
        its ``traceparent`` to Triton (None when there is nothing to send). Record the
        outcome with :meth:`grpc_status`. Tracing off, no generator is made (the hot path)."""
        if self._tracer is None:
            return _NO_METADATA
        return self._triton_call(self._tracer, model, version, inputs, request_bytes)

    @staticmethod
    @contextlib.contextmanager
    def _triton_call(
        tracer: trace.Tracer, model: str, version: str, inputs: int, request_bytes: int
    ) -> Iterator[dict[str, str] | None]:
        attributes: dict[str, str | int] = {
            "rpc.system": "grpc",
            "rpc.service": "inference.GRPCInferenceService",
            "rpc.method": "ModelInfer",
            "triton.model.name": model,
            "triton.model.version": version or "latest",
            "triton.inputs": inputs,
            "triton.request.bytes": request_bytes,
        }
        with tracer.start_as_current_span(
            f"triton {model} infer",
            kind=SpanKind.CLIENT,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            metadata: dict[str, str] = {}
            if span.get_span_context().trace_flags.sampled:
                _PROPAGATOR.inject(metadata)
            yield metadata or None


def grpc_status(name: str, code: int) -> None:
    """Record a Triton call's gRPC status on the current span: its name (``UNAVAILABLE``)
    and its number (14), both from ``grpc.StatusCode`` at the Triton boundary."""
    span: Span = trace.get_current_span()
    if not span.is_recording():
        return
    span.set_attribute("rpc.grpc.status_code", code)
    if name != "OK":
        span.set_status(Status(StatusCode.ERROR, name))
