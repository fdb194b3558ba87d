"""Per-request telemetry: the request metrics and one structured access-log line.

A pure ASGI middleware, so it sees every response, including errors, and counts body
bytes as they arrive. Routes are labelled by their template (``/classify``), read from the
scope once the router has matched, and unmatched paths as ``<unmatched>``, so label
values stay bounded. The model label is whatever the
route handler put in ``request.state.model``.
"""

from __future__ import annotations

import logging
from time import perf_counter

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.metrics import GatewayMetrics

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
    """Records request metrics and writes the access log line."""

    def __init__(self, app: ASGIApp, metrics: GatewayMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = perf_counter()
        status = 500
        received = 0

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
            await send(message)

        self.metrics.in_flight.inc()
        try:
            await self.app(scope, counting_receive, status_send)
        finally:
            self.metrics.in_flight.dec()
            elapsed = perf_counter() - started
            route = route_template(scope)
            state = scope.get("state", {})
            model = str(state.get("model", ""))
            method = method_label(scope["method"])
            self.metrics.requests.labels(route=route, method=method, status=str(status), model=model).inc()
            self.metrics.request_duration.labels(route=route, method=method, model=model).observe(elapsed)
            if method in ("POST", "PUT", "PATCH"):
                self.metrics.request_body.labels(route=route).observe(received)
            access_log.info(
                "%s %s %d %.1f ms",
                method,
                route,
                status,
                elapsed * 1000,
                extra={
                    "request_id": state.get("request_id", ""),
                    "method": method,
                    "route": route,
                    "path": scope.get("path", "")[:200],
                    "status": status,
                    "model": model,
                    "duration_ms": round(elapsed * 1000, 3),
                    "body_bytes": received,
                },
            )
