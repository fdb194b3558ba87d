"""Who is calling, decided once for every door, before a byte of the request is read.

Every door (the HTTP middleware, gateway.http.auth; the gRPC door, gateway.rpc.door)
hands over the request's headers as lower-case byte pairs (HTTP headers or gRPC metadata)
and gets a :class:`Caller` back, or the refusal as a GatewayError:

1. the request id: the client's ``x-request-id`` when well-formed, else a new one;
2. the API key (``authorization: Bearer <key>`` or ``x-api-key``), or an OpenID Connect
   access token (``authorization: Bearer <JWT>``, gateway.shared.tokens), when keys or
   token issuers are configured: none, an unknown key or a token not taken is 401;
3. the key's tenant (its tier's share and priority of the in-flight limit);
4. its rate (429 with ``Retry-After`` past it) and its request quota (429 once spent);
5. the ``RateLimit`` / ``RateLimit-Policy`` standing every answer to a limited key carries.

Each decision is counted once, here (``gateway_client_requests_total`` by outcome). Image
quotas are charged by :meth:`CallerGate.charge_images` once the images are counted (a
``/classify`` body or a classifier's ``/v2`` or gRPC tensors), on every door alike.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gateway.errors import GatewayError, RateLimitedError, UnauthorizedError
from gateway.serving.admission import ANONYMOUS, Tenant, tenant_of
from gateway.shared.keyfiles import CERTIFICATE_PREFIX, SHARED_LABEL, ApiKey, find_key
from gateway.shared.quota import Usage, quota_headers
from gateway.shared.tokens import bearer_token

if TYPE_CHECKING:
    from gateway.observe.metrics import GatewayMetrics
    from gateway.settings import TierSettings
    from gateway.shared.keyfiles import KeyRing
    from gateway.shared.quota import QuotaKeeper
    from gateway.shared.ratelimit import RateLimiter
    from gateway.shared.tokens import TokenVerifier

Headers = Iterable[tuple[bytes, bytes]]
REQUEST_ID = b"x-request-id"
# Safe to log and to pass to Triton: no spaces, quotes or control characters.
_VALID_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:\-]{0,127}")


def accept_or_generate(candidate: str | None) -> str:
    """The client's request id when well-formed, else a new one (128 random bits in hex,
    as a uuid4's hex, without building the UUID object on every request)."""
    if candidate is not None and _VALID_ID.fullmatch(candidate):
        return candidate
    return os.urandom(16).hex()


def request_id_of(headers: Headers) -> str:
    for name, value in headers:
        if name == REQUEST_ID:
            return accept_or_generate(value.decode("latin-1"))
    return accept_or_generate(None)


def missing_key_error() -> UnauthorizedError:
    return UnauthorizedError(
        "send a valid API key as 'Authorization: Bearer <key>' or 'X-API-Key: <key>'",
        headers={"WWW-Authenticate": 'Bearer realm="triton-gateway"'},
    )


def merge_limits(first: Mapping[str, str], second: Mapping[str, str]) -> dict[str, str]:
    """Two sets of RateLimit-Policy / RateLimit headers as one (their items listed)."""
    merged = dict(first)
    for name, value in second.items():
        merged[name] = (
            f"{merged[name]}, {value}" if name in merged and name.startswith("RateLimit") else value
        )
    return merged


@dataclass
class Caller:
    """One call's caller: its request id, its key (None: keys are off, or an open path),
    its tenant, and the rate and quota standing its answer carries."""

    request_id: str
    key: ApiKey | None = None
    tenant: Tenant = ANONYMOUS
    limits: dict[str, str] = field(default_factory=dict)  # RateLimit and RateLimit-Policy
    quota: list[Usage] = field(default_factory=list)

    @property
    def client(self) -> str | None:
        """The key's id (what metrics, logs and canary assignments name)."""
        return None if self.key is None else self.key.id

    def standing(self) -> dict[str, str]:
        """The headers (HTTP) or trailing metadata (gRPC) every answer to this caller
        carries: its rate, and its quotas' standing."""
        if not self.quota:
            return self.limits
        return merge_limits(self.limits, quota_headers(self.quota))


def may_use(caller: Caller | None, model: str) -> bool:
    """Whether ``caller`` may call or see ``model`` (its key's ``models=`` list; no key
    or no list: every exposed model). A model it may not use is refused exactly as one
    that does not exist (404), so nothing says which models exist."""
    key = None if caller is None else caller.key
    return key is None or key.may_use(model)


