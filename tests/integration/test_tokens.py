"""OpenID Connect access tokens against a real, certified provider (node-oidc-provider,
client-credentials grant) and the real stack: every door takes a good token beside API
keys; expired, foreign and forged tokens are 401; a rotation at the provider is followed
without a restart; a provider that goes down leaves the cached keys working."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import jwt
import numpy as np
import pytest
import tritonclient.grpc as tritongrpc
from tritonclient.utils import InferenceServerException

from gateway.dev.tritonserver import TritonServer, free_port
from gateway.settings import OidcIssuerSettings, Settings
from gateway.shared.keyfiles import hash_key

from helpers.oidc import AUDIENCE, OidcProvider
from helpers.triton_fixtures import gateway_settings

TEXT = {"text": "The striker scored twice in the final."}


@pytest.fixture
def provider(tmp_path: Path) -> Iterator[OidcProvider]:
    provider = OidcProvider(
        tmp_path / "provider",
        clients={"app": {}, "texts": {"models": ["text_*"]}},
    )
    provider.start()
    yield provider
    provider.stop()


@pytest.fixture
def stack(
    triton: TritonServer,
    provider: OidcProvider,
    serve_gateway: Callable[[Settings], httpx.Client],
    tmp_path: Path,
) -> tuple[httpx.Client, str]:
    keys = tmp_path / "keys"
    keys.write_text(f"keyed {hash_key('key-secret')}\n")
    door = free_port()
    # a key whose id is a client's of the provider, with a quota of one request a day
    keys.write_text(f"keyed {hash_key('key-secret')}\napp {hash_key('app-key')} quota=1/day\n")
    issuer = OidcIssuerSettings(
        issuer=provider.issuer,
        audience=AUDIENCE,
        models_claim="models",
        leeway_seconds=0,
        name="idp",
        metric_tenants=["app"],
    )
    settings = gateway_settings(
        triton,
        auth={"keys_file": keys, "oidc": [issuer], "protect_metrics": False, "jwks_min_refresh_seconds": 1},
        grpc={"port": door, "host": "127.0.0.1"},
    )
    return serve_gateway(settings), f"127.0.0.1:{door}"


def _bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def _text_inputs() -> list[Any]:
    text = tritongrpc.InferInput("TEXT", [1, 1], "BYTES")
    text.set_data_from_numpy(np.array([[TEXT["text"].encode()]], dtype=np.object_))
    top_k = tritongrpc.InferInput("TOP_K", [1, 1], "INT32")
    top_k.set_data_from_numpy(np.array([[2]], dtype=np.int32))
    return [text, top_k]


def _refusal(http: httpx.Client, token: str) -> str:
    answer = http.post("/classify", json=TEXT, headers=_bearer(token))
    assert answer.status_code == 401, answer.text
    assert answer.headers["content-type"] == "application/problem+json"
    return str(answer.json()["detail"])


def test_a_providers_token_is_taken_on_every_door_beside_keys(
    stack: tuple[httpx.Client, str], provider: OidcProvider
) -> None:
    http, door = stack
    token = provider.token("app")
    assert http.post("/classify", json=TEXT, headers=_bearer(token)).status_code == 200
    assert http.post("/models/text_classifier/classify", json=TEXT, headers=_bearer(token)).status_code == 200
    assert http.get("/v2/models/text_classifier", headers=_bearer(token)).status_code == 200
    v1 = http.post(
        "/v1/classify", json={"model": "text_classifier", "input": [TEXT["text"]]}, headers=_bearer(token)
    )
    assert v1.status_code == 200, v1.text
    client = tritongrpc.InferenceServerClient(door)
    assert (
        client.infer("text_classifier", _text_inputs(), headers=_bearer(token)).as_numpy("LABELS").size == 2
    )
    # keys stay
    assert http.post("/classify", json=TEXT, headers={"x-api-key": "key-secret"}).status_code == 200
    # the tenant is the token's client: counted under it, being one of the issuer's
    # metric_tenants; any other tenant of the issuer shares one series
    assert http.post("/classify", json=TEXT, headers=_bearer(provider.token("texts"))).status_code == 200
    metrics = http.get("/metrics").text
    assert 'gateway_client_requests_total{client="idp:app",outcome="allowed"}' in metrics
    assert 'gateway_client_requests_total{client="idp:*",outcome="allowed"}' in metrics
    assert "idp:texts" not in metrics


def test_a_token_tenant_named_as_a_key_spends_nothing_of_the_keys(
    stack: tuple[httpx.Client, str], provider: OidcProvider
) -> None:
    """The provider's client "app" and the API key "app" are two callers: the token's
    requests (tenant idp:app) leave the key's daily quota of one untouched (before, the
    key's next request was 429)."""
    http, _ = stack
    token = provider.token("app")
    for _ in range(3):
        assert http.post("/classify", json=TEXT, headers=_bearer(token)).status_code == 200
    keyed = http.post("/classify", json=TEXT, headers={"x-api-key": "app-key"})
    assert keyed.status_code == 200, keyed.text
    assert http.post("/classify", json=TEXT, headers={"x-api-key": "app-key"}).status_code == 429  # its own


