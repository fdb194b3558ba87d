"""What a verified token's claims make of its caller: the tenant, tier, rate and models an
API key line gives."""

from __future__ import annotations

import asyncio

from gateway.settings import OidcIssuerSettings
from gateway.shared.tokens import TokenVerifier, bearer_token

ISSUER = OidcIssuerSettings(
    issuer="https://id.example",
    audience="gw",
    tier_claim="tier",
    models_claim="models",
    rate=5,
    quota="2000/day",
    image_quota="500/month",
)


def _identity(claims: dict[str, object]) -> object:
    verifier = TokenVerifier([ISSUER], tiers={"standard", "gold"}, refresh_seconds=300)
    try:
        return verifier._identity(ISSUER, claims)
    finally:
        asyncio.run(verifier.stop())


def test_the_claims_name_the_tenant_tier_rate_and_models() -> None:
    key = _identity({"azp": "partner-a", "tier": "gold", "models": ["text_*", "sentiment"]})
    assert (key.id, key.tier, key.rate, key.burst, key.models) == (  # type: ignore[attr-defined]
        "oidc-20a69b77:partner-a", "gold", 5, 5, ("text_*", "sentiment"),
    )  # fmt: skip
    assert [(q.unit, q.limit, q.period) for q in key.quotas] == [  # type: ignore[attr-defined]
        ("requests", 2000, "day"),
        ("images", 500, "month"),
    ]
    assert key.may_use("text_classifier")  # type: ignore[attr-defined]
    assert not key.may_use("image_classifier")  # type: ignore[attr-defined]
    spaced = _identity({"client_id": "b", "models": "text_classifier image_classifier"})
    assert spaced.models == ("text_classifier", "image_classifier")  # type: ignore[attr-defined]


def test_unknown_tiers_and_odd_tenants_fall_back_safely() -> None:
    key = _identity({"sub": "user@example.com with spaces", "tier": "platinum"})
    assert key.tier == "standard"  # type: ignore[attr-defined]
    assert key.id.startswith("oidc-20a69b77:token-")  # type: ignore[attr-defined]
    assert len(key.id) == 14 + 22  # type: ignore[attr-defined]
    # a models claim that names nothing usable gives no model, not every model
    nothing = _identity({"azp": "c", "models": ["bad/name"]})
    assert not nothing.may_use("text_classifier")  # type: ignore[attr-defined]
    assert _identity({"azp": "d"}).may_use("anything")  # type: ignore[attr-defined]


def test_only_a_jwt_shaped_bearer_value_is_taken_for_a_token() -> None:
    assert bearer_token([(b"authorization", b"Bearer aaa.bbb.ccc")]) == b"aaa.bbb.ccc"
    assert bearer_token([(b"authorization", b"Bearer an-api-key")]) is None
    assert bearer_token([(b"x-api-key", b"aaa.bbb.ccc")]) is None


def test_a_remembered_token_stops_at_its_exp_and_when_its_key_is_dropped() -> None:
    import json
    import time

    import jwt
    import pytest
    from cryptography.hazmat.primitives.asymmetric import rsa
    from jwt.algorithms import RSAAlgorithm

    from gateway.errors import UnauthorizedError

    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = json.loads(RSAAlgorithm.to_jwk(private.public_key()))
    jwk.update(kid="k1", use="sig")
    issuer = OidcIssuerSettings(issuer="https://id.example", audience="gw", leeway_seconds=0, name="idp")

    async def scenario() -> None:
        verifier = TokenVerifier([issuer], tiers={"standard"}, refresh_seconds=300)
        keys = verifier._sets["https://id.example"]
        keys.keys, keys.read_at = {"k1": jwt.PyJWK(jwk)}, time.monotonic()  # read just now
        now = int(time.time())
        claims = {"iss": "https://id.example", "aud": "gw", "client_id": "app"}
        short = jwt.encode({**claims, "exp": now + 1}, private, algorithm="RS256", headers={"kid": "k1"})
        long = jwt.encode({**claims, "exp": now + 600}, private, algorithm="RS256", headers={"kid": "k1"})
        assert (await verifier.identify(short.encode())).id == "idp:app"
        assert (await verifier.identify(long.encode())).id == "idp:app"
        await asyncio.sleep(1.2)
        with pytest.raises(UnauthorizedError, match="expired"):
            await verifier.identify(short.encode())
        assert (await verifier.identify(long.encode())).id == "idp:app"  # remembered
        # the provider replaced the key under the same kid (and was read since): the
        # remembered token was verified by the old one, so it is verified again and refused
        other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        replaced = json.loads(RSAAlgorithm.to_jwk(other.public_key()))
        replaced.update(kid="k1", use="sig")
        keys.keys = {"k1": jwt.PyJWK(replaced)}
        with pytest.raises(UnauthorizedError, match="signature"):
            await verifier.identify(long.encode())
        keys.keys = {}  # the provider dropped the key (and was read since)
        with pytest.raises(UnauthorizedError, match="key"):
            await verifier.identify(long.encode())
        await verifier.stop()

    asyncio.run(scenario())


