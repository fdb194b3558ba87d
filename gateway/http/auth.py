"""Optional API keys with per-key rate limits, as one pure ASGI middleware.

Keys are never stored: the keys file (a Kubernetes Secret, say) holds one line per client,
``<id> <sha256 hex of the key> [<requests per second> [<burst>]]``; ``#`` starts a comment.
``triton-gateway hash-key`` prints the hash of a key read from stdin. A request presents
its key as ``Authorization: Bearer <key>`` or ``X-API-Key: <key>``; the hash is compared
with every configured hash in constant time. No key, or an unknown one: 401 problem+json
with ``WWW-Authenticate``. A known key past its rate: 429 with ``Retry-After`` and the IETF
``RateLimit`` / ``RateLimit-Policy`` headers (draft-ietf-httpapi-ratelimit-headers), which
every answer to a limited key carries. Metrics name the key's id, never the key.

``/livez`` and ``/readyz`` are always open (probes carry no keys); ``/metrics`` needs a
key unless configured open, the docs only when configured. ``/admin`` takes admin keys
only (a keys file of its own), checked by :class:`AdminGate` before a byte of its body is
read (FastAPI reads a route's body before its dependencies run): a client key never
opens it, and an admin body has its own small cap and deadline.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

from starlette.datastructures import MutableHeaders
from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.errors import ForbiddenError, GatewayError
from gateway.http.bodies import limited_body
from gateway.http.paths import ADMIN_PREFIX, ALWAYS_OPEN, DOCS_PREFIXES, METRICS
from gateway.http.problems import log_problem, problem_response
from gateway.observe.metrics import GatewayMetrics
from gateway.serving.caller import Caller, CallerGate, missing_key_error
from gateway.shared.certificates import TrustedProxies as ForwardingProxies
from gateway.shared.keyfiles import ApiKey, find_key

if TYPE_CHECKING:
    from gateway.shared.keyfiles import KeyRing


_XFCC = b"x-forwarded-client-cert"


class TrustedProxies:
    """The peers whose ``x-forwarded-client-cert`` is believed (auth.trusted_proxies), on
    a request's scope (gateway.shared.certificates.TrustedProxies: the gRPC door's too)."""

    def __init__(self, networks: list[str]) -> None:
        self._trusted = ForwardingProxies(networks)

    def certified(self, scope: Scope) -> str | None:
        """The forwarded client certificate's name, when a trusted proxy forwarded it
        (401 for one whose name is not usable)."""
        if not self._trusted:
            return None
        client = scope.get("client")
        # every value of the header, in order: the nearest proxy's element is the last
        values = (value for name, value in scope.get("headers", []) if name == _XFCC)
        return self._trusted.certified(client[0] if client else None, values)


def identify(keys: list[ApiKey], scope: Scope) -> ApiKey | None:
    """The key a request presents (``Authorization: Bearer`` or ``X-API-Key``), if it is
    one of ``keys`` (gateway.shared.keyfiles.find_key: the gRPC door's rule too)."""
    return find_key(keys, scope.get("headers", []))


async def refuse(
    metrics: GatewayMetrics, scope: Scope, receive: Receive, send: Send, error: GatewayError
) -> None:
    """Answer ``error`` before the app runs: counted, logged, rendered."""
    metrics.rejections.labels(error.slug).inc()
    request = Request(scope)
    log_problem(request, error)
    await problem_response(error, request)(scope, receive, send)


class AuthMiddleware:
    """The HTTP door's caller: the one caller pipeline (gateway.serving.caller) on the
    request's headers, before anything else runs; the answer carries the caller's rate
    and quota standing."""

    def __init__(
        self,
        app: ASGIApp,
        gate: CallerGate,
        metrics: GatewayMetrics,
        protect_metrics: bool,
        protect_docs: bool,
        proxies: TrustedProxies | None = None,
        metrics_readers: Collection[str] = (),
    ) -> None:
        self.app = app
        self.gate = gate
        self.metrics = metrics
        self.protect_metrics = protect_metrics
        self.protect_docs = protect_docs
        self.proxies = proxies or TrustedProxies([])
        self.metrics_readers = frozenset(metrics_readers)

    def _protected(self, path: str) -> bool:
        if path in ALWAYS_OPEN or path.startswith(ADMIN_PREFIX):
            return False  # /admin checks its own keys (gateway.http.routes.admin)
        if path == METRICS:
            return self.protect_metrics
        if path.startswith(DOCS_PREFIXES):
            return self.protect_docs
        return True

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not self._protected(scope["path"]):
            if scope["type"] == "http" and scope["path"] in ALWAYS_OPEN and self.gate.enabled:
                # open to probes, but only a known caller is told what is behind it
                # (gateway.http.routes.health): the key is checked, nothing charged
                state = scope.setdefault("state", {})
                try:
                    key = await self.gate.identify(scope.get("headers", []), self.proxies.certified(scope))
                except GatewayError:
                    key = None
                # None: an unknown caller (told nothing); a key: told of its models= only
                state["probe_key"] = key
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        try:
            caller = await self.gate.admit(
                state["request_id"], scope.get("headers", []), self.proxies.certified(scope)
            )
            if (
                self.metrics_readers
                and scope["path"] == METRICS
                and caller.client not in self.metrics_readers
            ):
                raise ForbiddenError("this key may not read /metrics (auth.metrics_readers)")
        except GatewayError as error:
            await refuse(self.metrics, scope, receive, send, error)
            return
        state["caller"] = caller
        if not caller.limits and (caller.key is None or not caller.key.quotas):
            await self.app(scope, receive, send)
            return

        async def send_with_limits(message: Message) -> None:
            if message["type"] == "http.response.start":
                # the request quota's standing, and the images' (counted once the body is read)
                MutableHeaders(scope=message).update(caller.standing())
            await send(message)

        await self.app(scope, receive, send_with_limits)


# An admin body is a small JSON document (a rollout, a pin): this is far above any.
ADMIN_BODY_BYTES = 64 * 1024


class AdminGate:
    """``/admin``: the admin key checked before anything is read (401 with the body unread,
    ``Connection: close``), then the body read under its cap and deadline and handed on."""

    def __init__(self, app: ASGIApp, keys: KeyRing, metrics: GatewayMetrics, body_seconds: float) -> None:
        self.app = app
        self.keys = keys
        self.metrics = metrics
        self.body_seconds = body_seconds

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, error: GatewayError) -> None:
        await refuse(self.metrics, scope, receive, send, error)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(ADMIN_PREFIX):
            await self.app(scope, receive, send)
            return
        key = identify(self.keys.keys, scope)
        if key is None:
            error = missing_key_error()
            error.headers = {**error.headers, "Connection": "close"}  # the body stays unread
            await self._refuse(scope, receive, send, error)
            return
        state = scope.setdefault("state", {})
        state["caller"] = Caller(state.get("request_id", ""), key)
        try:
            body = await limited_body(Request(scope, receive), ADMIN_BODY_BYTES, self.body_seconds)
        except GatewayError as error:
            error.headers = {**error.headers, "Connection": "close"}
            await self._refuse(scope, receive, send, error)
            return
        delivered = False

        async def replay() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: a disconnect, when it comes

        await self.app(scope, replay, send)
