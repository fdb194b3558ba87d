"""The gateway in front of a real tritonserver running the image ensemble on CPU."""

from __future__ import annotations

import base64
import concurrent.futures
from collections.abc import Callable
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image

from gateway.dev.tritonserver import TritonServer
from gateway.settings import ImageLimits, Settings, TritonSettings

from helpers.support import (
    EPS_BYTES,
    SVG_BYTES,
    chelsea_jpeg,
    coffee_png,
    coffee_webp,
    encode,
    png_header_only,
    random_bytes,
    tiff_bytes,
    truncated_jpeg,
)

CATS = {"tiger cat", "tabby", "Egyptian cat"}


def top_label(result: dict) -> str:  # type: ignore[type-arg]
    return str(result["predictions"][0]["label"])


def assert_problem(response: httpx.Response, status: int, slug: str) -> dict:  # type: ignore[type-arg]
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body = response.json()
    assert body["type"].endswith(":" + slug)
    assert body["status"] == status
    assert body["request_id"] == response.headers["x-request-id"]
    return body  # type: ignore[no-any-return]


def test_chelsea_is_a_cat(http: httpx.Client) -> None:
    response = http.post("/classify", files={"file": ("chelsea.jpg", chelsea_jpeg(), "image/jpeg")})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["model"] == "image_classifier"
    assert body["model_version"] == "1"
    predictions = body["results"][0]["predictions"]
    assert predictions[0]["label"] in CATS
    assert len(predictions) == 5
    scores = [p["score"] for p in predictions]
    assert scores == sorted(scores, reverse=True)
    assert all(0.0 <= s <= 1.0 for s in scores)


def test_coffee_is_espresso(http: httpx.Client) -> None:
    response = http.post("/classify", content=coffee_png(), headers={"content-type": "image/png"})
    prediction = response.json()["results"][0]["predictions"][0]
    assert prediction == {"label": "espresso", "score": pytest.approx(0.95, abs=0.03), "class_id": 967}


def test_every_input_form_gives_the_same_answer(http: httpx.Client) -> None:
    data = chelsea_jpeg()
    encoded = base64.b64encode(data).decode()
    answers = [
        http.post("/classify?top_k=3", files={"file": ("a.jpg", data)}),
        http.post("/classify?top_k=3", content=data, headers={"content-type": "image/jpeg"}),
        http.post("/classify?top_k=3", content=data, headers={"content-type": "application/octet-stream"}),
        http.post("/classify", json={"image": encoded, "top_k": 3}),
        http.post("/classify", json={"image": "data:image/jpeg;base64," + encoded, "top_k": 3}),
        http.post("/classify", json={"images": [encoded], "top_k": 3}),
    ]
    labels = []
    for response in answers:
        assert response.status_code == 200, response.text
        labels.append([p["label"] for p in response.json()["results"][0]["predictions"]])
    assert all(found == labels[0] for found in labels)
    assert len(labels[0]) == 3
    assert labels[0][0] in CATS


def test_webp_is_accepted(http: httpx.Client) -> None:
    response = http.post("/classify", content=coffee_webp(), headers={"content-type": "image/webp"})
    assert top_label(response.json()["results"][0]) == "espresso"


def test_batch_keeps_input_order(http: httpx.Client) -> None:
    order = [coffee_png(), chelsea_jpeg(), coffee_webp(), chelsea_jpeg(), coffee_png()]
    files = [("file", (f"{i}", data)) for i, data in enumerate(order)]
    response = http.post("/classify", files=files)
    assert response.status_code == 200, response.text
    tops = [top_label(r) for r in response.json()["results"]]
    assert tops[0] == tops[2] == tops[4] == "espresso"
    assert tops[1] in CATS
    assert tops[3] in CATS
    encoded = [base64.b64encode(d).decode() for d in reversed(order)]
    reversed_tops = [top_label(r) for r in http.post("/classify", json={"images": encoded}).json()["results"]]
    assert reversed_tops == list(reversed(tops))


def test_large_photo_is_classified(http: httpx.Client) -> None:
    # 4000x2660: decoded by Triton in JPEG draft mode, never at full size.
    big = Image.open(__import__("io").BytesIO(chelsea_jpeg())).resize((4000, 2660))
    data = encode(np.asarray(big), "JPEG", quality=85)
    response = http.post("/classify", content=data, headers={"content-type": "image/jpeg"})
    assert top_label(response.json()["results"][0]) in CATS


def test_request_id_round_trip(http: httpx.Client) -> None:
    response = http.post(
        "/classify", content=coffee_png(), headers={"content-type": "image/png", "x-request-id": "it-123"}
    )
    assert response.headers["x-request-id"] == "it-123"
    assert response.json()["request_id"] == "it-123"


