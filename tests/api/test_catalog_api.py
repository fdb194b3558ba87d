"""The catalog's routes with a fake transport: /models/{model}/classify, /v2 on the
catalog, errors, bounded metric labels, and the defects found on the way (each test here
failed on the code before the catalog)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gateway import errors
from gateway.app import create_app
from gateway.errors import GatewayError
from gateway.settings import AuthSettings, DriftSettings, ImageLimits, Settings
from gateway.shared.keyfiles import hash_key
from gateway.triton.backend import ModelConfig

from helpers.support import Answer, FakeBackend, chelsea_jpeg, settled_metric_series, small_png

PNG = {"content-type": "image/png"}


def problem(response: Answer, status: int, slug: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body: dict[str, Any] = response.json()
    assert body["type"] == f"urn:triton-gateway:problem:{slug}", body
    assert body["status"] == status
    return body


def second_image_classifier(backend: FakeBackend, name: str = "image_classifier_b") -> None:
    """Another image classifier sharing the first one's steps (as Triton allows)."""
    first = backend.models["image_classifier"]
    backend.models[name] = ModelConfig(
        name, "ensemble", 32, {"gateway_task": "image-classification"}, first.inputs, first.steps
    )


def test_the_new_routes_are_documented(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    for path in ("/models/{model}/classify", "/models/{model}/versions/{version}/classify"):
        operation = paths[path]["post"]
        assert {"multipart/form-data", "application/json", "image/jpeg"} <= set(
            operation["requestBody"]["content"]
        )
        ok = operation["responses"]["200"]["content"]["application/json"]["schema"]
        assert ok["$ref"].endswith("/ClassifyResponse")
        assert {"404", "413", "415", "422", "503"} <= set(operation["responses"])


def test_readyz_reports_every_catalogued_model(client: TestClient) -> None:
    assert client.get("/readyz").json()["models"] == {"image_classifier": "ready", "text_classifier": "ready"}


def test_any_catalogued_model_answers_by_name(client: TestClient, backend: FakeBackend) -> None:
    image = client.post("/models/image_classifier/classify", content=small_png(), headers=PNG)
    assert image.status_code == 200, image.text
    assert image.json()["model"] == "image_classifier"
    text = client.post("/models/text_classifier/classify", json={"texts": ["a", "b"], "top_k": 1})
    assert text.status_code == 200
    assert [r["predictions"][0]["label"] for r in text.json()["results"]] == ["a", "b"]
    assert backend.calls[-1][0] == "text_classifier"


def test_a_version_can_be_named(client: TestClient, backend: FakeBackend) -> None:
    response = client.post("/models/image_classifier/versions/2/classify", content=small_png(), headers=PNG)
    assert response.status_code == 200
    assert backend.versions_called[-1] == "2"
    problem(
        client.post("/models/image_classifier/versions/x/classify", content=small_png(), headers=PNG),
        404,
        "not-found",
    )


def test_unknown_models_are_404_before_the_body_is_read(client: TestClient, backend: FakeBackend) -> None:
    for name in ("nope", "image_classifier.pre", "text_labels"):  # steps and helpers are not exposed
        body = problem(
            client.post(f"/models/{name}/classify", content=small_png(), headers=PNG), 404, "not-found"
        )
        assert name not in body["detail"]
    assert backend.calls == []


def test_an_input_of_the_wrong_kind_says_what_the_model_takes(
    client: TestClient, backend: FakeBackend
) -> None:
    body = problem(
        client.post("/models/image_classifier/classify", json={"text": "hello"}), 422, "wrong-input-kind"
    )
    assert "takes images" in body["detail"]
    body = problem(
        client.post("/models/text_classifier/classify", content=small_png(), headers=PNG),
        422,
        "wrong-input-kind",
    )
    assert "takes texts" in body["detail"]
    assert backend.calls == []


@pytest.fixture
def fast() -> Iterator[tuple[TestClient, FakeBackend]]:
    backend = FakeBackend()
    app = create_app(Settings(catalog_refresh_seconds=0.2), backend_factory=lambda *_: backend)
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client, backend


def _until(check, seconds: float = 3.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "not within the time"
        time.sleep(0.05)


def test_a_model_loaded_later_is_served_without_a_restart(fast: tuple[TestClient, FakeBackend]) -> None:
    client, backend = fast
    problem(
        client.post("/models/image_classifier_b/classify", content=small_png(), headers=PNG), 404, "not-found"
    )
    second_image_classifier(backend)
    _until(
        lambda: (
            client.post("/models/image_classifier_b/classify", content=small_png(), headers=PNG).status_code
            == 200
        )
    )
    listed = {m["name"]: m for m in client.get("/models").json()["models"]}
    assert listed["image_classifier_b"]["default"] is False
    assert listed["image_classifier_b"]["caps"]["max_top_k"] == 20  # from the steps it shares
    # /v2 exposes the same catalog, with no allow-list to edit
    assert client.get("/v2/models/image_classifier_b").status_code == 200
    del backend.models["image_classifier_b"]
    _until(
        lambda: (
            client.post("/models/image_classifier_b/classify", content=small_png(), headers=PNG).status_code
            == 404
        )
    )


def test_a_model_that_is_not_ready_is_503_with_retry_after(fast: tuple[TestClient, FakeBackend]) -> None:
    client, backend = fast
    backend.unloaded.add("text_classifier")

    def state() -> str:
        return str({m["name"]: m["state"] for m in client.get("/models").json()["models"]}["text_classifier"])

    _until(lambda: state() == "unloaded")  # the catalog followed Triton
    response = client.post("/models/text_classifier/classify", json={"text": "hello"})
    problem(response, 503, "triton-unavailable")
    assert response.headers["retry-after"] == "5"


def test_invented_model_names_do_not_grow_the_metric_series(backend: FakeBackend) -> None:
    # The drift window's series (gateway_prediction_window_inputs, one per served version)
    # appear at its first pass, drift.interval_seconds after start: the suite once saw them
    # land mid-test on a loaded machine. Its pass made early and waited for, so the series
    # compared are only what the invented names could add.
    settings = Settings(drift=DriftSettings(interval_seconds=0.2))
    app = create_app(settings, backend_factory=lambda *_: backend)
    with TestClient(app, raise_server_exceptions=False) as client:
        client.post("/models/invented-0/classify", content=small_png(), headers=PNG)
        client.post("/v2/models/invented-0/infer", json={"inputs": []})
        before = settled_metric_series(client, prefix="")
        for number in range(1, 1001):
            route = "/models/invented-{0}/classify" if number % 2 else "/v2/models/invented-{0}/infer"
            assert client.post(route.format(number), content=small_png(), headers=PNG).status_code == 404
        assert settled_metric_series(client, prefix="") - before == set()
        assert "invented" not in client.get("/metrics").text


def test_v2_applies_the_same_text_checks_as_classify(client: TestClient, backend: FakeBackend) -> None:
    def v2(labels: list[str]) -> dict:  # type: ignore[type-arg]
        return {
            "inputs": [
                {"name": "TEXT", "datatype": "BYTES", "shape": [1, 1], "data": ["hello"]},
                {"name": "TOP_K", "datatype": "INT32", "shape": [1, 1], "data": [1]},
                {"name": "CANDIDATE_LABELS", "datatype": "BYTES", "shape": [1, len(labels)], "data": labels},
            ]
        }

    many = [f"label {i}" for i in range(40)]
    assert client.post("/classify", json={"text": "hello", "candidate_labels": many}).status_code == 413
    assert client.post("/v2/models/text_classifier/infer", json=v2(many)).status_code == 413
    repeated = ["sports", "sports"]
    assert client.post("/classify", json={"text": "hello", "candidate_labels": repeated}).status_code == 422
    response = client.post("/v2/models/text_classifier/infer", json=v2(repeated))
    assert response.status_code == 422
    assert response.json()["detail"] == "candidate_labels repeats a label"
    assert backend.calls == []


def test_v2_errors_are_application_json_with_the_protocols_error(client: TestClient) -> None:
    response = client.get("/v2/models/nope")
    assert response.status_code == 404
    assert response.headers["content-type"] == "application/json"
    assert response.json()["error"] == response.json()["detail"]


def test_readyz_problem_comes_from_the_error_tree(client: TestClient, backend: FakeBackend) -> None:
    backend.ready = False
    body = problem(client.get("/readyz"), 503, errors.NotReadyError.slug)
    assert body["title"] == errors.NotReadyError.title
    assert body["checks"]["model:image_classifier"] is False


def _classes() -> dict[str, type[GatewayError]]:
    found: dict[str, type[GatewayError]] = {}
    pending: list[type[GatewayError]] = [GatewayError]
    while pending:
        cls = pending.pop()
        found[cls.slug] = cls
        pending.extend(cls.__subclasses__())
    return found


def test_openapi_examples_agree_with_the_error_classes(client: TestClient) -> None:
    classes = _classes()
    examples = 0
    for path in client.get("/openapi.json").json()["paths"].values():
        for operation in path.values():
            for status, response in operation.get("responses", {}).items():
                content = response.get("content", {})
                example = (
                    content.get("application/problem+json") or content.get("application/json") or {}
                ).get("example")
                if example is None or "type" not in example:
                    continue
                examples += 1
                cls = classes[example["type"].rsplit(":", 1)[1]]
                assert (example["title"], example["status"]) == (cls.title, cls.status), status
    assert examples > 20


def test_refusals_by_the_auth_layer_are_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    keys = tmp_path / "keys"
    keys.write_text(f"alice {hash_key('k-alice')}\n")
    app = create_app(Settings(auth=AuthSettings(keys_file=keys)), backend_factory=lambda *_: FakeBackend())
    caplog.set_level(logging.WARNING, "gateway.errors")
    with TestClient(app) as client:
        assert client.post("/classify", content=chelsea_jpeg(), headers=PNG).status_code == 401
    assert any("401 unauthorized" in record.getMessage() for record in caplog.records)


def test_a_text_model_without_candidate_labels_refuses_them() -> None:
    backend = FakeBackend()
    first = backend.models["text_classifier"]
    backend.models["text_plain"] = ModelConfig(
        "text_plain",
        "ensemble",
        8,
        {"gateway_task": "text-classification"},
        ("TEXT", "TOP_K"),
        first.steps,
    )
    app = create_app(Settings(), backend_factory=lambda *_: backend)
    with TestClient(app, raise_server_exceptions=False) as client:
        body = {"texts": ["a"], "candidate_labels": ["x", "y"]}
        detail = problem(client.post("/models/text_plain/classify", json=body), 422, "invalid-input")[
            "detail"
        ]
        assert "no candidate_labels" in detail
        # its own caps: 8 texts a request (its max_batch_size), not the gateway's 64
        problem(
            client.post("/models/text_plain/classify", json={"texts": ["a"] * 9}), 413, "payload-too-large"
        )
        assert client.post("/models/text_plain/classify", json={"texts": ["a"] * 8}).status_code == 200
        assert backend.texts[-1] == (["a"] * 8, None)


def test_models_shows_a_refused_setting(backend: FakeBackend) -> None:
    settings = Settings(image=ImageLimits(max_pixels=90_000_000))
    with TestClient(create_app(settings, backend_factory=lambda *_: backend)) as client:
        image = {m["name"]: m for m in client.get("/models").json()["models"]}["image_classifier"]
    assert image["caps"]["max_pixels"] == 40_000_000
    assert image["caps"]["refused_settings"][0].startswith("GATEWAY_IMAGE__MAX_PIXELS=90000000 would widen")
