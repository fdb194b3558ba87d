"""Faults a healthy Triton does not produce: a failing model (502), a missing one (503), an 8 MiB
answer, and Triton stopped (503)."""

from __future__ import annotations

from collections.abc import Callable

import httpx

from gateway.dev.tritonserver import TritonServer
from gateway.settings import Settings, TritonSettings

from helpers.support import coffee_png


def test_failing_model_is_502_and_other_models_still_answer(
    faulty_triton: TritonServer, serve_gateway: Callable[[Settings], httpx.Client]
) -> None:
    url = faulty_triton.grpc_url
    faulty = serve_gateway(Settings(triton=TritonSettings(url=url), image_model="faulty_classifier"))
    response = faulty.post("/classify", content=coffee_png(), headers={"content-type": "image/png"})
    assert response.status_code == 502, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert "always fails" not in response.text
    healthy = serve_gateway(Settings(triton=TritonSettings(url=url)))
    answer = healthy.post("/classify", content=coffee_png(), headers={"content-type": "image/png"})
    assert answer.json()["results"][0]["predictions"][0]["label"] == "espresso"


def test_unknown_model_is_503_and_not_ready(
    faulty_triton: TritonServer, serve_gateway: Callable[[Settings], httpx.Client]
) -> None:
    client = serve_gateway(Settings(triton=TritonSettings(url=faulty_triton.grpc_url), image_model="missing"))
    response = client.post("/classify", content=coffee_png(), headers={"content-type": "image/png"})
    assert response.status_code == 503
    assert response.headers["retry-after"] == "5"
    assert client.get("/readyz").status_code == 503


def test_triton_stopped(
    faults_triton: TritonServer, serve_gateway: Callable[[Settings], httpx.Client]
) -> None:
    client = serve_gateway(Settings(triton=TritonSettings(url=faults_triton.grpc_url)))
    assert (
        client.post("/classify", content=coffee_png(), headers={"content-type": "image/png"}).status_code
        == 200
    )
    assert client.get("/readyz").status_code == 200

    faults_triton.stop()

    response = client.post("/classify", content=coffee_png(), headers={"content-type": "image/png"})
    assert response.status_code == 503, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["type"].endswith(":triton-unavailable")
    assert response.headers["retry-after"] == "5"
    ready = client.get("/readyz")
    assert ready.status_code == 503
    assert ready.json()["checks"]["triton_live"] is False
    assert client.get("/livez").status_code == 200
    models = client.get("/models").json()
    assert models["triton"]["live"] is False
    assert models["models"][0]["ready"] is False


def test_a_large_answer_through_v2_is_not_refused(
    faulty_triton: TritonServer, serve_gateway: Callable[[Settings], httpx.Client]
) -> None:
    """/v2 serves any allowed model: an 8 MiB answer passed gRPC's receive cap of 4 MiB
    (it came back as a 503 before the cap followed GATEWAY_TRITON__MAX_RECEIVE_BYTES)."""
    client = serve_gateway(
        Settings(triton=TritonSettings(url=faulty_triton.grpc_url), v2_models=["big_output"])
    )
    query = {"name": "QUERY", "shape": [1], "datatype": "INT32", "data": [0]}
    request = {"inputs": [query], "parameters": {"binary_data_output": True}}
    response = client.post("/v2/models/big_output/infer", json=request)
    assert response.status_code == 200, response.text[:500]
    header = int(response.headers["inference-header-content-length"])
    assert len(response.content) - header == 8 * 1024 * 1024
