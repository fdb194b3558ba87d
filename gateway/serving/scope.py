"""One call's scope, the same beneath both doors: from its first byte to its outcome.

Opened when a request's head or an RPC's metadata arrives, closed once its answer is
given; what it holds is what every door owes every call, so a door added later inherits
it by opening one:

- the request id (the caller's ``X-Request-ID`` when it is a sane one, else a new one);
- the SERVER span, continuing the caller's trace where ``tracing.trust_inbound`` allows;
- ``gateway_requests_in_flight`` while it is open;
- its outcome recorded once (gateway.observe.outcome: the request counter and latency
  histogram by route, method, status and model, the body size, one access-log line), the
  span named and given its status.

The HTTP door opens one in its outermost middleware (gateway.http.telemetry), the gRPC door
one per call and per stream message (gateway.rpc.door). A door decides only what differs:
the route it names (a template, an RPC's full name), its status (HTTP's, or the refusal's
for gRPC) and when the caller went away.
"""

from __future__ import annotations

from time import perf_counter
from typing import Any

from gateway.observe.metrics import GatewayMetrics
from gateway.observe.outcome import Outcome, record
from gateway.observe.tracing import Tracing, describe_server_span
from gateway.serving.caller import request_id_of

Headers = list[tuple[bytes, bytes]]


class CallScope:
    """One open call (a class with slots, not a context-manager generator: both doors
    open one per call, and a generator's frame costs a few microseconds more)."""

    __slots__ = ("_metrics", "_span_scope", "closed", "method", "path", "request_id", "span", "started")

    def __init__(
        self,
        metrics: GatewayMetrics,
        tracing: Tracing,
        method: str,
        path: str,
        headers: Headers,
        request_id: str | None = None,
        started: float | None = None,
    ) -> None:
        """Open a call of ``method`` (bounded: an HTTP method label or ``GRPC``) for ``path``
        (the client's input, logged and cut to 200 characters, never a label); its
        ``request_id`` and ``started`` where the door has them already (a head refused
        in the protocol), else from ``headers`` and now."""
        self.started = perf_counter() if started is None else started
        self._metrics = metrics
        self.method = method
        self.path = path[:200]
        self.request_id = request_id_of(headers) if request_id is None else request_id
        self.closed = False
        self._span_scope = tracing.server_span(method, self.path, headers)
        self.span: Any = self._span_scope.__enter__()
        metrics.in_flight.inc()

    def close(
        self,
        route: str,
        status: int,
        model: str = "",
        body_bytes: int = 0,
        error: BaseException | None = None,
    ) -> None:
        """Record the outcome and end the span (once: a second close does nothing);
        ``route`` a bounded name (a template, an RPC's full name); ``error`` what ended the
        call, if anything did (the span records it)."""
        if self.closed:
            return
        self.closed = True
        try:
            describe_server_span(self.span, self.method, route, status)
            record(
                self._metrics,
                Outcome(
                    route, self.method, status, perf_counter() - self.started,
                    self.request_id, model, self.path, body_bytes,
                ),
            )  # fmt: skip
        finally:
            self._end(error)

    def close_unrecorded(self, error: BaseException | None = None) -> None:
        """End the call without an outcome of its own (a stream's end is no call)."""
        if not self.closed:
            self.closed = True
            self._end(error)

    def _end(self, error: BaseException | None) -> None:
        self._metrics.in_flight.dec()
        if error is None:
            self._span_scope.__exit__(None, None, None)
        else:
            self._span_scope.__exit__(type(error), error, error.__traceback__)
