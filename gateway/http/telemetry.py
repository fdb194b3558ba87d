"""The one per-request middleware: the HTTP door's opening of the call scope
(gateway.serving.scope: the request id, the server span, the in-flight gauge and the
outcome, the same as the gRPC door's) and the headers every answer carries
(gateway.http.requestid).

A pure ASGI middleware, so it sees every response, including errors, and counts body
bytes as they arrive. Routes are labelled by their template (``/classify``), read from
the scope once the router has matched, and unmatched paths as ``<unmatched>``, so label
values stay bounded. The model label is whatever the route handler put in
``request.state.model``.
"""

from __future__ import annotations

from collections.abc import Sequence

from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.http.requestid import add_response_headers
from gateway.observe.metrics import GatewayMetrics
from gateway.observe.outcome import CLIENT_GONE
from gateway.observe.tracing import Tracing
from gateway.serving.admission import Admission
from gateway.serving.caller import Caller
from gateway.serving.scope import CallScope

UNMATCHED = "<unmatched>"
# The method is the client's input: anything else is one label value.
KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
OTHER_METHOD = "other"


def method_label(method: str) -> str:
    return method if method in KNOWN_METHODS else OTHER_METHOD


def route_template(scope: Scope, routes: Sequence[BaseRoute] = ()) -> str:
    """The template of the route that handled the request (the router records it in the
    scope), so /classify?x and /classify/ variants never become new label values. A request
    refused before the router ran (no key, its rate) is labelled by the route it asked for,
    as the gRPC door labels a refused call by its method: found among ``routes``."""
    route = scope.get("route")
    if route is None:
        route = next((r for r in routes if r.matches(scope)[0] is Match.FULL), None)
    path = getattr(route, "path", None)
    return path if isinstance(path, str) else UNMATCHED


class TelemetryMiddleware:
    """Gives the request its id (and an anonymous caller until the caller pipeline names
    it), wraps it in its server span and records its outcome (gateway.observe.outcome);
    outermost, so everything inside (auth included) is counted. A client that went away
    before its answer began is counted as 499, whatever the app answered into the void."""

    def __init__(
        self,
        app: ASGIApp,
        metrics: GatewayMetrics,
        tracing: Tracing,
        admission: Admission | None = None,
        routes: Sequence[BaseRoute] = (),
    ) -> None:
        self.app = app
        self.routes = routes  # the app's, to label a request refused before the router
        self.metrics = metrics
        self.tracing = tracing
        self.admission = admission

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method = method_label(scope["method"])
        call = CallScope(self.metrics, self.tracing, method, scope.get("path", ""), scope.get("headers", []))
        status = 500
        received = 0
        answered = gone = False
        request_id = call.request_id
        state = scope.setdefault("state", {})
        state["request_id"] = request_id
        state["caller"] = Caller(request_id)
        admission = self.admission

        async def counting_receive() -> Message:
            nonlocal received, gone
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
            elif message["type"] == "http.disconnect" and not answered:
                gone = True
            return message

        async def status_send(message: Message) -> None:
            nonlocal status, answered
            if message["type"] == "http.response.start":
                status = int(message["status"])
                answered = True
                add_response_headers(message, request_id, admission is not None and admission.draining)
            await send(message)

        error: BaseException | None = None
        try:
            await self.app(scope, counting_receive, status_send)
        except BaseException as raised:
            error = raised
            raise
        finally:
            call.close(
                route_template(scope, self.routes),
                CLIENT_GONE if gone else status,
                str(state.get("model", "")),
                received,
                error,
            )
