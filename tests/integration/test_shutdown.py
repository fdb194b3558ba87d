"""SIGTERM under load: /readyz turns 503 first, requests in flight finish, new ones get
503 problem+json, and nothing is cut off; the access log has a line for every answer."""

from __future__ import annotations

import re
import signal
import threading
import time
from collections.abc import Callable

import httpx
import pytest

from gateway.dev.gatewayprocess import GatewayProcess
from gateway.dev.tritonserver import TritonServer

from helpers.load import LoadResult, run_load
from helpers.support import chelsea_jpeg, coffee_png

pytestmark = pytest.mark.alone  # it times or loads the machine: run with nothing beside it


def send_batch(client: httpx.AsyncClient) -> object:
    files = [("file", (f"{i}.jpg", chelsea_jpeg() if i % 2 else coffee_png())) for i in range(6)]
    return client.post("/classify", files=files)


def test_sigterm_drains_without_losing_a_request(
    triton: TritonServer, spawn_gateway: Callable[..., GatewayProcess]
) -> None:
    # Clients honour Retry-After (3 s) as a load balancer would after /readyz turns 503: a
    # client that keeps opening connections while the listener closes can meet a reset from
    # the kernel's accept queue, with any server.
    # The access log's batches wait up to 10 s: what the log holds at the end was written
    # out when the process stopped, not by the interval.
    gateway = spawn_gateway(triton, GATEWAY_SERVER__RETRY_AFTER_SECONDS="3", GATEWAY_LOG_FLUSH_SECONDS="10")
    result: list[LoadResult] = []
    load = threading.Thread(
        target=lambda: result.append(run_load(gateway.url, send_batch, 6, 8.0, honor_retry_after=True))
    )
    load.start()
    time.sleep(2.0)
    assert httpx.get(f"{gateway.url}/readyz", timeout=5).status_code == 200
    signalled = time.monotonic()
    gateway.process.send_signal(signal.SIGTERM)
    ready_status = None
    while time.monotonic() - signalled < 1.0:
        try:
            ready = httpx.get(f"{gateway.url}/readyz", timeout=2)
        except httpx.TransportError:
            break
        if ready.status_code == 503:
            ready_status = ready
            break
        time.sleep(0.02)
    assert ready_status is not None, "/readyz did not turn 503 during the drain"
    assert ready_status.headers["content-type"] == "application/problem+json"
    assert ready_status.json()["checks"] == {"accepting": False}
    code = gateway.process.wait(timeout=40)
    exited = time.monotonic() - signalled
    load.join(timeout=60)
    answers = result[0]
    statuses = answers.statuses()
    print(f"SIGTERM under load: exited after {exited:.1f} s (code {code}); answers {statuses}")
    assert statuses.get(200, 0) > 0
    assert -1 not in statuses, "a request was cut off"
    assert set(statuses) <= {0, 200, 503}, statuses
    assert all(a.slug == "shutting-down" for a in answers.answers if a.status == 503)
    assert all(a.retry_after == "3" for a in answers.answers if a.status == 503)
    assert all(a.content_type == "application/problem+json" for a in answers.answers if a.status == 503)
    # the access log's batches (gateway.observe.logs) are written before the process exits
    log = gateway.log.read_text()
    for status in (200, 503):
        logged = len(re.findall(rf"gateway\.access: POST /classify {status} ", log))
        assert logged == statuses.get(status, 0), f"{logged} access lines for {statuses} ({status})"
