"""The compose stack's load balancer, for real: Debian's HAProxy runs
deploy/haproxy/haproxy.cfg in front of two real gateway processes (each on an address of
its own, as replicas are) and a real Triton. Docker's DNS is played by a DNS stub that
answers the service name with both addresses."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway.dev.tritonserver import TritonServer, free_port

from helpers.balancer import Balanced, balanced_replicas, classified
from helpers.load import LoadResult, run_load
from helpers.support import chelsea_jpeg

pytestmark = pytest.mark.alone  # it times or loads the machine: run with nothing beside it


@pytest.fixture
def balanced(triton: TritonServer, tmp_path: Path) -> Iterator[Balanced]:
    with balanced_replicas(triton, tmp_path) as stack:
        yield stack


def test_the_balancer_spreads_requests_over_every_replica(balanced: Balanced) -> None:
    before = [classified(replica) for replica in balanced.replicas]
    with httpx.Client(base_url=balanced.url, timeout=30) as client:
        statuses = [
            client.post("/classify", json={"text": f"The match ended {i} to nil."}).status_code
            for i in range(40)
        ]
    assert statuses == [200] * 40
    served = [classified(replica) - then for replica, then in zip(balanced.replicas, before, strict=True)]
    assert sum(served) == 40, served  # each answer from exactly one replica
    assert min(served) >= 5, f"one replica got almost nothing: {served}"
    # Triton's metrics are scraped from Triton itself, not merged by each replica
    metrics = httpx.get(f"{balanced.replicas[0].url}/metrics", timeout=5).text
    assert "nv_inference_request_success" not in metrics
    assert "gateway_triton_metrics_up" not in metrics


def send_mixed(client: httpx.AsyncClient) -> object:
    # An image body is larger than HAProxy's buffer, so it cannot be retried elsewhere.
    if time.monotonic_ns() % 2:
        return client.post("/classify", files={"file": ("cat.jpg", chelsea_jpeg(), "image/jpeg")})
    return client.post("/classify", json={"text": "Whisk the eggs and fold in the flour."})


def test_a_replica_leaving_on_sigterm_loses_no_request(balanced: Balanced) -> None:
    leaving, staying = balanced.replicas
    result: list[LoadResult] = []
    load = threading.Thread(target=lambda: result.append(run_load(balanced.url, send_mixed, 4, 12.0)))
    load.start()
    time.sleep(2.0)
    served_before = classified(staying)
    leaving.process.send_signal(signal.SIGTERM)
    code = leaving.process.wait(timeout=40)
    load.join(timeout=60)
    statuses = result[0].statuses()
    print(f"one of two replicas left under load: answers {statuses}")
    assert code in (0, -signal.SIGTERM), code  # uvicorn re-raises the signal it drained on
    log = leaving.log.read_text()
    assert "leaving: /readyz is 503" in log
    assert "draining" in log
    assert statuses == {200: statuses.get(200, 0)}, f"a request failed while a replica left: {statuses}"
    assert classified(staying) > served_before
    assert statuses[200] > 40


def test_grpc_calls_are_balanced_over_every_replicas_door(triton: TritonServer, tmp_path: Path) -> None:
    """tritonclient.grpc through HAProxy's `grpc` frontend (the shipped config; TCP, by
    connection): every call answered, new connections spread over both replicas' doors."""
    import numpy as np
    import tritonclient.grpc as tritongrpc
    from tritonclient.utils import InferenceServerException

    with balanced_replicas(triton, tmp_path, GATEWAY_GRPC__PORT=str(free_port())) as stack:
        client = tritongrpc.InferenceServerClient(stack.grpc)
        text = tritongrpc.InferInput("TEXT", [1, 1], "BYTES")
        text.set_data_from_numpy(np.array([[b"The match ended two to nil."]], dtype=np.object_))
        top_k = tritongrpc.InferInput("TOP_K", [1, 1], "INT32")
        top_k.set_data_from_numpy(np.array([[1]], dtype=np.int32))
        deadline = time.monotonic() + 15
        while True:  # HAProxy's checks (every 2 s) see the doors up
            try:
                if client.is_server_ready():
                    break
            except InferenceServerException:
                pass  # 503 from HAProxy: no door up yet
            assert time.monotonic() < deadline, "the balancer's gRPC backend never came up"
            time.sleep(0.5)
        # calls until both doors have answered some (HAProxy's checks bring the second up
        # within a check round or two); every call answered, the same answer from either
        before = _grpc_calls(stack)
        labels, sent = set(), 0
        while True:
            for _ in range(4):  # a client of its own each time: a connection of its own (gRPC
                # shares one across channels to a target unless told not to)
                fresh = tritongrpc.InferenceServerClient(
                    stack.grpc, channel_args=[("grpc.use_local_subchannel_pool", 1)]
                )
                for _ in range(5):
                    answer = fresh.infer("text_classifier", [text, top_k])
                    labels.add(str(answer.as_numpy("LABELS")[0][0]))
                    sent += 1
                fresh.close()
            counts = [after - then for after, then in zip(_grpc_calls(stack), before, strict=True)]
            if min(counts) >= 1 or time.monotonic() > deadline + 15:
                break
        client.close()
        assert len(labels) == 1
        assert sum(counts) == sent, counts  # each call answered by exactly one replica
        assert min(counts) >= 1, f"one replica's door got nothing: {counts}"


def _grpc_calls(stack: Balanced) -> list[float]:
    """ModelInfer calls each replica's door answered, from its own /metrics."""
    found = []
    for replica in stack.replicas:
        metrics = httpx.get(f"{replica.url}/metrics", timeout=5).text
        found.append(
            sum(
                float(line.split()[-1])
                for line in metrics.splitlines()
                if line.startswith("gateway_requests_total{")
                and 'route="/inference.GRPCInferenceService/ModelInfer"' in line
            )
        )
    return found
