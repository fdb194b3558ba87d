"""What a finished call leaves behind, whichever door it came through: the request
counter and latency histogram (``route``, ``method``, ``status``, ``model``), the body
size, and one structured access-log line.

The HTTP door (gateway.http.telemetry) records a request with its route template and
method; the gRPC door (gateway.rpc.door) an RPC with its full method name as the route
and ``GRPC`` as the method. ``status`` is the HTTP status of the outcome on both doors (a
gRPC refusal's code is derived from it), :data:`CLIENT_GONE` for a caller that went away
before its answer (nginx's 499: never a success, never the gateway's fault).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, NamedTuple

from gateway.observe.logs import ACCESS_LOGGER, access_writer
from gateway.observe.metrics import GatewayMetrics
from gateway.observe.tracing import current_trace

ACCESS = ACCESS_LOGGER
access_log = logging.getLogger(ACCESS)
CLIENT_GONE = 499
# The HTTP methods that carry a body (and GRPC's calls, which all do).
BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "GRPC"})


class Outcome(NamedTuple):
    """One finished call (a named tuple: one a request, and a frozen dataclass sets each
    field through ``object.__setattr__``)."""

    route: str  # a route template or an RPC's full name: bounded label values
    method: str
    status: int
    seconds: float
    request_id: str
    model: str = ""  # a catalogued or allow-listed name only
    path: str = ""  # what the client asked for (logged, never a label)
    body_bytes: int = 0


def record(metrics: GatewayMetrics, outcome: Outcome) -> None:
    """Count ``outcome`` and write its access-log line (with the trace id when traced;
    the latency carries it as an exemplar when sampled)."""
    trace_id, sampled = current_trace()
    route, method, model = outcome.route, outcome.method, outcome.model
    series = metrics.call_series(route, method, outcome.status, model)
    series.requests.inc()
    series.duration.observe(
        outcome.seconds, exemplar={"trace_id": trace_id} if sampled and trace_id else None
    )
    if method in BODY_METHODS:
        series.body.observe(outcome.body_bytes)
    if not access_log.isEnabledFor(logging.INFO):
        return
    message = "%s %s %d %.1f ms request_id=%s%s" % (  # noqa: UP031 (logging's own % form, kept)
        method,
        route,
        outcome.status,
        outcome.seconds * 1000,
        outcome.request_id,
        f" trace_id={trace_id}" if trace_id else "",
    )
    writer = access_writer()
    if writer is not None:  # the line the record below would make, without the record
        writer.write(message, _fields(outcome, trace_id) if writer.json else _NO_FIELDS)
        return
    # What Logger.info(message, extra=fields) makes, without its checks of the extra
    # names (these are known).
    line = logging.getLogRecordFactory()(ACCESS, logging.INFO, "", 0, message, None, None)
    line.__dict__.update(_fields(outcome, trace_id))
    access_log.handle(line)


_NO_FIELDS: Mapping[str, Any] = MappingProxyType({})  # (a text line has its fields in its message)


def _fields(outcome: Outcome, trace_id: str | None) -> dict[str, Any]:
    """The access line's fields, as a JSON line or a log record carries them."""
    return {
        "request_id": outcome.request_id,
        "trace_id": trace_id or "",
        "method": outcome.method,
        "route": outcome.route,
        "path": outcome.path[:200],
        "status": outcome.status,
        "model": outcome.model,
        "duration_ms": round(outcome.seconds * 1000, 3),
        "body_bytes": outcome.body_bytes,
    }
