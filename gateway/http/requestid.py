"""X-Request-ID (decided by the caller pipeline, gateway.serving.caller), echoed on every
response by the one request middleware, gateway.http.telemetry.

With it go the headers every answer carries: ``X-Content-Type-Options:
nosniff`` and, unless the route chose its own caching, ``Cache-Control: no-store``
(classifications and problems are per request, never for a shared cache); while the
gateway drains, ``Connection: close``, so clients reconnect elsewhere."""

from __future__ import annotations

from starlette.types import Message

HEADER = "X-Request-ID"

_NOSNIFF = (b"x-content-type-options", b"nosniff")
_NO_STORE = (b"cache-control", b"no-store")
_CLOSE = (b"connection", b"close")
_REPLACED = frozenset({b"x-request-id", b"x-content-type-options"})
_REPLACED_DRAINING = _REPLACED | {b"connection"}


def add_response_headers(message: Message, request_id: str, draining: bool) -> None:
    """The headers every answer carries (on its ``http.response.start`` message): the
    request id and nosniff replace any the app set, a Cache-Control of the app's stays.
    Raw header pairs (names lower case, as ASGI sends them), not a headers object: this
    runs on every response."""
    replaced = _REPLACED_DRAINING if draining else _REPLACED
    headers = [(name, value) for name, value in message.get("headers", ()) if name.lower() not in replaced]
    headers.append((b"x-request-id", request_id.encode("latin-1")))
    headers.append(_NOSNIFF)
    for name, _ in headers:  # (a loop, not any() over a generator: every answer)
        if name.lower() == b"cache-control":
            break
    else:
        headers.append(_NO_STORE)
    if draining:
        headers.append(_CLOSE)  # draining: no new request on this connection
    message["headers"] = headers