@pytest.mark.parametrize(
    ("name", "request_kwargs", "status", "slug"),
    [
        ("zero bytes", {"content": b"", "headers": {"content-type": "image/jpeg"}}, 422, "invalid-input"),
        (
            "random bytes",
            {"content": random_bytes(), "headers": {"content-type": "image/jpeg"}},
            415,
            "unsupported-image-format",
        ),
        (
            "truncated jpeg",
            {"content": truncated_jpeg(), "headers": {"content-type": "image/jpeg"}},
            422,
            "invalid-image",
        ),
        (
            "50000x50000 png",
            {"content": png_header_only(50_000, 50_000), "headers": {"content-type": "image/png"}},
            413,
            "image-too-large",
        ),
        (
            "eps",
            {"files": {"file": ("x.eps", EPS_BYTES, "application/postscript")}},
            415,
            "unsupported-image-format",
        ),
        (
            "tiff",
            {"files": {"file": ("x.tiff", tiff_bytes(), "image/tiff")}},
            415,
            "unsupported-image-format",
        ),
        (
            "svg",
            {"content": SVG_BYTES, "headers": {"content-type": "image/png"}},
            415,
            "unsupported-image-format",
        ),
        (
            "wrong content type",
            {"content": chelsea_jpeg(), "headers": {"content-type": "text/plain"}},
            415,
            "unsupported-media-type",
        ),
        ("invalid base64", {"json": {"image": "this is not base64!"}}, 400, "malformed-request"),
        (
            "NaN in json",
            {"content": b'{"image": "AAAA", "top_k": NaN}', "headers": {"content-type": "application/json"}},
            422,
            "invalid-input",
        ),
        (
            "malformed json",
            {"content": b'{"image": "AAA', "headers": {"content-type": "application/json"}},
            400,
            "malformed-request",
        ),
        ("bad top_k", {"json": {"image": "AAAA", "top_k": 99}}, 422, "invalid-input"),
        ("wrong type", {"json": {"image": 42}}, 422, "invalid-input"),
    ],
)
def test_bad_input_is_a_4xx_problem_and_the_next_request_succeeds(
    http: httpx.Client,
    name: str,
    request_kwargs: dict[str, Any],
    status: int,
    slug: str,
) -> None:
    assert_problem(http.post("/classify", **request_kwargs), status, slug)
    after = http.post("/classify", content=coffee_png(), headers={"content-type": "image/png"})
    assert after.status_code == 200
    assert top_label(after.json()["results"][0]) == "espresso"


def test_truncated_image_in_a_batch_is_named(http: httpx.Client) -> None:
    files = [
        ("file", ("a", coffee_png())),
        ("file", ("b", truncated_jpeg())),
        ("file", ("c", chelsea_jpeg())),
    ]
    body = assert_problem(http.post("/classify", files=files), 422, "invalid-image")
    assert body["input_index"] == 1
    assert [e["input_index"] for e in body["errors"]] == [1]
    assert "truncated (" not in body["detail"]  # Triton's own message is not passed on


def test_concurrent_failures_never_mix_up_results(http: httpx.Client) -> None:
    inputs = [coffee_png(), truncated_jpeg(), chelsea_jpeg(), random_bytes(), coffee_webp()] * 4

    def send(data: bytes) -> httpx.Response:
        return http.post("/classify", content=data, headers={"content-type": "image/jpeg"})

    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        responses = list(pool.map(send, inputs))
    for data, response in zip(inputs, responses, strict=True):
        if data == truncated_jpeg():
            assert response.status_code == 422
        elif data == random_bytes():
            assert response.status_code == 415
        elif data == chelsea_jpeg():
            assert top_label(response.json()["results"][0]) in CATS
        else:
            assert top_label(response.json()["results"][0]) == "espresso"


def test_count_cap_is_413(serve_gateway: Callable[[Settings], httpx.Client], triton: TritonServer) -> None:
    client = serve_gateway(
        Settings(triton=TritonSettings(url=triton.grpc_url), image=ImageLimits(max_images=2))
    )
    files = [("file", (str(i), coffee_png())) for i in range(3)]
    assert_problem(client.post("/classify", files=files), 413, "payload-too-large")


def test_body_cap_is_413(serve_gateway: Callable[[Settings], httpx.Client], triton: TritonServer) -> None:
    limits = ImageLimits(max_bytes=100_000)
    client = serve_gateway(
        Settings(triton=TritonSettings(url=triton.grpc_url), max_body_bytes=150_000, image=limits)
    )
    assert_problem(
        client.post("/classify", content=coffee_png(), headers={"content-type": "image/png"}),
        413,
        "payload-too-large",
    )


def test_deadline_exceeded_is_504(
    serve_gateway: Callable[[Settings], httpx.Client], triton: TritonServer
) -> None:
    client = serve_gateway(Settings(triton=TritonSettings(url=triton.grpc_url, timeout_seconds=0.0005)))
    assert_problem(
        client.post("/classify", content=chelsea_jpeg(), headers={"content-type": "image/jpeg"}),
        504,
        "triton-timeout",
    )


def test_health_and_models(http: httpx.Client) -> None:
    assert http.get("/livez").status_code == 200
    ready = http.get("/readyz")
    assert ready.status_code == 200
    checks = ready.json()["checks"]
    assert checks["triton_live"] is True
    assert checks["model:image_classifier"] is True
    assert not any(step in str(checks) for step in ("image_preprocess", "image_model", "image_postprocess"))
    model = next(m for m in http.get("/models").json()["models"] if m["name"] == "image_classifier")
    assert model["ready"] is True
    assert model["versions"] == ["1"]
    assert "composing_models" not in model  # ensemble steps: /admin/served only
