"""Faults a healthy Triton does not produce: a failing model (502) and Triton stopped (503)."""

from __future__ import annotations

from collections.abc import Callable

import httpx
from support import coffee_png

from gateway.settings import Settings, TritonSettings
from gateway.tritonserver import TritonServer


def test_failing_model_is_502_and_other_models_still_answer(
    faults_triton: TritonServer, serve_gateway: Callable[[Settings], httpx.Client]
) -> None:
    url = faults_triton.grpc_url
    faulty = serve_gateway(Settings(triton=TritonSettings(url=url), image_model="faulty_classifier"))
    response = faulty.post("/classify", content=coffee_png(), headers={"content-type": "image/png"})
    assert response.status_code == 502, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert "always fails" not in response.text
    healthy = serve_gateway(Settings(triton=TritonSettings(url=url)))
    answer = healthy.post("/classify", content=coffee_png(), headers={"content-type": "image/png"})
    assert answer.json()["results"][0]["predictions"][0]["label"] == "espresso"


def test_unknown_model_is_503_and_not_ready(
    faults_triton: TritonServer, serve_gateway: Callable[[Settings], httpx.Client]
) -> None:
    client = serve_gateway(Settings(triton=TritonSettings(url=faults_triton.grpc_url), image_model="missing"))
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
