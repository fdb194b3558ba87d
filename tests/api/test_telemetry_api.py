"""Request metrics and the access log, with a fake backend (Triton's metrics unreachable)."""

from __future__ import annotations

import json
import logging

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from gateway.app import create_app
from gateway.errors import TritonUnavailableError
from gateway.settings import Settings, TritonSettings

from helpers.support import FakeBackend, random_bytes, small_png


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def value(text: str, name: str, **labels: str) -> float:
    return samples(text).get((name, tuple(sorted(labels.items()))), 0.0)


def test_request_metrics_count_by_route_status_and_model(client: TestClient) -> None:
    client.post("/classify", content=small_png(), headers={"content-type": "image/png"})
    client.post("/classify", json={"texts": ["a", "b", "c"]})
    client.post("/classify", content=random_bytes(), headers={"content-type": "image/png"})
    client.get("/livez")
    text = client.get("/metrics").text
    route = {"route": "/classify", "method": "POST"}
    assert value(text, "gateway_requests_total", **route, status="200", model="image_classifier") == 1
    assert value(text, "gateway_requests_total", **route, status="200", model="text_classifier") == 1
    assert value(text, "gateway_requests_total", **route, status="415", model="image_classifier") == 1
    assert value(text, "gateway_requests_total", route="/livez", method="GET", status="200", model="") == 1
    assert value(text, "gateway_rejections_total", reason="unsupported-image-format") == 1
    assert value(text, "gateway_inputs_per_request_sum", model="text_classifier") == 3
    assert value(text, "gateway_validation_duration_seconds_count", model="image_classifier") == 1
    assert value(text, "gateway_request_body_bytes_count", route="/classify") == 3
    assert value(text, "gateway_requests_in_flight") == 1  # this very /metrics request
    assert value(text, "gateway_triton_metrics_up") == 0  # no Triton behind the fake
    assert value(text, "gateway_model_ready", model="image_classifier") == 1
    build = value(
        text,
        "gateway_build_info",
        version="0.1.0",
        triton_url_kind="loopback",
        image_model="image_classifier",
        text_model="text_classifier",
    )
    assert build == 1


def test_upstream_errors_are_not_rejections(client: TestClient, backend: FakeBackend) -> None:
    backend.fail_with = TritonUnavailableError("down")
    client.post("/classify", content=small_png(), headers={"content-type": "image/png"})
    text = client.get("/metrics").text
    assert "gateway_rejections_total{" not in text
    labels = {"route": "/classify", "method": "POST", "status": "503", "model": "image_classifier"}
    assert value(text, "gateway_requests_total", **labels) == 1


def test_each_app_has_its_own_registry(backend: FakeBackend) -> None:
    settings = Settings(triton=TritonSettings(metrics_url=""))
    with (
        TestClient(create_app(settings, lambda *_: backend)) as one,
        TestClient(create_app(settings, lambda *_: backend)) as two,
    ):
        one.get("/livez")
        assert (
            value(
                two.get("/metrics").text,
                "gateway_requests_total",
                route="/livez",
                method="GET",
                status="200",
                model="",
            )
            == 0
        )


def test_one_access_log_line_per_request(client: TestClient, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="gateway.access"):
        client.post("/classify", json={"text": "hello"}, headers={"x-request-id": "log-test-1"})
    lines = [r for r in caplog.records if r.name == "gateway.access"]
    assert len(lines) == 1
    record = lines[0]
    assert record.request_id == "log-test-1"  # type: ignore[attr-defined]
    assert record.route == "/classify"  # type: ignore[attr-defined]
    assert record.status == 200  # type: ignore[attr-defined]
    assert record.model == "text_classifier"  # type: ignore[attr-defined]
    assert record.duration_ms > 0  # type: ignore[attr-defined]


def test_json_log_format(capsys: pytest.CaptureFixture[str]) -> None:
    from gateway.observe.logs import configure_logging

    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    try:
        configure_logging("info", "json")
        logging.getLogger("gateway.access").info(
            "POST /classify 200", extra={"request_id": "abc", "route": "/classify", "status": 200}
        )
        line = capsys.readouterr().err.strip().splitlines()[-1]
    finally:
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)
    entry = json.loads(line)
    assert entry["message"] == "POST /classify 200"
    assert entry["level"] == "INFO"
    assert entry["logger"] == "gateway.access"
    assert entry["request_id"] == "abc"
    assert entry["status"] == 200
