"""API keys, rate limits, CORS, as a client sees them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from gateway.__main__ import main
from gateway.app import create_app
from gateway.errors import ConfigurationError
from gateway.settings import AuthSettings, Settings
from gateway.shared.keyfiles import hash_key

from helpers.support import FakeBackend

TEXT = {"text": "The striker scored twice."}


@pytest.fixture
def keys_file(tmp_path: Path) -> Path:
    path = tmp_path / "keys"
    path.write_text(
        f"# id  sha256  rate/s  burst\nalice {hash_key('alice-secret')}\nbob {hash_key('bob-secret')} 0.5 2\n"
    )
    return path


@pytest.fixture
def client(keys_file: Path) -> Iterator[TestClient]:
    settings = Settings(
        auth=AuthSettings(keys_file=keys_file, protect_metrics=True, metrics_readers=["alice"])
    )
    with TestClient(create_app(settings, backend_factory=lambda *_: FakeBackend())) as test_client:
        yield test_client


def test_no_key_is_401_with_www_authenticate(client: TestClient) -> None:
    response = client.post("/classify", json=TEXT)
    assert response.status_code == 401
    assert response.headers["www-authenticate"].startswith("Bearer")
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["type"].endswith(":unauthorized")


def test_unknown_key_is_401(client: TestClient) -> None:
    response = client.post("/classify", json=TEXT, headers={"Authorization": "Bearer alice-secretx"})
    assert response.status_code == 401


def test_bearer_and_x_api_key_are_accepted(client: TestClient) -> None:
    assert (
        client.post("/classify", json=TEXT, headers={"Authorization": "Bearer alice-secret"}).status_code
        == 200
    )
    assert client.post("/classify", json=TEXT, headers={"X-API-Key": "alice-secret"}).status_code == 200
    assert client.get("/models", headers={"X-API-Key": "alice-secret"}).status_code == 200


def test_probes_stay_open_and_metrics_are_protected(client: TestClient) -> None:
    assert client.get("/livez").status_code == 200
    assert client.get("/readyz").status_code == 200
    assert client.get("/metrics").status_code == 401
    assert client.get("/metrics", headers={"X-API-Key": "alice-secret"}).status_code == 200
    # a known caller that is not a metrics reader: /metrics names every client and model
    refused = client.get("/metrics", headers={"X-API-Key": "bob-secret"})
    assert refused.status_code == 403
    assert refused.json()["type"].endswith(":forbidden")
    assert client.get("/openapi.json").status_code == 200  # docs not protected unless asked


def test_rate_limit_is_429_with_retry_after_and_ratelimit_headers(client: TestClient) -> None:
    key = {"X-API-Key": "bob-secret"}
    first = client.post("/classify", json=TEXT, headers=key)
    assert first.status_code == 200
    assert first.headers["ratelimit-policy"] == '"default";q=2;w=4'
    assert client.post("/classify", json=TEXT, headers=key).status_code == 200
    limited = client.post("/classify", json=TEXT, headers=key)
    assert limited.status_code == 429
    assert limited.json()["type"].endswith(":rate-limited")
    assert int(limited.headers["retry-after"]) >= 1
    assert limited.headers["ratelimit"].startswith('"default";r=0')
    # Another key is not affected.
    assert client.post("/classify", json=TEXT, headers={"X-API-Key": "alice-secret"}).status_code == 200
    metrics = client.get("/metrics", headers={"X-API-Key": "alice-secret"}).text
    assert 'gateway_client_requests_total{client="bob",outcome="rate_limited"} 1.0' in metrics
    assert "bob-secret" not in metrics


def test_malformed_keys_file_refuses_to_start(tmp_path: Path) -> None:
    bad = tmp_path / "keys"
    bad.write_text("alice not-a-hash\n")
    with pytest.raises(ConfigurationError):
        create_app(Settings(auth=AuthSettings(keys_file=bad)), backend_factory=lambda *_: FakeBackend())


def test_cors_off_by_default_and_allow_listed_when_configured() -> None:
    plain = TestClient(create_app(Settings(), backend_factory=lambda *_: FakeBackend()))
    with plain:
        response = plain.get("/livez", headers={"Origin": "https://evil.example"})
    assert "access-control-allow-origin" not in response.headers
    settings = Settings(auth=AuthSettings(cors_origins=["https://app.example"]))
    with TestClient(create_app(settings, backend_factory=lambda *_: FakeBackend())) as cors:
        allowed = cors.get("/livez", headers={"Origin": "https://app.example"})
        refused = cors.get("/livez", headers={"Origin": "https://evil.example"})
    assert allowed.headers["access-control-allow-origin"] == "https://app.example"
    assert "access-control-allow-origin" not in refused.headers


def test_hash_key_command(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO("alice-secret\n"))
    assert main(["hash-key"]) == 0
    assert capsys.readouterr().out.strip() == hash_key("alice-secret")


def test_the_v2_protocol_needs_a_key_but_its_health_probes_do_not(client: TestClient) -> None:
    refused = client.post("/v2/models/text_classifier/infer", json={"inputs": []})
    assert refused.status_code == 401
    assert refused.json()["error"] == refused.json()["detail"]  # the OIP error shape as well
    assert client.get("/v2/models/text_classifier").status_code == 401
    assert client.get("/v2").status_code == 401
    assert client.get("/v2/health/live").status_code == 200
    assert client.get("/v2/health/ready").status_code == 200
