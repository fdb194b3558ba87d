"""Nothing reaches or names a model a caller may not use by a side door: a rollout's
canary or shadow of another model, readiness, the catalog's ensemble steps."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from gateway.app import create_app
from gateway.settings import AdminSettings, AuthSettings, Settings
from gateway.shared.keyfiles import hash_key

from helpers.support import FakeBackend

ADMIN = {"Authorization": "Bearer admin-secret"}
TEXTS = {"X-API-Key": "texts-secret"}  # models=text_classifier
EVERY = {"X-API-Key": "every-secret"}
TEXT = {"text": "The striker scored twice."}
ROLLOUT = "/admin/models/text_classifier/rollout"


@pytest.fixture
def backend() -> FakeBackend:
    backend = FakeBackend()
    # a second text classifier (the same steps): a canary of another model
    backend.models["text_next"] = replace(backend.models["text_classifier"], name="text_next")
    return backend


@pytest.fixture
def client(tmp_path: Path, backend: FakeBackend) -> Iterator[TestClient]:
    admin, keys = tmp_path / "admin-keys", tmp_path / "keys"
    admin.write_text(f"ops {hash_key('admin-secret')}\n")
    keys.write_text(
        f"texts {hash_key('texts-secret')} models=text_classifier\nevery {hash_key('every-secret')}\n"
    )
    settings = Settings(admin=AdminSettings(keys_file=admin), auth=AuthSettings(keys_file=keys))
    with TestClient(create_app(settings, backend_factory=lambda *_: backend)) as test_client:
        yield test_client


def _served_by(client: TestClient, backend: FakeBackend, headers: dict[str, str]) -> str:
    answer = client.post("/classify", json=TEXT, headers=headers)
    assert answer.status_code == 200, answer.text
    return backend.calls[-1][0]


def test_a_canary_of_another_model_serves_only_callers_who_may_use_it(
    client: TestClient, backend: FakeBackend
) -> None:
    set_ = client.put(ROLLOUT, json={"canary": {"target": "text_next", "weight": 1.0}}, headers=ADMIN)
    assert set_.status_code == 200, set_.text
    assert _served_by(client, backend, EVERY) == "text_next"  # every request goes to the canary...
    assert _served_by(client, backend, TEXTS) == "text_classifier"  # ...but the key's own model's


def test_a_shadow_of_another_model_is_not_sent_what_a_caller_may_not_send_it(
    client: TestClient, backend: FakeBackend
) -> None:
    set_ = client.put(ROLLOUT, json={"shadow": {"target": "text_next", "sample": 1.0}}, headers=ADMIN)
    assert set_.status_code == 200, set_.text
    assert _served_by(client, backend, TEXTS) == "text_classifier"
    _served_by(client, backend, EVERY)
    deadline = time.monotonic() + 5
    while [c[0] for c in backend.calls].count("text_next") < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.2)  # a shadow of the first request would be there by now too
    called = [c[0] for c in backend.calls]
    assert called.count("text_next") == 1, called  # the shadow of the key that may use it only


def test_readiness_names_only_the_callers_models_and_no_step(client: TestClient) -> None:
    every = client.get("/readyz", headers=EVERY).json()
    assert set(every["models"]) == {"image_classifier", "text_classifier", "text_next"}
    assert {n for n in every["checks"] if n.startswith("model:")} == {
        "model:image_classifier",
        "model:text_classifier",
    }
    texts = client.get("/readyz", headers=TEXTS).json()
    assert set(texts["models"]) == {"text_classifier"}
    assert {n for n in texts["checks"] if n.startswith("model:")} == {"model:text_classifier"}
    assert client.get("/readyz").json() == {
        "status": "ready",
        "checks": {"ready": True},
        "unloaded": [],
        "models": {},
    }


def test_ensemble_steps_are_named_to_operators_only(client: TestClient) -> None:
    listed = client.get("/models", headers=EVERY)
    assert ".pre" not in listed.text
    assert ".net" not in listed.text
    assert ".pre" not in client.get("/models/text_classifier", headers=EVERY).text
    served = {s["name"]: s for s in client.get("/admin/served", headers=ADMIN).json()}
    steps = served["text_classifier"]["composing_models"]
    assert [(s["name"], s["ready"]) for s in steps] == [
        ("text_classifier.pre", True),
        ("text_classifier.net", True),
    ]
