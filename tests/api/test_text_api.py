"""/classify with texts: validation rules and what reaches the backend (fake backend)."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from helpers.support import FakeBackend


def post_json(client: TestClient, body: str) -> object:
    return client.post(
        "/classify", content=body.encode("utf-8"), headers={"content-type": "application/json"}
    )


def test_single_text(client: TestClient, backend: FakeBackend) -> None:
    response = client.post("/classify", json={"text": "The striker scored twice."})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model"] == "text_classifier"
    assert body["model_version"] == "2"
    assert body["results"] == [
        {
            "index": 0,
            "predictions": [{"label": "The striker scored twice.", "score": 1.0, "class_id": 0}],
            "truncated": False,
        }
    ]
    assert backend.texts == [(["The striker scored twice."], None)]


def test_texts_keep_order_and_candidate_labels_are_passed(client: TestClient, backend: FakeBackend) -> None:
    texts = [f"sentence number {i}" for i in range(8)]
    response = client.post(
        "/classify?top_k=2", json={"texts": texts, "candidate_labels": ["cooking", "travel"]}
    )
    assert [r["predictions"][0]["label"] for r in response.json()["results"]] == texts
    assert backend.texts[-1] == (texts, ["cooking", "travel"])
    assert backend.calls[-1][3] == 2


def test_text_is_nfc_normalised_and_control_characters_removed(
    client: TestClient, backend: FakeBackend
) -> None:
    decomposed = "Cafe\u0301\x00 au lait\x07\tnoir\n"
    response = client.post("/classify", json={"text": decomposed})
    assert response.status_code == 200
    assert backend.texts[-1][0] == ["Caf\u00e9 au lait\tnoir\n"]


def test_image_responses_have_no_truncated_field(client: TestClient) -> None:
    from helpers.support import small_png

    response = client.post("/classify", content=small_png(), headers={"content-type": "image/png"})
    assert "truncated" not in response.json()["results"][0]


@pytest.mark.parametrize(
    ("body", "status", "slug"),
    [
        ('{"text": ""}', 422, "invalid-input"),
        ('{"text": "   \\n\\t "}', 422, "invalid-input"),
        ('{"text": "\\u0000\\u0007"}', 422, "invalid-input"),
        ('{"text": "\\ud800"}', 422, "invalid-input"),
        ('{"text": "ok \\udfff then"}', 422, "invalid-input"),
        ('{"text": 42}', 422, "invalid-input"),
        ('{"text": null}', 422, "invalid-input"),
        ('{"texts": []}', 422, "invalid-input"),
        ('{"texts": ["fine", 3]}', 422, "invalid-input"),
        ('{"text": "a", "image": "AAAA"}', 422, "invalid-input"),
        ('{"texts": ["a"], "images": ["AAAA"]}', 422, "invalid-input"),
        ('{"candidate_labels": ["a", "b"]}', 422, "invalid-input"),
        ('{"image": "AAAA", "candidate_labels": ["a", "b"]}', 422, "invalid-input"),
        ('{"text": "a", "candidate_labels": []}', 422, "invalid-input"),
        ('{"text": "a", "candidate_labels": ["x", "x"]}', 422, "invalid-input"),
        ('{"text": "a", "candidate_labels": ["x", " "]}', 422, "invalid-input"),
        ('{"text": "a", "candidate_labels": "x"}', 422, "invalid-input"),
        ('{"text": "a", "top_k": 0}', 422, "invalid-input"),
        ('{"text": "a", "top_k": 1.5}', 422, "invalid-input"),
        ('{"text": "a", "top_k": NaN}', 422, "invalid-input"),
    ],
)
def test_invalid_texts(client: TestClient, backend: FakeBackend, body: str, status: int, slug: str) -> None:
    response = post_json(client, body)
    assert response.status_code == status, response.text  # type: ignore[attr-defined]
    assert response.headers["content-type"] == "application/problem+json"  # type: ignore[attr-defined]
    assert response.json()["type"].endswith(":" + slug)  # type: ignore[attr-defined]
    assert backend.texts == []
    assert client.post("/classify", json={"text": "fine"}).status_code == 200


def test_caps_are_413(client: TestClient, backend: FakeBackend) -> None:
    huge = client.post("/classify", json={"text": "a" * 1_000_000})
    assert huge.status_code == 413
    assert huge.json()["input_index"] == 0
    assert client.post("/classify", json={"text": "a" * 10_001}).status_code == 413
    assert client.post("/classify", json={"text": "a" * 10_000}).status_code == 200
    many = client.post("/classify", json={"texts": ["hello"] * 1000})
    assert many.status_code == 413
    labels = client.post("/classify", json={"text": "a", "candidate_labels": [f"l{i}" for i in range(33)]})
    assert labels.status_code == 413
    assert (
        client.post(
            "/classify", json={"text": "a", "candidate_labels": [f"l{i}" for i in range(32)]}
        ).status_code
        == 200
    )


def test_second_text_is_named_in_the_error(client: TestClient) -> None:
    response = client.post(
        "/classify", content=json.dumps({"texts": ["fine", ""]}), headers={"content-type": "application/json"}
    )
    assert response.status_code == 422
    assert response.json()["input_index"] == 1
