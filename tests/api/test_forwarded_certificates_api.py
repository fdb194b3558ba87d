"""Envoy's x-forwarded-client-cert names the caller, from the proxies named in the settings
only (over a real socket: the peer address is what decides); from anyone else it is
ignored."""

from __future__ import annotations

from pathlib import Path

import httpx

from gateway.app import create_app
from gateway.settings import AuthSettings, Settings
from gateway.shared.keyfiles import hash_key

from helpers.support import FakeBackend, ServedApp

TEXT = {"text": "The striker scored twice."}
XFCC = {
    "x-forwarded-client-cert": 'By=spiffe://mesh/gateway;Hash=1f2e;Subject="CN=partner-a,OU=ml";URI=spiffe://mesh/partner'
}


def _serve(tmp_path: Path, proxies: list[str]) -> ServedApp:
    keys = tmp_path / "keys"
    # the certificate's line, in the certificates' namespace; an API key of the same bare
    # name is another caller (and may use every model)
    keys.write_text(f"cert:partner-a - models=text_*\npartner-a {hash_key('key-secret')}\n")
    settings = Settings(
        auth=AuthSettings(keys_file=keys, trusted_proxies=proxies, metrics_readers=["partner-a"])
    )
    return ServedApp(create_app(settings, backend_factory=lambda *_: FakeBackend()), settings).start()


def test_a_trusted_proxys_forwarded_certificate_names_the_caller(tmp_path: Path) -> None:
    served = _serve(tmp_path, ["127.0.0.1/32", "::1/128"])
    try:
        with httpx.Client(base_url=served.url, timeout=10) as client:
            assert client.post("/classify", json=TEXT, headers=XFCC).status_code == 200
            # the keys file's line for that name gives its models
            assert client.get("/v2/models/image_classifier", headers=XFCC).status_code == 404
            assert client.get("/v2/models/text_classifier", headers=XFCC).status_code == 200
            assert client.post("/classify", json=TEXT).status_code == 401  # no certificate, no key
    finally:
        served.stop()


def test_from_anyone_else_the_header_is_ignored(tmp_path: Path) -> None:
    served = _serve(tmp_path, ["10.0.0.0/8"])
    try:
        with httpx.Client(base_url=served.url, timeout=10) as client:
            assert client.post("/classify", json=TEXT, headers=XFCC).status_code == 401
    finally:
        served.stop()


def test_the_client_cannot_name_itself_before_the_proxys_element(tmp_path: Path) -> None:
    """With APPEND_FORWARD a client's own XFCC comes first and the proxy appends the
    element for the certificate it verified: the last is taken. A name that is not plain
    is refused, not cut down."""
    served = _serve(tmp_path, ["127.0.0.1/32", "::1/128"])
    spoofed = {"x-forwarded-client-cert": 'Hash=x;Subject="CN=partner-a",' + 'Hash=y;Subject="CN=stranger"'}
    slashed = {"x-forwarded-client-cert": 'Hash=y;Subject="CN=partner-a/x,O=Acme"'}
    try:
        with httpx.Client(base_url=served.url, timeout=10) as client:
            # "stranger" is a plain tenant with no line: it may use every model, partner-a not
            assert client.get("/v2/models/image_classifier", headers=spoofed).status_code == 200
            assert client.get("/v2/models/image_classifier", headers=XFCC).status_code == 404
            refused = client.post("/classify", json=TEXT, headers=slashed)
            assert refused.status_code == 401, refused.text
            assert refused.headers["content-type"] == "application/problem+json"
    finally:
        served.stop()


def test_a_certificate_and_a_key_of_one_name_are_two_callers(tmp_path: Path) -> None:
    served = _serve(tmp_path, ["127.0.0.1/32", "::1/128"])
    try:
        with httpx.Client(base_url=served.url, timeout=10) as client:
            key = {"x-api-key": "key-secret"}
            assert client.get("/v2/models/image_classifier", headers=key).status_code == 200  # the key's line
            assert client.get("/v2/models/image_classifier", headers=XFCC).status_code == 404  # the cert's
            client.post("/classify", json=TEXT, headers=XFCC)
            client.post("/classify", json=TEXT, headers=key)
            # certificates the keys file does not list share one series, however many come
            for name in ("stranger-1", "stranger-2"):
                unlisted = {"x-forwarded-client-cert": f'Hash=y;Subject="CN={name}"'}
                assert client.post("/classify", json=TEXT, headers=unlisted).status_code == 200
            metrics = client.get("/metrics", headers=key).text
            assert 'gateway_client_requests_total{client="cert:partner-a",outcome="allowed"}' in metrics
            assert 'gateway_client_requests_total{client="partner-a",outcome="allowed"}' in metrics
            assert 'gateway_client_requests_total{client="cert:*",outcome="allowed"} 2.0' in metrics
            assert "stranger" not in metrics
    finally:
        served.stop()


def test_unlisted_certificates_may_be_refused(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("cert:partner-a - models=text_*\n")
    settings = Settings(
        auth=AuthSettings(keys_file=keys, trusted_proxies=["127.0.0.1/32"], unlisted_certificates="refuse")
    )
    served = ServedApp(create_app(settings, backend_factory=lambda *_: FakeBackend()), settings).start()
    stranger = {"x-forwarded-client-cert": 'Hash=y;Subject="CN=stranger"'}
    try:
        with httpx.Client(base_url=served.url, timeout=10) as client:
            assert client.post("/classify", json=TEXT, headers=XFCC).status_code == 200  # listed
            refused = client.post("/classify", json=TEXT, headers=stranger)
            assert refused.status_code == 401, refused.text
    finally:
        served.stop()
