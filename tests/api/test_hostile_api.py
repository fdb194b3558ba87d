"""Hostile input: every refusal is a small problem+json 4xx that echoes nothing back."""

from __future__ import annotations

import json
import random
import string
from typing import Any

from fastapi.testclient import TestClient

from gateway.app import create_app
from gateway.settings import DriftSettings, Settings

from helpers.support import (
    Answer,
    FakeBackend,
    jpeg_with_app_segments,
    png_with_private_chunks,
    settled_metric_series,
    small_png,
)


def assert_small_problem(response: Answer, status: int, slug: str, limit: int = 2048) -> dict[str, Any]:
    assert response.status_code == status, response.text[:500]
    assert response.headers["content-type"] == "application/problem+json"
    assert len(response.content) <= limit, len(response.content)
    body: dict[str, Any] = response.json()
    assert body["type"] == f"urn:triton-gateway:problem:{slug}"
    return body


def test_huge_json_integer_is_400_not_500(client: TestClient) -> None:
    body = b'{"text": "hello", "top_k": ' + b"9" * 100_000 + b"}"
    response = client.post("/classify", content=body, headers={"content-type": "application/json"})
    assert_small_problem(response, 400, "malformed-request")


def test_huge_integer_nested_anywhere_is_400(client: TestClient) -> None:
    body = b'{"texts": ["a"], "x": [[[' + b"1" * 50_000 + b"]]]}"
    response = client.post("/classify", content=body, headers={"content-type": "application/json"})
    assert_small_problem(response, 400, "malformed-request")


def test_long_list_of_objects_is_a_small_413(client: TestClient) -> None:
    # 0.9 MB: once gave a 19.7 MB 422 listing every item.
    # now refused at its first object, before the rest is read: no classify body nests that deep
    body = json.dumps({"texts": [{}] * 300_000}).encode()
    response = client.post("/classify", content=body, headers={"content-type": "application/json"})
    problem = assert_small_problem(response, 422, "invalid-input")
    assert "nested over 2 levels" in problem["detail"]


def test_wrong_items_within_the_cap_report_a_few_errors(client: TestClient) -> None:
    response = client.post("/classify", json={"texts": [{"x": i} for i in range(64)]})
    problem = assert_small_problem(response, 422, "invalid-input")
    assert 1 <= len(problem["errors"]) <= 5
    assert problem["errors"][0]["loc"] == ["texts", 0]


def test_unknown_key_is_not_echoed(client: TestClient) -> None:
    key = "k" * 100_000
    response = client.post("/classify", json={"text": "hello", key: 1})
    problem = assert_small_problem(response, 422, "invalid-input")
    assert "kkkkkkkk" not in response.text
    assert problem["errors"][0]["loc"] == ["<unknown key>"]


def test_many_unknown_keys_are_one_small_error(client: TestClient) -> None:
    document: dict[str, object] = {f"key{i}": i for i in range(100_000)}
    document["text"] = "hello"
    response = client.post("/classify", json=document)
    # refused by the count of its values before it is parsed (no classify body has 256)
    assert_small_problem(response, 413, "payload-too-large")
    assert "key1" not in response.text


def test_text_request_has_its_own_body_cap(client: TestClient, settings: Settings) -> None:
    cap = settings.max_text_body_bytes
    assert cap < settings.max_json_body_bytes
    padding = " " * (cap + 1)  # whitespace is valid JSON: only the size is wrong
    body = b'{"text": "hello"' + padding.encode() + b"}"
    response = client.post("/classify", content=body, headers={"content-type": "application/json"})
    assert_small_problem(response, 413, "payload-too-large")


def test_long_content_type_is_not_echoed(client: TestClient) -> None:
    kind = "application/x-" + "y" * 10_000
    response = client.post("/classify", content=b"abc", headers={"content-type": kind})
    assert_small_problem(response, 415, "unsupported-media-type")
    assert "yyyyyyyy" not in response.text


def test_long_path_is_not_echoed(client: TestClient) -> None:
    response = client.get("/" + "p" * 8000)
    problem = assert_small_problem(response, 404, "not-found")
    assert "pppppppp" not in response.text
    assert "instance" not in problem


def test_invented_method_is_not_echoed(client: TestClient) -> None:
    response = client.request("FROBNICATEX", "/classify")
    assert_small_problem(response, 405, "method-not-allowed")
    assert "FROBNICATEX" not in response.text


def test_problem_instance_is_the_route_template(client: TestClient) -> None:
    response = client.post("/classify?junk=" + "q" * 3000, content=b"", headers={"content-type": "image/png"})
    problem = assert_small_problem(response, 422, "invalid-input")
    assert problem["instance"] == "/classify"


def test_png_with_many_chunks_is_refused_cheaply(client: TestClient) -> None:
    response = client.post(
        "/classify", content=png_with_private_chunks(600_000), headers={"content-type": "image/png"}
    )
    problem = assert_small_problem(response, 422, "invalid-input")
    assert "segments" in problem["detail"]
    ok = client.post("/classify", content=png_with_private_chunks(20), headers={"content-type": "image/png"})
    assert ok.status_code == 200, ok.text


def test_jpeg_with_many_markers_is_refused_cheaply(client: TestClient) -> None:
    response = client.post(
        "/classify", content=jpeg_with_app_segments(100_000), headers={"content-type": "image/jpeg"}
    )
    assert_small_problem(response, 422, "invalid-input")
    ok = client.post("/classify", content=jpeg_with_app_segments(10), headers={"content-type": "image/jpeg"})
    assert ok.status_code == 200, ok.text


def test_answers_carry_safety_headers(client: TestClient) -> None:
    for response in (
        client.post("/classify", content=small_png(), headers={"content-type": "image/png"}),
        client.post("/classify", content=b"", headers={"content-type": "image/png"}),
        client.get("/livez"),
    ):
        assert response.headers["x-content-type-options"] == "nosniff"
        assert response.headers["cache-control"] == "no-store"


def test_openapi_lists_carry_their_caps(client: TestClient, settings: Settings) -> None:
    schema = client.get("/openapi.json").json()["components"]["schemas"]["ClassifyJSONRequest"]
    props = schema["properties"]

    def max_items(name: str) -> int:
        return int(
            next(option["maxItems"] for option in props[name]["anyOf"] if option.get("type") == "array")
        )

    assert max_items("images") == settings.image.max_images
    assert max_items("texts") == settings.text.max_texts
    assert max_items("candidate_labels") == settings.text.max_candidate_labels


def test_random_methods_and_paths_do_not_grow_the_series(backend: FakeBackend) -> None:
    rng = random.Random(11)

    def word(n: int) -> str:
        return "".join(rng.choice(string.ascii_uppercase) for _ in range(n))

    app = create_app(Settings(drift=DriftSettings(interval_seconds=0.2)), backend_factory=lambda *_: backend)
    with TestClient(app, raise_server_exceptions=False) as client:
        for _ in range(20):  # every (route, method, status) combination the loop below can make
            client.request(word(6), "/" + word(8).lower())
            client.get("/" + word(8).lower())
        client.get("/metrics")  # its own series exist from here on
        before = settled_metric_series(client)
        for _ in range(1000):
            client.request(word(rng.randint(3, 12)), "/" + word(rng.randint(1, 40)).lower())
        assert settled_metric_series(client) - before == set()
