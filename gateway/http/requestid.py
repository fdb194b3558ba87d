"""X-Request-ID: accepted when well-formed, generated otherwise, echoed on every response
(by the one request middleware, gateway.http.telemetry).

With it go the headers every answer carries: ``X-Content-Type-Options:
nosniff`` and, unless the route chose its own caching, ``Cache-Control: no-store``
(classifications and problems are per request, never for a shared cache); while the
gateway drains, ``Connection: close``, so clients reconnect elsewhere."""

from __future__ import annotations

import re
import uuid

from starlette.types import Message, Scope

HEADER = "X-Request-ID"
# Safe to log and to pass to Triton: no spaces, quotes or control characters.
_VALID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:\-]{0,127}")


def accept_or_generate(candidate: str | None) -> str:
    if candidate is not None and _VALID.fullmatch(candidate):
        return candidate
    return uuid.uuid4().hex


def request_id_of_scope(scope: Scope) -> str:
    """The caller's X-Request-ID if well-formed, else a new one."""
    for name, value in scope.get("headers", []):
        if name == b"x-request-id":
            return accept_or_generate(value.decode("latin-1"))
    return accept_or_generate(None)


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
    if not any(name.lower() == b"cache-control" for name, _ in headers):
        headers.append(_NO_STORE)
    if draining:
        headers.append(_CLOSE)  # draining: no new request on this connection
    message["headers"] = headers
