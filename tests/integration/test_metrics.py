"""/metrics: gateway_* and Triton's nv_* families in one exposition that promtool accepts."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.dev.tritonserver import TritonServer
from gateway.settings import Settings

from helpers.support import chelsea_jpeg, random_bytes
from helpers.triton_fixtures import gateway_settings


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool is not installed: `make test` installs it (apt package prometheus)")
    return found


def families(text: str) -> dict[str, str]:
    return {family.name: family.type for family in text_string_to_metric_families(text)}


def test_metrics_merge_gateway_and_triton(http: httpx.Client) -> None:
    http.post("/classify", files={"file": ("cat.jpg", chelsea_jpeg())})
    http.post("/classify", json={"text": "The striker scored twice in the final."})
    http.post("/classify", content=random_bytes(), headers={"content-type": "image/jpeg"})
    response = http.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    text = response.text
    found = families(text)
    for name in (
        "gateway_requests",
        "gateway_request_duration_seconds",
        "gateway_validation_duration_seconds",
        "gateway_triton_request_duration_seconds",
        "gateway_requests_in_flight",
        "gateway_inputs_per_request",
        "gateway_request_body_bytes",
        "gateway_rejections",
        "gateway_triton_metrics_up",
        "gateway_model_ready",
        "gateway_build_info",
        "gateway_inflight_limit",
        "gateway_inflight_admitted",
        "gateway_admission_queue",
        "gateway_capacity_in_use",
        "gateway_gate_limit",
        "gateway_gate_batch",
        "gateway_gate_request_cost_seconds",
        "gateway_admission_shed",
        "gateway_inflight_by_tier",
        "nv_inference_request_success",
        "nv_inference_queue_duration_us",
        "nv_inference_compute_infer_duration_us",
        "nv_cpu_utilization",
    ):
        assert name in found, name
    assert "gateway_triton_metrics_up 1.0" in text
    assert 'gateway_model_ready{model="image_classifier"} 1.0' in text
    assert 'gateway_rejections_total{reason="unsupported-image-format"}' in text
    assert 'route="/classify"' in text
    assert 'model="text_classifier"' in text
    assert 'nv_inference_request_success{model="image_classifier",version="1"}' in text
    # No family twice (the parser merges by name; count the TYPE lines instead).
    type_lines = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")]
    assert len(type_lines) == len(set(type_lines))


def test_promtool_accepts_the_exposition(http: httpx.Client) -> None:
    http.post("/classify", files={"file": ("cat.jpg", chelsea_jpeg())})
    text = http.get("/metrics").text
    result = subprocess.run([promtool(), "check", "metrics"], input=text, capture_output=True, text=True)
    problems = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    # Triton's own names trip promtool's naming lint (e.g. counters without _total); ours must not.
    ours = [line for line in problems if line.startswith("gateway_")]
    assert ours == [], ours
    assert not any("error" in line.lower() and "parse" in line.lower() for line in problems), problems


def test_unlabelled_paths_stay_bounded(http: httpx.Client) -> None:
    for i in range(5):
        http.get(f"/no/such/path/{i}")
    text = http.get("/metrics").text
    assert "/no/such/path" not in text
    assert 'route="<unmatched>"' in text


def test_metrics_survive_triton_down(
    faults_triton: TritonServer, serve_gateway: Callable[[Settings], httpx.Client]
) -> None:
    client = serve_gateway(gateway_settings(faults_triton))
    assert "nv_inference_count" in client.get("/metrics").text
    faults_triton.stop()
    response = client.get("/metrics")
    assert response.status_code == 200
    assert "gateway_triton_metrics_up 0.0" in response.text
    assert 'gateway_model_ready{model="image_classifier"} 0.0' in response.text
    assert "nv_inference_count" not in response.text
    assert "gateway_requests_total" in response.text
