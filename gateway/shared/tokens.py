"""OpenID Connect access tokens: a JWT checked against its provider's published keys,
and turned into the same identity an API key line gives (tenant, tier, rate, models).

PyJWT does the JOSE work (the signature, ``exp``/``nbf`` with leeway, ``iss``, ``aud``);
the key set is ours, because a server needs from it what PyJWT's ``PyJWKClient`` does not
give (it fetches synchronously, on the request path, and forgets every key when a fetch
fails):

- each provider's key set is read before the gateway serves (discovery, then
  ``jwks_uri``) and again every ``auth.jwks_refresh_seconds``, off the request path; a
  key the provider dropped stops working at the next read;
- a token naming a key id the set does not hold reads it again at once (a rotation),
  at most every ``auth.jwks_min_refresh_seconds``; concurrent requests share the one read;
- a read that fails keeps every key it had (the provider down: cached keys keep working,
  a new key id is refused with 401);
- only asymmetric algorithms are taken, from each provider's allow-list (never ``none``,
  never HMAC: a public key must never become a shared secret), and a key is used only
  with the algorithm of its own type;
- a token verified once is remembered (the exact bytes, at most :data:`VERIFIED_TOKENS`)
  until its ``exp`` or until its key is no longer published: clients reuse a token for
  its lifetime, and a signature check costs about 120 us.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
import jwt

from gateway.errors import UnauthorizedError
from gateway.periodic import Periodic
from gateway.settings import TOKEN_ALGORITHMS, OidcIssuerSettings
from gateway.shared.keyfiles import SHARED_LABEL, ApiKey, Quota, model_pattern, plain_id

logger = logging.getLogger("gateway.tokens")
FETCH_SECONDS = 5.0
VERIFIED_TOKENS = 4096  # tokens remembered as verified (the oldest forgotten first)
# Three base64url parts: what a JWS compact serialisation looks like (an API key does not).
_JWT = re.compile(rb"[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+")
# The key types each algorithm family signs with.
_KEY_TYPES = {"RS": "RSA", "PS": "RSA", "ES": "EC", "Ed": "OKP"}


def bearer_token(headers: Iterable[tuple[bytes, bytes]]) -> bytes | None:
    """The JWT in ``authorization: Bearer <token>``, if the value looks like one."""
    for name, value in headers:
        if name == b"authorization" and value[:7].lower() == b"bearer ":
            token = value[7:].strip()
            return token if _JWT.fullmatch(token) else None
    return None


def _refused(detail: str) -> UnauthorizedError:
    return UnauthorizedError(
        f"the bearer token was not accepted: {detail}",
        headers={"WWW-Authenticate": 'Bearer realm="triton-gateway", error="invalid_token"'},
    )


@dataclass
class KeySet:
    """One provider's published keys, by key id, as last read successfully."""

    settings: OidcIssuerSettings
    client: httpx.AsyncClient
    min_refresh_seconds: float = 10.0
    keys: dict[str, jwt.PyJWK] = field(default_factory=dict)
    declared: dict[str, str] = field(default_factory=dict)  # kid -> the key's own "alg", if any
    jwks_uri: str = ""
    read_at: float = float("-inf")  # the last read's start (monotonic), failed or not
    _published: dict[str, Any] = field(default_factory=dict)  # kid -> the JWK as published
    _reading: asyncio.Task[None] | None = None

    async def _read(self) -> None:
        if not self.jwks_uri:
            self.jwks_uri = self.settings.jwks_uri
        if not self.jwks_uri:
            discovery = self.settings.issuer.rstrip("/") + "/.well-known/openid-configuration"
            answer = await self.client.get(discovery)
            answer.raise_for_status()
            document = answer.json()
            if document.get("issuer") != self.settings.issuer:
                raise ValueError(f"the discovery document names issuer {document.get('issuer')!r}")
            self.jwks_uri = str(document["jwks_uri"])
        answer = await self.client.get(self.jwks_uri)
        answer.raise_for_status()
        found: dict[str, jwt.PyJWK] = {}
        declared: dict[str, str] = {}
        published: dict[str, Any] = {}
        for entry in answer.json().get("keys", []):
            kid, use = entry.get("kid"), entry.get("use", "sig")
            if not isinstance(kid, str) or use != "sig":
                continue
            held = self.keys.get(kid)
            if held is not None and self._published.get(kid) == entry:
                found[kid] = held  # the same key, the same object: tokens verified by it stay
            else:
                try:
                    found[kid] = jwt.PyJWK(entry)
                except jwt.PyJWTError:  # a key type or curve PyJWT does not take: skipped
                    continue
            published[kid] = entry
            if isinstance(entry.get("alg"), str):
                declared[kid] = entry["alg"]
        # the read succeeded: what the provider publishes now
        self.keys, self.declared, self._published = found, declared, published

    async def refresh(self) -> None:
        """Read the key set (one read at a time: a second caller waits for the first); a
        failure keeps the keys held and is logged."""
        if self._reading is None or self._reading.done():
            self.read_at = time.monotonic()
            self._reading = asyncio.create_task(self._read())
        try:
            await asyncio.shield(self._reading)
        except Exception as exc:  # the provider down, a bad document: keep what we have
            logger.warning(
                "the key set of %s could not be read (%s); %d cached key(s) stay in use",
                self.settings.issuer,
                exc,
                len(self.keys),
            )

    async def key(self, kid: str) -> jwt.PyJWK | None:
        """The key ``kid``; one the set does not hold reads the set again, unless it was
        read less than ``min_refresh_seconds`` ago (a flood of invented ids costs one read)."""
        found = self.keys.get(kid)
        if found is None and time.monotonic() - self.read_at >= self.min_refresh_seconds:
            await self.refresh()
            found = self.keys.get(kid)
        return found