def test_each_issuers_tenants_live_in_a_namespace_of_their_own() -> None:
    """A token tenant can never be an API key (no key id holds a colon), a certificate
    (``cert:``) or the same tenant of another issuer; an issuer may be named."""
    import pytest
    from pydantic import ValidationError

    from gateway.settings import AuthSettings

    other = OidcIssuerSettings(issuer="https://other.example", audience="gw")
    named = OidcIssuerSettings(issuer="https://id.example", audience="gw", name="corp")
    verifier = TokenVerifier([ISSUER, other, named], tiers={"standard"}, refresh_seconds=300)
    try:
        ids = {verifier._identity(issuer, {"azp": "partner-a"}).id for issuer in (ISSUER, other, named)}
    finally:
        asyncio.run(verifier.stop())
    assert len(ids) == 3
    assert "corp:partner-a" in ids
    assert all(":" in i and not i.startswith("cert:") for i in ids)
    with pytest.raises(ValidationError):
        AuthSettings(oidc=[named, OidcIssuerSettings(issuer="https://x.example", audience="gw", name="corp")])
    with pytest.raises(ValidationError):
        AuthSettings(oidc=[OidcIssuerSettings(issuer="https://x.example", audience="gw", name="cert")])


def test_an_issuer_may_require_the_models_claim_and_narrow_its_tiers() -> None:
    import pytest

    from gateway.errors import UnauthorizedError

    strict = OidcIssuerSettings(
        issuer="https://id.example",
        audience="gw",
        tier_claim="tier",
        models_claim="models",
        require_models_claim=True,
        tiers=["standard"],
    )
    verifier = TokenVerifier([strict], tiers={"standard", "gold"}, refresh_seconds=300)
    try:
        with pytest.raises(UnauthorizedError, match="models"):
            verifier._identity(strict, {"azp": "a"})  # before: every model
        key = verifier._identity(strict, {"azp": "a", "models": ["text_*"], "tier": "gold"})
        assert key.tier == "standard"  # gold is a gateway tier, not one this issuer may grant
        assert key.may_use("text_classifier")
        assert not key.may_use("image_classifier")
    finally:
        asyncio.run(verifier.stop())


def test_tenants_past_the_issuers_metric_tenants_share_one_label() -> None:
    issuer = OidcIssuerSettings(issuer="https://id.example", audience="gw", name="idp", metric_tenants=["a"])
    verifier = TokenVerifier([issuer], tiers={"standard"}, refresh_seconds=300)
    try:
        named = verifier._identity(issuer, {"azp": "a"})
        others = [verifier._identity(issuer, {"azp": f"tenant-{n}"}) for n in range(2000)]
    finally:
        asyncio.run(verifier.stop())
    assert (named.id, named.metric_label) == ("idp:a", "idp:a")
    assert {key.metric_label for key in others} == {"idp:*"}
    assert len({key.id for key in others}) == 2000  # still 2,000 tenants for quotas and rates