class CallerGate:
    """Identity, tenant, rate and request quota; built once, used by every door."""

    def __init__(
        self,
        keys: KeyRing | None,
        limiter: RateLimiter,
        quotas: QuotaKeeper,
        metrics: GatewayMetrics,
        tiers: Mapping[str, TierSettings],
        tokens: TokenVerifier | None = None,
        unlisted_certificates: str = "allow",
    ) -> None:
        self.keys = keys
        self.limiter = limiter
        self.quotas = quotas
        self.metrics = metrics
        self.tiers = tiers
        self.tokens = tokens
        self.refuse_unlisted = unlisted_certificates == "refuse"

    @property
    def enabled(self) -> bool:
        """Whether callers must identify themselves (API keys, tokens, or both)."""
        return self.keys is not None or self.tokens is not None

    async def identify(self, headers: Headers, certified: str | None = None) -> ApiKey | None:
        """The caller's key, or its token's identity (None: authentication is off), or
        401: what a stream's opening checks before a message of it is read (each message
        is then admitted as a call). A verified client certificate (``certified``: the
        name it gives) names the caller first: the keys file's line of that id gives its
        tier, rate, quotas and models, else it is a plain tenant of that name. Then an API
        key; then a bearer value that is no known key but has a JWT's shape, verified as
        an OpenID Connect token."""
        if certified is not None:
            return self._certified(certified)
        if not self.enabled:
            return None
        pairs = headers if isinstance(headers, list) else list(headers)
        key = find_key(self.keys.keys, pairs) if self.keys is not None else None
        if key is None and self.tokens is not None:
            token = bearer_token(pairs)
            if token is not None:
                return await self.tokens.identify(token)  # or its 401
        if key is None:
            raise missing_key_error()
        return key

    def plain(self, request_id: str, headers: Headers, certified: str | None = None) -> Caller | None:
        """The caller of a request whose admission charges nothing and waits for nothing:
        authentication off, or an API key with neither a rate nor quotas (:meth:`admit`
        would only name it). None: :meth:`admit` decides (a certificate, a token, no key
        or an unknown one, a rate, a quota). Not counted: :meth:`count_allowed` does,
        once the caller is refused without :meth:`admit` (gateway.http.headshed)."""
        if certified is not None:
            return None
        if not self.enabled:
            return Caller(request_id)
        if self.keys is None:
            return None
        key = find_key(self.keys.keys, headers if isinstance(headers, list) else list(headers))
        if key is None or (key.rate and key.burst) or key.quotas:
            return None
        return Caller(request_id, key, tenant_of(key, self.tiers))

    def count_allowed(self, caller: Caller) -> None:
        """Count ``caller`` (from :meth:`plain`) as :meth:`admit` would have."""
        if caller.key is not None:
            self._count(caller.key, "allowed")

    def _certified(self, name: str) -> ApiKey:
        """The caller a certificate names, in the certificates' namespace (``cert:<name>``):
        the keys file's ``cert:<name> -`` line gives its tier, rate, quotas and models
        (never an API key's line of the same name), else a plain tenant of that name."""
        caller_id = CERTIFICATE_PREFIX + name
        if self.keys is not None:
            for key in self.keys.keys:
                if key.id == caller_id:
                    return key
        if self.refuse_unlisted:  # auth.unlisted_certificates: refuse
            raise UnauthorizedError("the client certificate is not one the keys file lists")
        return ApiKey(caller_id, b"", label=CERTIFICATE_PREFIX + SHARED_LABEL)  # one series for all

    async def admit(self, request_id: str, headers: Headers, certified: str | None = None) -> Caller:
        """The caller of a request with these headers (``request_id``: its
        :func:`request_id_of`; ``certified``: its verified client certificate's name), or
        its refusal (whose headers carry the rate standing)."""
        caller = Caller(request_id)
        key = await self.identify(headers, certified)
        if key is None:
            return caller
        caller.key = key
        caller.tenant = tenant_of(key, self.tiers)
        try:
            verdict = await self.limiter.check(key)
        except GatewayError:  # the shared store is down and its policy refuses
            self._count(key, "refused")
            raise
        if verdict is not None:
            rate, burst, tokens = verdict.rate, verdict.burst, max(0.0, verdict.tokens)
            caller.limits = {
                "RateLimit-Policy": f'"default";q={int(burst)};w={max(1, math.ceil(burst / rate))}',
                "RateLimit": f'"default";r={int(tokens)};t={math.ceil((burst - tokens) / rate)}',
            }
            if verdict.wait:
                self._count(key, "rate_limited")
                raise RateLimitedError(
                    f"the rate for this key is {rate:g} requests a second",
                    headers=caller.limits,
                    retry_after=verdict.wait,
                )
        if key.quotas:
            try:
                caller.quota = await self.quotas.charge(key, "requests", 1)
            except GatewayError as error:  # spent (429), or the store is down and refuses
                self._count(key, "quota_exceeded" if error.status == 429 else "refused")
                error.headers = merge_limits(caller.limits, error.headers)
                raise
        self._count(key, "allowed")
        return caller

    async def charge_images(self, caller: Caller | None, count: int) -> None:
        """Count ``count`` images against the caller's image quotas (429 once spent); the
        standing joins the answer's RateLimit headers."""
        key = None if caller is None else caller.key
        if caller is None or key is None or not key.quotas or count <= 0:
            return
        caller.quota.extend(await self.quotas.charge(key, "images", count))

    def _count(self, key: ApiKey, outcome: str) -> None:
        self.metrics.client_requests.labels(key.metric_label, outcome).inc()