def _claim_text(claims: Mapping[str, Any], name: str) -> str | None:
    value = claims.get(name)
    return value if isinstance(value, str) and value else None


class TokenVerifier:
    """Every configured provider's key set; :meth:`identify` turns a token into its caller's
    identity (an :class:`ApiKey` without a digest), or 401."""

    def __init__(
        self,
        issuers: list[OidcIssuerSettings],
        tiers: Iterable[str],
        refresh_seconds: float,
        min_refresh_seconds: float = 10.0,
    ) -> None:
        self._tiers = frozenset(tiers)
        self._refresh_seconds = refresh_seconds
        self._client = httpx.AsyncClient(timeout=FETCH_SECONDS, follow_redirects=False)
        self._sets = {issuer.issuer: KeySet(issuer, self._client, min_refresh_seconds) for issuer in issuers}
        self._loop: Periodic | None = None
        # token -> (its identity, exp, its key set, kid, the key that verified it): a token
        # seen before is not verified again (RS256 and the claims: ~120 us) while that very
        # key is published under its kid (a key replaced under the same kid is not it) and
        # the token is unexpired
        self._verified: dict[bytes, tuple[ApiKey, float, KeySet, str, jwt.PyJWK]] = {}

    async def start(self) -> None:
        """Read every key set (a provider down at start is read again by the loop) and
        keep them fresh."""
        await asyncio.gather(*(keys.refresh() for keys in self._sets.values()))
        self._loop = Periodic("jwks refresh", self._refresh_seconds, self._refresh_all, logger)
        self._loop.start()

    async def _refresh_all(self) -> None:
        await asyncio.gather(*(keys.refresh() for keys in self._sets.values()))

    async def stop(self) -> None:
        if self._loop is not None:
            await self._loop.stop()
        await self._client.aclose()

    async def identify(self, token: bytes) -> ApiKey:
        seen = self._verified.get(token)
        if seen is not None:
            if (
                seen[2].keys.get(seen[3]) is seen[4]
                and time.time() <= seen[1] + seen[2].settings.leeway_seconds
            ):
                return seen[0]
            del self._verified[token]  # expired, or its key dropped: verified again (and refused)
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise _refused("it is not a well-formed JWT") from None
        algorithm, kid = header.get("alg"), header.get("kid")
        if algorithm not in TOKEN_ALGORITHMS:  # none, HMAC: refused before anything else
            raise _refused("its algorithm is not an asymmetric signature the gateway takes")
        try:
            unverified = jwt.decode(token, options={"verify_signature": False})
        except jwt.PyJWTError:
            raise _refused("it is not a well-formed JWT") from None
        issuer = unverified.get("iss")
        keys = self._sets.get(issuer) if isinstance(issuer, str) else None
        if keys is None:
            raise _refused("its issuer is not one the gateway trusts")
        settings = keys.settings
        if algorithm not in settings.algorithms:
            raise _refused(f"its algorithm is not one of {', '.join(settings.algorithms)}")
        if not isinstance(kid, str):
            raise _refused("it names no key (kid)")
        key = await keys.key(kid)
        if key is None:
            raise _refused("its key is not one the issuer publishes")
        if _KEY_TYPES.get(algorithm[:2]) != key.key_type or keys.declared.get(kid, algorithm) != algorithm:
            raise _refused("its key is not of its algorithm's type")
        try:
            claims = jwt.decode(
                token,
                key=key.key,  # the public key itself: the algorithm is the header's, allowed above
                algorithms=[algorithm],
                audience=settings.audience,
                issuer=settings.issuer,
                leeway=settings.leeway_seconds,
                options={"require": ["exp", "iss", "aud"]},
            )
        except jwt.ExpiredSignatureError:
            raise _refused("it has expired") from None
        except jwt.InvalidAudienceError:
            raise _refused("it is not meant for this gateway (aud)") from None
        except jwt.ImmatureSignatureError:
            raise _refused("it is not valid yet") from None
        except jwt.PyJWTError:
            raise _refused("its signature or claims do not verify") from None
        identity = self._identity(settings, claims)
        if len(self._verified) >= VERIFIED_TOKENS:
            del self._verified[next(iter(self._verified))]  # the oldest
        self._verified[token] = (identity, float(claims["exp"]), keys, kid, key)
        return identity

    def _identity(self, settings: OidcIssuerSettings, claims: Mapping[str, Any]) -> ApiKey:
        tenant = (
            _claim_text(claims, settings.tenant_claim)
            or _claim_text(claims, "client_id")
            or _claim_text(claims, "sub")
            or ""
        )
        # in the issuer's namespace: never an API key's id (no colon) nor another issuer's
        plain = plain_id(tenant, "token")
        tenant = f"{settings.namespace}:{plain}"
        label = "" if plain in settings.metric_tenants else f"{settings.namespace}:{SHARED_LABEL}"
        tier = _claim_text(claims, settings.tier_claim) if settings.tier_claim else None
        if tier is None or tier not in self._tiers or (settings.tiers and tier not in settings.tiers):
            tier = "standard"
        models: tuple[str, ...] = ()
        if settings.require_models_claim and (
            not settings.models_claim or settings.models_claim not in claims
        ):
            raise _refused(
                f"it carries no {settings.models_claim or 'models'} claim, which this issuer's tokens must"
            )
        if settings.models_claim:
            raw = claims.get(settings.models_claim)
            names = raw.split() if isinstance(raw, str) else raw if isinstance(raw, list) else []
            models = tuple(n for n in names if isinstance(n, str) and model_pattern(n))
            if raw is not None and not models:
                models = ("\0",)  # a claim naming nothing usable: no model at all
        burst = settings.burst if settings.burst is not None else settings.rate
        quotas = tuple(
            Quota(unit, int(limit), period)
            for unit, text in (("requests", settings.quota), ("images", settings.image_quota))
            if text
            for limit, period in [text.split("/")]
            if int(limit) >= 1
        )
        return ApiKey(tenant, b"", settings.rate, burst, tier, quotas, models, label)
