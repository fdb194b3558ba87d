"""Which models a key may use (its keys-file line's ``models=``): on every HTTP route a
model outside its list is answered exactly as a model that does not exist, and listings
show only its models. (The gRPC door: tests/integration/test_grpc_door.py.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gateway.app import create_app
from gateway.settings import AuthSettings, Settings
from gateway.shared.keyfiles import hash_key

from helpers.support import FakeBackend, small_png

TEXT_ONLY = {"X-API-Key": "text-secret"}
EVERYTHING = {"X-API-Key": "all-secret"}
TEXT = {"text": "The striker scored twice."}
TEXT_INFER = {
    "inputs": [
        {"name": "TEXT", "shape": [1, 1], "datatype": "BYTES", "data": ["a text"]},
        {"name": "TOP_K", "shape": [1, 1], "datatype": "INT32", "data": [1]},
    ]
}
PNG = {"content-type": "image/png"}


@pytest.fixture
def client(tmp_path: Path) -> Iterator[TestClient]:
    keys = tmp_path / "keys"
    keys.write_text(f"texts {hash_key('text-secret')} models=text_*\nall {hash_key('all-secret')}\n")
    settings = Settings(auth=AuthSettings(keys_file=keys))
    with TestClient(create_app(settings, backend_factory=lambda *_: FakeBackend())) as test_client:
        yield test_client


def _same(first: Any, second: Any, name: str, other_name: str) -> None:
    """Two refusals a client cannot tell apart (the request id, and the name it asked
    for where Triton's text quotes it, aside)."""
    assert first.status_code == second.status_code
    one, other = first.json(), second.json()
    for answer in (one, other):
        answer.pop("request_id", None)
        answer.pop("instance", None)
    assert first.text.count(name) == second.text.count(other_name)
    assert str(one).replace(name, "?") == str(other).replace(other_name, "?")


def test_a_key_uses_the_models_of_its_list(client: TestClient) -> None:
    assert client.post("/classify", json=TEXT, headers=TEXT_ONLY).status_code == 200
    assert client.post("/models/text_classifier/classify", json=TEXT, headers=TEXT_ONLY).status_code == 200
    answer = client.post("/v2/models/text_classifier/infer", json=TEXT_INFER, headers=TEXT_ONLY)
    assert answer.status_code == 200
    assert client.get("/v2/models/text_classifier", headers=TEXT_ONLY).status_code == 200


def test_a_model_outside_the_list_is_a_model_that_does_not_exist(client: TestClient) -> None:
    cases: list[tuple[str, str, dict[str, Any]]] = [
        ("POST", "/models/{}/classify", {"content": small_png(), "headers": PNG}),
        ("GET", "/models/{}", {}),
        ("GET", "/v2/models/{}", {}),
        ("GET", "/v2/models/{}/ready", {}),
        ("GET", "/v2/models/{}/config", {}),
        ("GET", "/v2/models/{}/stats", {}),
        ("POST", "/v2/models/{}/infer", {"json": TEXT_INFER}),
    ]
    for method, path, kwargs in cases:
        headers = {**kwargs.pop("headers", {}), **TEXT_ONLY}
        refused = client.request(method, path.format("image_classifier"), headers=headers, **kwargs)
        missing = client.request(method, path.format("no_such_model"), headers=headers, **kwargs)
        assert refused.status_code == 404, (path, refused.text)
        _same(refused, missing, "image_classifier", "no_such_model")
        # the key that may use every model reaches it
        allowed = client.request(
            method, path.format("image_classifier"), headers={**headers, **EVERYTHING}, **kwargs
        )
        assert allowed.status_code != 404, (path, allowed.text)


def test_the_default_of_a_kind_outside_the_list_is_as_if_there_were_none(client: TestClient) -> None:
    refused = client.post("/classify", content=small_png(), headers={**PNG, **TEXT_ONLY})
    assert refused.status_code == 422  # what a gateway without an image model answers
    assert refused.json()["detail"] == "this gateway serves no image model"
    assert client.post("/classify", content=small_png(), headers={**PNG, **EVERYTHING}).status_code == 200


def test_listings_show_only_the_keys_models(client: TestClient) -> None:
    listed = {m["name"] for m in client.get("/models", headers=TEXT_ONLY).json()["models"]}
    assert listed == {"text_classifier"}
    everything = {m["name"] for m in client.get("/models", headers=EVERYTHING).json()["models"]}
    assert {"text_classifier", "image_classifier"} <= everything
    stats = client.get("/v2/models/stats", headers=TEXT_ONLY).json()["model_stats"]
    assert {s["name"] for s in stats} <= {"text_classifier"}
    openai = {m["id"] for m in client.get("/v1/models", headers=TEXT_ONLY).json()["data"]}
    assert "image_classifier" not in openai


def test_a_bad_models_option_names_its_line(tmp_path: Path) -> None:
    from gateway.errors import ConfigurationError
    from gateway.shared.keyfiles import parse_keys

    with pytest.raises(ConfigurationError, match=r"keys:1: .*models="):
        parse_keys(f"a {hash_key('x')} models=text_*,bad/name\n", tmp_path / "keys")
    with pytest.raises(ConfigurationError, match=r"keys:1"):
        parse_keys(f"a {hash_key('x')} models=\n", tmp_path / "keys")
