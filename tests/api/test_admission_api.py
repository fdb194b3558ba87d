"""Admission and drain as a client sees them (a fake backend that can be held)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from fastapi.testclient import TestClient

from gateway.app import create_app
from gateway.errors import InvalidInputError
from gateway.settings import ServerSettings, Settings
from gateway.triton.backend import InferResult
from gateway.triton.tensors import Tensor

from helpers.support import FakeBackend, ServedApp, small_png


class HeldBackend(FakeBackend):
    """Image calls wait until released."""

    def __init__(self) -> None:
        super().__init__()
        self.release = asyncio.Event()

    async def infer(
        self,
        model: str,
        version: str,
        inputs: Sequence[Tensor],
        request_id: str,
        outputs: Sequence[str] = (),
        invalid: InvalidInputError | None = None,
        priority: int = 0,
        classes: Mapping[str, int] | None = None,
    ) -> InferResult:
        if any(tensor.name == "IMAGE" for tensor in inputs):
            await self.release.wait()
        return await super().infer(model, version, inputs, request_id, outputs, invalid)


def _post(client: httpx.Client) -> httpx.Response:
    return client.post("/classify", content=small_png(), headers={"content-type": "image/png"})


def test_over_the_cap_is_503_overloaded_with_retry_after() -> None:
    backend = HeldBackend()
    settings = Settings(server=ServerSettings(max_in_flight=2, queue_seconds=0.05))
    served = ServedApp(create_app(settings, backend_factory=lambda *_: backend), settings).start()
    try:
        with httpx.Client(base_url=served.url, timeout=10) as client, ThreadPoolExecutor(2) as pool:
            held = [pool.submit(_post, client) for _ in range(2)]
            time.sleep(0.3)
            refused = _post(client)
            served.call_soon(backend.release.set)
            answers = [future.result() for future in held]
            after = _post(client)
    finally:
        served.stop()
    assert refused.status_code == 503
    assert refused.headers["retry-after"] == "1"
    assert refused.json()["type"].endswith(":overloaded")
    assert [a.status_code for a in answers] == [200, 200]
    assert after.status_code == 200


def test_draining_refuses_new_work_and_readyz_says_so() -> None:
    app = create_app(Settings(), backend_factory=lambda *_: FakeBackend())
    with TestClient(app) as client:
        assert _post(client).status_code == 200  # type: ignore[arg-type]
        app.state.admission.start_draining()
        refused = _post(client)  # type: ignore[arg-type]
        ready = client.get("/readyz")
    assert refused.status_code == 503
    assert refused.json()["type"].endswith(":shutting-down")
    assert refused.headers["connection"] == "close"
    assert ready.status_code == 503
    assert ready.json()["checks"] == {"accepting": False}


def test_leaving_says_not_ready_but_still_serves() -> None:
    """The drain delay: /readyz 503 for the load balancer, requests still answered."""
    app = create_app(Settings(), backend_factory=lambda *_: FakeBackend())
    with TestClient(app) as client:
        app.state.admission.start_leaving()
        ready = client.get("/readyz")
        served = _post(client)  # type: ignore[arg-type]
    assert ready.status_code == 503
    assert ready.json()["checks"] == {"accepting": False}
    assert served.status_code == 200
    assert "connection" not in served.headers


def test_grace_must_outlast_the_triton_deadline() -> None:
    with pytest.raises(ValueError, match="shutdown_grace_seconds"):
        Settings(server=ServerSettings(shutdown_grace_seconds=5))
