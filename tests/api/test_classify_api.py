"""/classify transports, caps and error shapes, with a fake backend."""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gateway.app import create_app
from gateway.errors import (
    GatewayError,
    InvalidImageError,
    TritonFailureError,
    TritonTimeoutError,
    TritonUnavailableError,
)
from gateway.settings import ImageLimits, Settings

from helpers.support import (
    EPS_BYTES,
    Answer,
    FakeBackend,
    chelsea_jpeg,
    coffee_png,
    png_header_only,
    random_bytes,
    small_png,
)


def label_of(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()[:8]


def assert_problem(response: Answer, status: int, slug: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body: dict[str, Any] = response.json()
    assert body["status"] == status
    assert body["type"] == f"urn:triton-gateway:problem:{slug}"
    assert body["title"]
    assert body["detail"]
    assert body["request_id"] == response.headers["x-request-id"]
    assert "Traceback" not in response.text
    return body


def test_multipart_batch_keeps_order(client: TestClient, backend: FakeBackend) -> None:
    images = [chelsea_jpeg(), coffee_png(), small_png()]
    files = [("file", (f"{i}.bin", data, "application/octet-stream")) for i, data in enumerate(images)]
    response = client.post("/classify?top_k=2", files=files)
    assert response.status_code == 200, response.text
    body = response.json()
    assert [r["predictions"][0]["label"] for r in body["results"]] == [label_of(d) for d in images]
    assert [r["index"] for r in body["results"]] == [0, 1, 2]
    assert all(len(r["predictions"]) == 2 for r in body["results"])
    assert body["model"] == "image_classifier"
    assert body["model_version"] == "3"
    assert [call[1] for call in backend.calls] == [3]  # one Triton call for the three images


def test_raw_body_with_declared_type_not_trusted(client: TestClient) -> None:
    # A PNG sent as image/jpeg is still sniffed (and accepted) as PNG.
    response = client.post("/classify", content=coffee_png(), headers={"content-type": "image/jpeg"})
    assert response.status_code == 200
    assert response.json()["results"][0]["predictions"][0]["label"] == label_of(coffee_png())


def test_json_single_and_batch(client: TestClient, backend: FakeBackend) -> None:
    one = client.post("/classify", json={"image": base64.b64encode(small_png()).decode(), "top_k": 1})
    assert one.status_code == 200
    assert len(one.json()["results"][0]["predictions"]) == 1
    many = client.post(
        "/classify", json={"images": [base64.b64encode(d).decode() for d in (coffee_png(), small_png())]}
    )
    assert [r["predictions"][0]["label"] for r in many.json()["results"]] == [
        label_of(coffee_png()),
        label_of(small_png()),
    ]
    assert backend.calls[-1][3] == 5  # the default top_k


def test_request_id_is_accepted_forwarded_and_returned(client: TestClient, backend: FakeBackend) -> None:
    response = client.post(
        "/classify", content=small_png(), headers={"content-type": "image/png", "x-request-id": "trace-42"}
    )
    assert response.headers["x-request-id"] == "trace-42"
    assert response.json()["request_id"] == "trace-42"
    assert backend.calls[-1][2] == "trace-42"


def test_invalid_request_id_is_replaced(client: TestClient) -> None:
    response = client.post(
        "/classify", content=small_png(), headers={"content-type": "image/png", "x-request-id": "bad id"}
    )
    assert response.headers["x-request-id"] != "bad id"
    assert response.json()["request_id"] == response.headers["x-request-id"]


@pytest.mark.parametrize(
    ("kwargs", "status", "slug"),
    [
        ({"content": b"", "headers": {"content-type": "image/jpeg"}}, 422, "invalid-input"),
        (
            {"content": random_bytes(), "headers": {"content-type": "image/jpeg"}},
            415,
            "unsupported-image-format",
        ),
        ({"content": EPS_BYTES, "headers": {"content-type": "image/png"}}, 415, "unsupported-image-format"),
        (
            {"content": png_header_only(50_000, 50_000), "headers": {"content-type": "image/png"}},
            413,
            "image-too-large",
        ),
        ({"content": small_png(), "headers": {"content-type": "text/plain"}}, 415, "unsupported-media-type"),
        ({"content": small_png()}, 415, "unsupported-media-type"),
        (
            {"content": b'{"image": "@@@"}', "headers": {"content-type": "application/json"}},
            400,
            "malformed-request",
        ),
        (
            {"content": b'{"image": ', "headers": {"content-type": "application/json"}},
            400,
            "malformed-request",
        ),
        (
            {"content": b'{"image": "AAAA", "top_k": NaN}', "headers": {"content-type": "application/json"}},
            422,
            "invalid-input",
        ),
        ({"json": {"image": 5}}, 422, "invalid-input"),
        ({"json": {"images": []}}, 422, "invalid-input"),
        ({"json": {}}, 422, "invalid-input"),
        ({"json": {"image": "AAAA", "images": ["AAAA"]}}, 422, "invalid-input"),
        ({"json": {"image": "AAAA", "top_k": 0}}, 422, "invalid-input"),
        ({"json": {"image": "AAAA", "top_k": True}}, 422, "invalid-input"),
        ({"json": {"image": "AAAA", "surprise": 1}}, 422, "invalid-input"),
        ({"json": ["AAAA"]}, 422, "invalid-input"),
        (
            {
                "content": b"--x\r\nContent-Type: text/plain\r\n\r\ndata\r\n--x--\r\n",
                "headers": {"content-type": "multipart/form-data; boundary=x"},
            },
            400,
            "malformed-request",
        ),
        (
            {"content": b"no boundary", "headers": {"content-type": "multipart/form-data"}},
            400,
            "malformed-request",
        ),
        ({"data": {"other": "field"}, "files": {"nope": ("a", b"x")}}, 422, "invalid-input"),
    ],
)
def test_bad_input_gets_problem_json(
    client: TestClient, backend: FakeBackend, kwargs: dict[str, Any], status: int, slug: str
) -> None:
    response = client.post("/classify", **kwargs)
    assert_problem(response, status, slug)
    assert backend.calls == []
    # ... and the next valid request succeeds.
    assert (
        client.post("/classify", content=small_png(), headers={"content-type": "image/png"}).status_code
        == 200
    )


def test_bad_top_k_query(client: TestClient) -> None:
    for value in ("0", "abc"):
        body = assert_problem(
            client.post(
                f"/classify?top_k={value}", content=small_png(), headers={"content-type": "image/png"}
            ),
            422,
            "invalid-input",
        )
        assert body["errors"][0]["loc"] == ["query", "top_k"]
    # above the model's own max_top_k (20, from its configuration)
    body = assert_problem(
        client.post("/classify?top_k=21", content=small_png(), headers={"content-type": "image/png"}),
        422,
        "invalid-input",
    )
    assert body["detail"] == "top_k must be between 1 and 20"


def test_validation_errors_never_echo_input(client: TestClient) -> None:
    secret = "S3CRET" * 1000
    response = client.post("/classify", json={"image": "AAAA", "top_k": secret})
    assert_problem(response, 422, "invalid-input")
    assert "S3CRET" not in response.text
    assert len(response.content) < 2000


def test_error_names_the_failing_input(client: TestClient) -> None:
    files = [("file", ("a", small_png())), ("file", ("b", EPS_BYTES))]
    body = assert_problem(client.post("/classify", files=files), 415, "unsupported-image-format")
    assert body["input_index"] == 1


def test_image_count_cap_is_413() -> None:
    backend = FakeBackend()
    settings = Settings(image=ImageLimits(max_images=2))
    with TestClient(create_app(settings, backend_factory=lambda *_: backend)) as client:
        files = [("file", (str(i), small_png())) for i in range(3)]
        assert_problem(client.post("/classify", files=files), 413, "payload-too-large")
        encoded = base64.b64encode(small_png()).decode()
        assert_problem(client.post("/classify", json={"images": [encoded] * 3}), 413, "payload-too-large")
        assert client.post("/classify", files=files[:2]).status_code == 200


def test_body_cap_is_enforced_while_reading() -> None:
    backend = FakeBackend()
    settings = Settings(max_body_bytes=64 * 1024, image=ImageLimits(max_bytes=32 * 1024))
    with TestClient(create_app(settings, backend_factory=lambda *_: backend)) as client:
        big = b"\xff\xd8\xff" + b"\x00" * 40_000

        def chunks() -> Iterator[bytes]:  # no Content-Length: the cap must hold while streaming
            for start in range(0, len(big), 4096):
                yield big[start : start + 4096]

        streamed = client.post("/classify", content=chunks(), headers={"content-type": "image/jpeg"})
        assert_problem(streamed, 413, "payload-too-large")
        declared = client.post("/classify", content=big, headers={"content-type": "image/jpeg"})
        assert_problem(declared, 413, "payload-too-large")
        multipart = client.post("/classify", files=[("file", ("a", b"\x00" * 70_000))])
        assert_problem(multipart, 413, "payload-too-large")
        one_big_part = client.post("/classify", files=[("file", ("a", big))])
        assert_problem(one_big_part, 413, "payload-too-large")
        too_long_json = client.post(
            "/classify",
            content=json.dumps({"image": "A" * 100_000}),
            headers={"content-type": "application/json"},
        )
        assert_problem(too_long_json, 413, "payload-too-large")
        assert backend.calls == []


@pytest.mark.parametrize(
    ("error", "status", "slug"),
    [
        (TritonUnavailableError("x", headers={"Retry-After": "5"}), 503, "triton-unavailable"),
        (TritonTimeoutError("x"), 504, "triton-timeout"),
        (TritonFailureError("x"), 502, "triton-failure"),
        (InvalidImageError("x").at(0), 422, "invalid-image"),
    ],
)
def test_backend_failures_map_to_statuses(
    backend: FakeBackend, client: TestClient, error: GatewayError, status: int, slug: str
) -> None:
    backend.fail_with = error
    response = client.post("/classify", content=small_png(), headers={"content-type": "image/png"})
    assert_problem(response, status, slug)
    if status == 503:
        assert response.headers["retry-after"] == "5"


def test_unexpected_backend_crash_is_a_bare_500(backend: FakeBackend, client: TestClient) -> None:
    class BoomError(Exception):
        pass

    backend.fail_with = BoomError("internal secret")  # type: ignore[assignment]
    response = client.post("/classify", content=small_png(), headers={"content-type": "image/png"})
    body = assert_problem(response, 500, "internal")
    assert "secret" not in response.text
    assert body["detail"] == "the gateway failed unexpectedly"


def test_unknown_route_and_method_are_problems(client: TestClient) -> None:
    assert_problem(client.get("/nope"), 404, "not-found")
    assert_problem(client.get("/classify"), 405, "method-not-allowed")
