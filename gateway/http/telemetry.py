"""The one per-request middleware: the request id and the headers every answer carries
(gateway.http.requestid), the request metrics, the request's server span (when tracing is on)
and one structured access-log line.

A pure ASGI middleware, so it sees every response, including errors, and counts body
bytes as they arrive. The latency histogram carries the trace id as an exemplar for
sampled requests, and the access log line carries it for every traced one. Routes are labelled by their template (``/classify``), read from the
scope once the router has matched, and unmatched paths as ``<unmatched>``, so label
values stay bounded. The model label is whatever the
route handler put in ``request.state.model``.
"""

from __future__ import annotations

import logging
from time import perf_counter

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.http.requestid import add_response_headers, request_id_of_scope
from gateway.observe.metrics import GatewayMetrics
from gateway.observe.tracing import Tracing, current_trace, describe_server_span
from gateway.serving.admission import Admission

access_log = logging.getLogger("gateway.access")
UNMATCHED = "<unmatched>"
# The method is the client's input: anything else is one label value.
KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
OTHER_METHOD = "other"


def method_label(method: str) -> str:
    return method if method in KNOWN_METHODS else OTHER_METHOD


def route_template(scope: Scope) -> str:
    """The template of the route that handled the request (the router records it in the
    scope), so /classify?x and /classify/ variants never become new label values."""
    route = scope.get("route")
    path = getattr(route, "path", None)
    return path if isinstance(path, str) else UNMATCHED


class TelemetryMiddleware:
    """Gives the request its id, records its metrics, wraps it in its server span, writes
    the access log line; outermost, so everything inside (auth included) is counted."""

    def __init__(
        self, app: ASGIApp, metrics: GatewayMetrics, tracing: Tracing, admission: Admission | None = None
    ) -> None:
        self.app = app
        self.metrics = metrics
        self.tracing = tracing
        self.admission = admission

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = perf_counter()
        status = 500
        received = 0
        request_id = request_id_of_scope(scope)
        scope.setdefault("state", {})["request_id"] = request_id
        admission = self.admission

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
            return message

        async def status_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
                add_response_headers(message, request_id, admission is not None and admission.draining)
            await send(message)

        method = method_label(scope["method"])
        with self.tracing.server_span(method, scope.get("path", "")[:200], scope.get("headers", [])) as span:
            self.metrics.in_flight.inc()
            try:
                await self.app(scope, counting_receive, status_send)
            finally:
                self.metrics.in_flight.dec()
                elapsed = perf_counter() - started
                route = route_template(scope)
                describe_server_span(span, method, route, status)
                self._record(scope, method, route, status, elapsed, received)

    def _record(
        self, scope: Scope, method: str, route: str, status: int, elapsed: float, received: int
    ) -> None:
        state = scope.get("state", {})
        model = str(state.get("model", ""))
        request_id = state.get("request_id", "")
        trace_id, sampled = current_trace()
        metrics = self.metrics
        metrics.child(metrics.requests, route, method, str(status), model).inc()
        metrics.child(metrics.request_duration, route, method, model).observe(
            elapsed, exemplar={"trace_id": trace_id} if sampled and trace_id else None
        )
        if method in ("POST", "PUT", "PATCH"):
            metrics.child(metrics.request_body, route).observe(received)
        access_log.info(
            "%s %s %d %.1f ms request_id=%s%s",
            method,
            route,
            status,
            elapsed * 1000,
            request_id,
            f" trace_id={trace_id}" if trace_id else "",
            extra={
                "request_id": request_id,
                "trace_id": trace_id or "",
                "method": method,
                "route": route,
                "path": scope.get("path", "")[:200],
                "status": status,
                "model": model,
                "duration_ms": round(elapsed * 1000, 3),
                "body_bytes": received,
            },
        )
