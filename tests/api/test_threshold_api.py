"""threshold on /classify and /models/{model}/classify, with the fake transport: which
labels come back, what top_k is asked of the model, and the refusals. (On real models,
multi-label ones included: tests/integration/test_own_classifiers.py.)"""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from helpers.support import FakeBackend, small_png

PNG = {"content-type": "image/png"}


def _scores(response) -> list[list[float]]:  # type: ignore[no-untyped-def]
    assert response.status_code == 200, response.text
    return [[p["score"] for p in result["predictions"]] for result in response.json()["results"]]


def test_a_threshold_keeps_the_labels_at_or_over_it_from_all_the_model_answers(
    client: TestClient, backend: FakeBackend
) -> None:
    # the fake scores rank r as 1 / (r + 1): 1, 0.5, 0.333...
    scores = _scores(client.post("/classify", content=small_png(), headers=PNG, params={"threshold": 0.5}))
    assert scores == [[1.0, 0.5]]
    assert backend.calls[-1][3] == 20  # no top_k: as many as the model answers (its max_top_k)


def test_threshold_and_top_k_together_keep_at_most_top_k(client: TestClient, backend: FakeBackend) -> None:
    scores = _scores(
        client.post("/classify", content=small_png(), headers=PNG, params={"threshold": 0.3, "top_k": 2})
    )
    assert scores == [[1.0, 0.5]]
    assert backend.calls[-1][3] == 2


def test_a_threshold_in_the_json_body_and_one_nothing_reaches(client: TestClient) -> None:
    body = {"texts": ["one", "two"], "threshold": 1.0}
    assert _scores(client.post("/classify", json=body)) == [[1.0], [1.0]]  # the fake scores texts 1.0
    image = client.post("/classify", content=small_png(), headers=PNG, params={"threshold": 1.0, "top_k": 3})
    assert _scores(image) == [[1.0]]
    # a threshold over every score: no labels, not an error
    answer = client.post("/models/text_classifier/classify", json={"text": "x", "top_k": 1, "threshold": 1.0})
    assert _scores(answer) == [[1.0]]


@pytest.mark.parametrize(
    ("query", "body"),
    [
        ({"threshold": 0}, {}),
        ({"threshold": 1.5}, {}),
        ({"threshold": -0.1}, {}),
        ({}, {"threshold": 0}),
        ({}, {"threshold": "0.5"}),
        ({}, {"threshold": True}),
        ({}, {"threshold": 2}),
        ({"threshold": 0.5}, {"threshold": 0.6}),
    ],
    ids=["zero", "over-one", "negative", "body-zero", "body-string", "body-bool", "body-two", "two-values"],
)
def test_a_threshold_outside_zero_to_one_is_a_422_problem(
    client: TestClient, query: dict[str, float], body: dict[str, object]
) -> None:
    response = client.post("/classify", json={"text": "x", **body}, params=query)
    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["type"] == "urn:triton-gateway:problem:invalid-input"


def test_models_show_how_each_classifier_makes_its_scores(client: TestClient, backend: FakeBackend) -> None:
    models = {m["name"]: m for m in client.get("/models").json()["models"]}
    assert models["image_classifier"]["caps"]["activation"] == "softmax"  # not declared: the default
    assert models["text_classifier"]["caps"]["activation"] == "softmax"
