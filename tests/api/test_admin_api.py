"""The admin surface as an operator and a client see it (fake backend): off by default,
its own keys, pins, and what /readyz and /models say about an unloaded model."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from gateway.app import create_app
from gateway.settings import AdminSettings, AuthSettings, Settings, TritonSettings
from gateway.shared.keyfiles import hash_key

from helpers.support import FakeBackend, chelsea_jpeg

ADMIN = {"Authorization": "Bearer admin-secret"}
CLIENT = {"X-API-Key": "client-secret"}
TEXT = {"text": "The striker scored twice."}


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, Path]:
    admin, client = tmp_path / "admin-keys", tmp_path / "client-keys"
    admin.write_text(f"ops {hash_key('admin-secret')}\n")
    client.write_text(f"app {hash_key('client-secret')}\n")
    return admin, client


@pytest.fixture
def backend() -> FakeBackend:
    return FakeBackend()


@pytest.fixture
def client(keys: tuple[Path, Path], backend: FakeBackend) -> Iterator[TestClient]:
    settings = Settings(admin=AdminSettings(keys_file=keys[0]), auth=AuthSettings(keys_file=keys[1]))
    with TestClient(create_app(settings, backend_factory=lambda *_: backend)) as test_client:
        yield test_client


def test_without_an_admin_keys_file_there_is_no_admin_surface() -> None:
    with TestClient(create_app(Settings(), backend_factory=lambda *_: FakeBackend())) as plain:
        for method, path in (("GET", "/admin/repository"), ("POST", "/admin/models/text_classifier/load")):
            response = plain.request(method, path, headers=ADMIN)
            assert response.status_code == 404, path
            assert response.headers["content-type"] == "application/problem+json"
        assert not any(p.startswith("/admin") for p in plain.get("/openapi.json").json()["paths"])


def test_admin_routes_take_admin_keys_only(client: TestClient, backend: FakeBackend) -> None:
    for headers in ({}, CLIENT, {"Authorization": "Bearer wrong"}):
        response = client.post("/admin/models/text_classifier/unload", headers=headers)
        assert response.status_code == 401, headers
        assert response.json()["type"].endswith(":unauthorized")
    assert backend.control == []
    # ... and an admin key opens nothing else
    assert client.post("/classify", json=TEXT, headers=ADMIN).status_code == 401
    assert client.post("/classify", json=TEXT, headers=CLIENT).status_code == 200
    listed = client.get("/admin/repository", headers=ADMIN)
    assert listed.status_code == 200
    assert {m["name"]: m["state"] for m in listed.json()["models"]}["text_classifier"] == "READY"


def test_unknown_or_malformed_model_names_are_refused_before_triton(
    client: TestClient, backend: FakeBackend
) -> None:
    assert client.post("/admin/models/nope/load", headers=ADMIN).status_code == 404
    for bad in ("..%2F..%2Fetc", "a" * 200, "x%20y"):
        assert client.post(f"/admin/models/{bad}/load", headers=ADMIN).status_code in (404, 422), bad
    assert backend.control == []


def test_an_unload_answers_once_triton_has_finished_it(client: TestClient, backend: FakeBackend) -> None:
    # Triton's unload can return while the model's stub still stops (UNLOADING); the answer
    # promises /models says unloaded, so it waits for that
    backend.unloading_reads = 3
    response = client.post("/admin/models/text_classifier/unload", headers=ADMIN)
    assert response.status_code == 200, response.text
    assert [m["state"] for m in response.json()["models"]] == ["UNAVAILABLE"]
    models = {m["name"]: m for m in client.get("/models", headers=CLIENT).json()["models"]}
    assert models["text_classifier"]["state"] == "unloaded"


def test_an_unload_that_never_finishes_is_a_409_within_the_load_timeout(
    keys: tuple[Path, Path], backend: FakeBackend
) -> None:
    settings = Settings(
        admin=AdminSettings(keys_file=keys[0]),
        auth=AuthSettings(keys_file=keys[1]),
        triton=TritonSettings(load_timeout_seconds=0.3),
    )
    backend.unloading_reads = 10_000  # Triton says UNLOADING for good
    with TestClient(create_app(settings, backend_factory=lambda *_: backend)) as client:
        response = client.post("/admin/models/text_classifier/unload", headers=ADMIN)
    assert response.status_code == 409, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert "still unloading" in response.json()["detail"]  # the bound, not a hang


def test_unload_is_reported_by_readyz_and_models_and_the_rest_is_served(
    client: TestClient, backend: FakeBackend
) -> None:
    response = client.post("/admin/models/text_classifier/unload", headers=ADMIN)
    assert response.status_code == 200
    assert response.json()["models"] == [
        {"name": "text_classifier", "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"}
    ]
    ready = client.get("/readyz", headers=CLIENT)  # a known caller is told which
    assert ready.status_code == 200, ready.text
    assert ready.json()["status"] == "degraded"
    assert ready.json()["unloaded"] == ["text_classifier"]
    models = {m["name"]: m for m in client.get("/models", headers=CLIENT).json()["models"]}
    assert models["text_classifier"]["state"] == "unloaded"
    assert not models["text_classifier"]["ready"]
    assert models["image_classifier"]["state"] == "ready"
    image = client.post("/classify", content=chelsea_jpeg(), headers={**CLIENT, "Content-Type": "image/jpeg"})
    assert image.status_code == 200
    # with every served model unloaded there is nothing left to serve: not ready
    client.post("/admin/models/image_classifier/unload", headers=ADMIN)
    assert client.get("/readyz").status_code == 503
    # loading them again makes the gateway ready again
    for name in ("image_classifier", "text_classifier"):
        assert client.post(f"/admin/models/{name}/load", headers=ADMIN).status_code == 200
    assert client.get("/readyz").json()["status"] == "ready"


def test_a_failing_model_is_still_not_ready(client: TestClient, backend: FakeBackend) -> None:
    backend.ready = False  # failing, not unloaded
    assert client.get("/readyz").status_code == 503


def test_reload_of_a_model_that_is_not_loaded_is_a_conflict(client: TestClient, backend: FakeBackend) -> None:
    backend.unloaded.add("text_labels")
    response = client.post("/admin/models/text_labels/reload", headers=ADMIN)
    assert response.status_code == 409
    assert backend.control == []
    assert client.post("/admin/models/text_classifier/reload", headers=ADMIN).status_code == 200
    # and the model listing its labels, which is not loaded, along with it
    assert backend.control == [("load", "text_classifier"), ("load", "text_labels")]


def test_the_pin_moves_to_a_ready_version_only(client: TestClient, backend: FakeBackend) -> None:
    jpeg = {**CLIENT, "Content-Type": "image/jpeg"}
    client.post("/classify", content=chelsea_jpeg(), headers=jpeg)
    refused = client.put("/admin/served/image_classifier", json={"version": "9"}, headers=ADMIN)
    assert refused.status_code == 409
    assert client.put("/admin/served/nope", json={"version": "1"}, headers=ADMIN).status_code == 404
    assert (
        client.put("/admin/served/image_classifier", json={"version": "x"}, headers=ADMIN).status_code == 422
    )
    moved = client.put("/admin/served/image_classifier", json={"version": "2"}, headers=ADMIN)
    assert moved.status_code == 200
    assert moved.json() == {
        "name": "image_classifier",
        "task": "image-classification",
        "version": "2",
        "composing_models": [
            {"name": "image_classifier.pre", "ready": True, "versions": ["1", "2", "3"]},
            {"name": "image_classifier.net", "ready": True, "versions": ["1", "2", "3"]},
        ],
    }
    client.post("/classify", content=chelsea_jpeg(), headers=jpeg)
    assert backend.versions_called == ["", "2"]
    models = {m["name"]: m for m in client.get("/models", headers=CLIENT).json()["models"]}
    assert models["image_classifier"]["pinned_version"] == "2"
    served = client.get("/admin/served", headers=ADMIN).json()
    assert [(m["name"], m["version"]) for m in served] == [("image_classifier", "2"), ("text_classifier", "")]


def test_rollout_targets_are_checked_and_a_version_promotion_moves_the_pin(
    client: TestClient, backend: FakeBackend
) -> None:
    route = "/admin/models/text_classifier/rollout"
    refusals = {
        "another task": {"canary": {"target": "image_classifier", "weight": 0.5}},
        "not catalogued": {"canary": {"target": "nothing_here", "weight": 0.5}},
        "what it serves": {"shadow": {"target": "text_classifier", "sample": 1.0}},
        "not ready": {"shadow": {"target": "text_classifier:9", "sample": 1.0}},
    }
    for why, body in refusals.items():
        refused = client.put(route, json=body, headers=ADMIN)
        assert refused.status_code == 409, (why, refused.text)
        assert refused.headers["content-type"] == "application/problem+json"
    assert client.put(route, json={}, headers=ADMIN).status_code == 422
    assert (
        client.put(
            route, json={"canary": {"target": "text_classifier:2", "weight": 2}}, headers=ADMIN
        ).status_code
        == 422
    )
    assert (
        client.put(
            route, json={"canary": {"target": "text_classifier:2", "weight": 1}}, headers=CLIENT
        ).status_code
        == 401
    )
    assert client.get(route, headers=ADMIN).status_code == 404
    set_ = client.put(route, json={"canary": {"target": "text_classifier:2", "weight": 1.0}}, headers=ADMIN)
    assert set_.status_code == 200, set_.text
    assert set_.json()["canary"] == {"target": "text_classifier:2", "weight": 1.0}
    # every request goes to the canary (version 2) now, counted on its arm
    assert client.post("/classify", json=TEXT, headers=CLIENT).status_code == 200
    arms = client.get(route, headers=ADMIN).json()["statistics"]["arms"]
    assert arms["canary"]["requests"] == 1
    promoted = client.post(f"{route}/promote", headers=ADMIN)
    assert promoted.json() == {
        "model": "text_classifier",
        "promoted": "text_classifier:2",
        "change": "pinned",
    }
    served = {s["name"]: s["version"] for s in client.get("/admin/served", headers=ADMIN).json()}
    assert served["text_classifier"] == "2"
    assert client.get(route, headers=ADMIN).status_code == 404  # the rollout ended
    assert client.post(f"{route}/rollback", headers=ADMIN).status_code == 404


def _drift_client(keys: tuple[Path, Path], backend: FakeBackend) -> TestClient:
    settings = Settings(
        admin=AdminSettings(keys_file=keys[0]),
        auth=AuthSettings(keys_file=keys[1]),
        drift={"min_inputs": 10, "interval_seconds": 0.2, "slot_seconds": 1, "window_seconds": 60},
    )
    return TestClient(create_app(settings, backend_factory=lambda *_: backend))


def test_a_drift_reference_is_captured_shown_and_dropped_through_the_admin_surface(
    keys: tuple[Path, Path], backend: FakeBackend
) -> None:
    path = "/admin/models/text_classifier/reference"
    with _drift_client(keys, backend) as client:
        # admin keys only; an unknown model or version is 404 before anything is counted
        assert client.post(path, headers=CLIENT).status_code == 401
        assert client.post("/admin/models/nope/reference", headers=ADMIN).status_code == 404
        assert client.post(f"{path}?version=99", headers=ADMIN).status_code == 404
        assert client.post(f"{path}?version=x", headers=ADMIN).status_code == 422
        assert client.get(path, headers=ADMIN).status_code == 404
        assert client.delete(path, headers=ADMIN).status_code == 404
        # too few inputs in the window: 409, saying how many it needs
        refused = client.post(path, headers=ADMIN)
        assert refused.status_code == 409, refused.text
        assert refused.headers["content-type"] == "application/problem+json"
        assert "GATEWAY_DRIFT__MIN_INPUTS" in refused.json()["detail"]

        texts = {"texts": [f"text number {i}" for i in range(12)]}
        assert client.post("/classify", json=texts, headers=CLIENT).status_code == 200
        # zero-shot answers over the client's own labels are not counted
        own = {"texts": ["x"] * 5, "candidate_labels": ["a", "b"]}
        assert client.post("/classify", json=own, headers=CLIENT).status_code == 200
        captured = client.post(path, headers=ADMIN)
        assert captured.status_code == 200, captured.text
        assert captured.json()["inputs"] == 12
        assert captured.json()["source"] == "captured"
        counts = client.get(path, headers=ADMIN).json()
        assert sum(counts["labels"].values()) == 12
        assert sum(counts["scores"]) == 12

        # the catalog shows it, with the live window, to clients too
        deadline = time.monotonic() + 5
        while True:
            drift = client.get("/models/text_classifier", headers=CLIENT).json()["drift"]
            # the fake backend answers as version 2
            if drift["versions"] and drift["versions"]["2"]["drift"] is not None:
                break
            assert time.monotonic() < deadline, str(drift)
            time.sleep(0.1)
        assert drift["reference"]["inputs"] == 12
        assert drift["versions"]["2"]["drift"]["labels"] == pytest.approx(0, abs=1e-9)
        assert drift["versions"]["1"]["inputs"] == 0
        listed = client.get("/models", headers=CLIENT).json()["models"]
        assert next(m for m in listed if m["name"] == "text_classifier")["drift"]["reference"] is not None
        assert client.get("/models/nope", headers=CLIENT).status_code == 404

        dropped = client.delete(path, headers=ADMIN)
        assert dropped.status_code == 200, dropped.text
        assert dropped.json()["reference"] is None
        assert client.get(path, headers=ADMIN).status_code == 404
