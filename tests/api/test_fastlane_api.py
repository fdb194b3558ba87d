"""The classify routes' fast lane (gateway/http/fastlane.py) answers exactly as the framework
does: the same requests, sent to an app with the lane and to one without it, get the same
status, headers and body (request ids aside); and the lane really serves the common case."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from gateway.app import create_app
from gateway.http.fastlane import FastLane
from gateway.settings import Settings

from helpers.support import FakeBackend, chelsea_jpeg, small_png

TEXT: dict[str, Any] = {"json": {"text": "The striker scored twice."}}
JPEG: dict[str, Any] = {"content": chelsea_jpeg(), "headers": {"content-type": "image/jpeg"}}
CASES: list[tuple[str, dict[str, Any]]] = [
    ("/classify", TEXT),
    ("/classify", JPEG),
    ("/classify", {"files": [("file", ("a.png", small_png())), ("file", ("b.jpg", chelsea_jpeg()))]}),
    ("/classify", {"json": {"image": base64.b64encode(small_png()).decode()}}),
    ("/classify?top_k=3", TEXT),
    ("/classify?top_k=3&threshold=0.25", JPEG),
    ("/classify?threshold=1", TEXT),
    ("/classify?top_k=0", TEXT),
    ("/classify?top_k=abc", TEXT),
    ("/classify?top_k=99999", TEXT),
    ("/classify?top_k=2&top_k=3", TEXT),
    ("/classify?threshold=0", TEXT),
    ("/classify?threshold=1.5", TEXT),
    ("/classify?threshold=.5", TEXT),
    ("/classify?threshold=nan", TEXT),
    ("/classify?other=1", TEXT),
    ("/classify/", TEXT),
    ("/models/text_classifier/classify", TEXT),
    ("/models/text_classifier/classify?top_k=2", TEXT),
    ("/models/image_classifier/classify", JPEG),
    ("/models/image_classifier/classify", TEXT),
    ("/models/no_such_model/classify", TEXT),
    ("/models/text_classifier/versions/1/classify", TEXT),
    ("/models/text_classifier/versions/x/classify", TEXT),
    ("/models/text_classifier/versions/99/classify", TEXT),
    ("/models//classify", TEXT),
    ("/classify", {"content": b"not an image", "headers": {"content-type": "image/jpeg"}}),
    ("/classify", {"content": b"{", "headers": {"content-type": "application/json"}}),
    ("/classify", {"content": b"x", "headers": {"content-type": "text/plain"}}),
]


def _client(lane: bool) -> Iterator[TestClient]:
    app: FastAPI = create_app(Settings(), backend_factory=lambda *_: FakeBackend())
    if not lane:  # the middleware stack is built on the first request: take the lane out
        app.user_middleware = [m for m in app.user_middleware if getattr(m, "cls", None) is not FastLane]
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


@pytest.fixture(scope="module")
def with_lane() -> Iterator[TestClient]:
    yield from _client(lane=True)


@pytest.fixture(scope="module")
def without_lane() -> Iterator[TestClient]:
    yield from _client(lane=False)


def _comparable(response: Any) -> tuple[int, dict[str, str], Any]:
    headers = {k: v for k, v in response.headers.items() if k not in ("x-request-id", "content-length")}
    body: Any = response.content
    if response.headers.get("content-type", "").endswith("json"):
        body = response.json()
        if isinstance(body, dict):
            body.pop("request_id", None)
    return response.status_code, headers, body


@pytest.mark.parametrize(("url", "request_args"), CASES, ids=[f"{u} {sorted(a)[0]}" for u, a in CASES])
def test_the_lane_answers_as_the_framework_does(
    with_lane: TestClient, without_lane: TestClient, url: str, request_args: dict[str, Any]
) -> None:
    fast = with_lane.post(url, **request_args)
    framework = without_lane.post(url, **request_args)
    assert _comparable(fast) == _comparable(framework)


def test_the_lane_serves_the_common_case_and_leaves_the_rest(
    with_lane: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    served: list[str] = []
    original = FastLane._serve

    async def spy(self: FastLane, scope: Any, *args: Any) -> None:
        served.append(scope["path"])
        await original(self, scope, *args)

    monkeypatch.setattr(FastLane, "_serve", spy)
    assert with_lane.post("/classify?top_k=2", **TEXT).status_code == 200
    assert with_lane.post("/models/text_classifier/versions/1/classify", **TEXT).status_code == 200
    assert with_lane.post("/classify?top_k=0", **TEXT).status_code == 422  # the framework's 422
    assert with_lane.get("/classify").status_code == 405
    assert served == ["/classify", "/models/text_classifier/versions/1/classify"]
    # labelled by the route's template, as the router labels it
    metrics = with_lane.get("/metrics").text
    assert 'route="/models/{model}/versions/{version}/classify"' in metrics
    assert 'route="/classify"' in metrics