def test_tokens_the_gateway_must_not_take_are_401(
    stack: tuple[httpx.Client, str], provider: OidcProvider
) -> None:
    http, door = stack
    now = int(time.time())
    good = {"iss": provider.issuer, "aud": AUDIENCE, "client_id": "app", "iat": now, "exp": now + 300}
    assert http.post("/classify", json=TEXT, headers=_bearer(provider.forge(good))).status_code == 200
    assert "expired" in _refusal(http, provider.forge({**good, "exp": now - 5}))
    assert "aud" in _refusal(http, provider.forge({**good, "aud": "https://another.service"}))
    assert "issuer" in _refusal(http, provider.forge({**good, "iss": "http://127.0.0.1:1"}))
    assert "not valid yet" in _refusal(http, provider.forge({**good, "nbf": now + 120}))
    # alg swaps: the provider's public key as an HMAC secret, and no signature at all
    public = provider.keys["first"].public_key()
    from cryptography.hazmat.primitives import serialization

    pem = public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)

    def b64(data: bytes) -> str:
        return base64.urlsafe_b64encode(data).rstrip(b"=").decode()

    for alg in ("HS256", "none"):
        head = b64(json.dumps({"alg": alg, "kid": "first", "typ": "JWT"}).encode())
        body = b64(json.dumps(good).encode())
        signature = (
            b64(hmac.new(pem, f"{head}.{body}".encode(), hashlib.sha256).digest()) if alg == "HS256" else ""
        )
        forged = f"{head}.{body}.{signature or b64(b'none')}"
        assert "algorithm" in _refusal(http, forged)
    # a signature that does not verify, a key the provider never published
    tampered = provider.forge(good)[:-4] + "AAAA"
    _refusal(http, tampered)
    unknown = jwt.encode(good, provider.keys["first"], algorithm="RS256", headers={"kid": "unknown-kid"})
    assert "key" in _refusal(http, unknown)
    # the gRPC door: UNAUTHENTICATED
    client = tritongrpc.InferenceServerClient(door)
    with pytest.raises(InferenceServerException) as refused:
        client.infer(
            "text_classifier", _text_inputs(), headers=_bearer(provider.forge({**good, "exp": now - 5}))
        )
    assert str(refused.value.status()) == "StatusCode.UNAUTHENTICATED"


def test_a_tokens_models_claim_limits_what_it_may_use(
    stack: tuple[httpx.Client, str], provider: OidcProvider
) -> None:
    http, door = stack
    token = provider.token("texts")  # models: ["text_*"]
    assert http.post("/models/text_classifier/classify", json=TEXT, headers=_bearer(token)).status_code == 200
    image = http.get("/v2/models/image_classifier", headers=_bearer(token))
    missing = http.get("/v2/models/no_such_model", headers=_bearer(token))
    assert image.status_code == missing.status_code == 404
    client = tritongrpc.InferenceServerClient(door)
    assert not client.is_model_ready("image_classifier", headers=_bearer(token))


def test_a_rotation_at_the_provider_is_followed_without_a_restart(
    stack: tuple[httpx.Client, str], provider: OidcProvider
) -> None:
    http, _ = stack
    old = provider.token("app")
    # the provider signs with a new key, still publishing the old one
    provider.restart(["second", "first"])
    new = provider.token("app")
    assert new != old
    time.sleep(1.1)  # the key set was read at start: past the refresh floor (1 s here)
    assert (
        http.post("/classify", json=TEXT, headers=_bearer(new)).status_code == 200
    )  # an unknown kid: read at once
    assert http.post("/classify", json=TEXT, headers=_bearer(old)).status_code == 200
    # the provider goes down: the cached keys keep working, a new key id is 401 (never 500)
    provider.stop()
    assert http.post("/classify", json=TEXT, headers=_bearer(new)).status_code == 200
    now = int(time.time())
    claims = {"iss": provider.issuer, "aud": AUDIENCE, "client_id": "app", "iat": now, "exp": now + 300}
    provider.use_keys(["third", "second"])
    time.sleep(1.2)  # past the refresh floor (1 s here): the unknown kid asks the provider, which is down
    assert "key" in _refusal(http, provider.forge(claims, kid="third"))
    assert http.post("/classify", json=TEXT, headers=_bearer(new)).status_code == 200
    # back up without the first key: the next read takes the third and drops the first
    provider.start()
    time.sleep(1.2)
    assert (
        http.post("/classify", json=TEXT, headers=_bearer(provider.forge(claims, kid="third"))).status_code
        == 200
    )
    assert "key" in _refusal(http, old)
