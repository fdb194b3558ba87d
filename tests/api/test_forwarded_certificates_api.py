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
    keys.write_text(f"partner-a {hash_key('unused-secret')} models=text_*\n")
    settings = Settings(auth=AuthSettings(keys_file=keys, trusted_proxies=proxies))
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


def test_a_forwarded_certificate_names_its_subjects_cn_or_first_san() -> None:
    from gateway.http.auth import forwarded_certificate

    assert forwarded_certificate(b'Hash=a;Subject="/C=US/OU=Lyft/CN=lab-7";URI=spiffe://x') == "lab-7"
    assert forwarded_certificate(b'Hash=a;Subject="CN=first,OU=a,b";URI=,By=b;Subject="CN=second"') == "first"
    assert forwarded_certificate(b"Hash=a;URI=spiffe://ml/app;DNS=app.ml") == "spiffe://ml/app"
    assert forwarded_certificate(b"Hash=a") is None
