"""X-Request-ID: accepted when well-formed, generated otherwise, echoed on every response.

The same middleware sets the headers every answer carries: ``X-Content-Type-Options:
nosniff`` and, unless the route chose its own caching, ``Cache-Control: no-store``
(classifications and problems are per request, never for a shared cache); while the
gateway drains, ``Connection: close``, so clients reconnect elsewhere."""

from __future__ import annotations

import re
import uuid

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.admission import Admission

HEADER = "X-Request-ID"
# Safe to log and to pass to Triton: no spaces, quotes or control characters.
_VALID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:\-]{0,127}")


def accept_or_generate(candidate: str | None) -> str:
    if candidate is not None and _VALID.fullmatch(candidate):
        return candidate
    return uuid.uuid4().hex


class RequestIdMiddleware:
    """Pure ASGI middleware: puts the id in ``request.state.request_id`` and the response header."""

    def __init__(self, app: ASGIApp, admission: Admission | None = None) -> None:
        self.app = app
        self.admission = admission

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        incoming = None
        for name, value in scope.get("headers", []):
            if name == b"x-request-id":
                incoming = value.decode("latin-1")
                break
        request_id = accept_or_generate(incoming)
        scope.setdefault("state", {})["request_id"] = request_id

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = MutableHeaders(scope=message)
                headers[HEADER] = request_id
                headers["X-Content-Type-Options"] = "nosniff"
                headers.setdefault("Cache-Control", "no-store")
                if self.admission is not None and self.admission.draining:
                    headers["Connection"] = "close"  # draining: no new request on this connection
            await send(message)

        await self.app(scope, receive, send_with_id)
