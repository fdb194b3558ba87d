"""Compressed inference answers on the Open Inference Protocol routes, as Triton's own HTTP
endpoint gives them: gzip (or deflate's absence: Starlette's middleware speaks gzip) when
the client's ``Accept-Encoding`` asks for it. Only ``.../infer`` answers: the one answer
every Triton client unzips (``tritonclient.http.aio`` reads a configuration or statistics
answer as plain JSON, whatever it asked for, and fails on a gzipped one). Compressed request bodies are read by
:mod:`gateway.http.bodies` (every route), with the body cap applied to what they expand to.
"""

from __future__ import annotations

from starlette.middleware.gzip import GZipMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.http.paths import is_oip_infer

# Smaller answers cost more to compress than they save.
MINIMUM_SIZE = 512


class OipCompression:
    """Pure ASGI: gzip for ``/v2`` inference answers when asked; every other route untouched."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.gzip = GZipMiddleware(app, minimum_size=MINIMUM_SIZE)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope["path"] if scope["type"] == "http" else ""
        if is_oip_infer(path):
            await self.gzip(scope, receive, send)
        else:
            await self.app(scope, receive, send)
