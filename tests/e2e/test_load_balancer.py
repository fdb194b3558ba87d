"""The compose stack's load balancer, for real: Debian's HAProxy runs
deploy/haproxy/haproxy.cfg in front of two real gateway processes (each on an address of
its own, as replicas are) and a real Triton. Docker's DNS is played by a DNS stub that
answers the service name with both addresses."""

from __future__ import annotations

import contextlib
import queue
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from tritonclient.utils import InferenceServerException

from gateway.dev.tritonserver import TritonServer, free_port

from helpers.balancer import Balanced, balanced_replicas, classified
from helpers.h2flood import header_flood, rapid_reset
from helpers.load import LoadResult, run_load
from helpers.procfs import rss_mib
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


def _text_call() -> list[object]:
    import numpy as np
    import tritonclient.grpc as tritongrpc

    text = tritongrpc.InferInput("TEXT", [1, 1], "BYTES")
    text.set_data_from_numpy(np.array([[b"The match ended two to nil."]], dtype=np.object_))
    top_k = tritongrpc.InferInput("TOP_K", [1, 1], "INT32")
    top_k.set_data_from_numpy(np.array([[1]], dtype=np.int32))
    return [text, top_k]


def _grpc_up(stack: Balanced) -> None:
    """Until HAProxy's checks (every 2 s) see both doors up: a call answered by each."""
    import tritonclient.grpc as tritongrpc

    client = tritongrpc.InferenceServerClient(stack.grpc)
    deadline = time.monotonic() + 30
    before = _grpc_calls(stack)
    try:
        while True:
            with contextlib.suppress(InferenceServerException):  # 503 from HAProxy: no door up yet
                client.infer("text_classifier", _text_call())
            counts = [after - then for after, then in zip(_grpc_calls(stack), before, strict=True)]
            if min(counts) >= 1:
                return
            assert time.monotonic() < deadline, (
                f"the balancer's gRPC backend never had both doors up: {counts}"
            )
            time.sleep(0.2)
    finally:
        client.close()


@pytest.fixture
def grpc_balanced(triton: TritonServer, tmp_path: Path) -> Iterator[Balanced]:
    with balanced_replicas(triton, tmp_path, GATEWAY_GRPC__PORT=str(free_port())) as stack:
        _grpc_up(stack)
        yield stack


def test_grpc_calls_are_balanced_call_by_call_over_every_replicas_door(grpc_balanced: Balanced) -> None:
    """tritonclient.grpc through HAProxy's `grpc` frontend (the shipped config: HTTP/2,
    by call): the calls of one client, on its one connection, spread over both replicas'
    doors, every one answered once. (In TCP mode, by connection, they all went to one.)"""
    import tritonclient.grpc as tritongrpc

    client = tritongrpc.InferenceServerClient(grpc_balanced.grpc)
    before = _grpc_calls(grpc_balanced)
    labels = {str(client.infer("text_classifier", _text_call()).as_numpy("LABELS")[0][0]) for _ in range(20)}
    # a stream (ModelStreamInfer) passes HAProxy's HTTP/2 both ways too
    streamed: queue.Queue[object] = queue.Queue()
    client.start_stream(callback=lambda result, error: streamed.put(error or result))
    for _ in range(3):
        client.async_stream_infer("text_classifier", _text_call())
    answers = [streamed.get(timeout=30) for _ in range(3)]
    client.stop_stream()
    client.close()
    assert all(isinstance(answer, tritongrpc.InferResult) for answer in answers), answers
    labels |= {str(answer.as_numpy("LABELS")[0][0]) for answer in answers}  # type: ignore[attr-defined]
    counts = [after - then for after, then in zip(_grpc_calls(grpc_balanced), before, strict=True)]
    assert len(labels) == 1
    assert sum(counts) == 20, counts  # each call answered by exactly one replica (streams count apart)
    assert min(counts) >= 5, f"one connection's calls did not spread: {counts}"


FLOOD_CONNECTIONS = 32
FLOOD_VALUE = 12 * 1000 * 1000  # under gRPC's ~16 MiB, above which it refuses the value unread


def test_a_header_flood_at_the_grpc_frontend_never_reaches_a_replica(grpc_balanced: Balanced) -> None:
    """32 anonymous connections, each opening a call whose header value grows by CONTINUATION
    frames to 12 MB and never ends: HAProxy refuses each at its buffer, the replicas' RSS
    stays flat, and a call is answered beside the held sockets. With the TCP frontend the
    flood reached the doors (gRPC keeps such a value whole while it arrives): each replica
    took +220 and +208 MiB (384 MB of header values got
    out) and kept it while the sockets were held."""
    import tritonclient.grpc as tritongrpc

    pids = [replica.process.pid for replica in grpc_balanced.replicas]
    before = [rss_mib(pid) for pid in pids]
    with header_flood(grpc_balanced.grpc, FLOOD_CONNECTIONS, FLOOD_VALUE) as flood:
        time.sleep(1.0)  # what arrived is parsed
        rises = [rss_mib(pid) - then for pid, then in zip(pids, before, strict=True)]
        client = tritongrpc.InferenceServerClient(grpc_balanced.grpc)
        answered = client.infer("text_classifier", _text_call())
        client.close()
    print(
        f"{FLOOD_CONNECTIONS} x {FLOOD_VALUE / 1e6:.0f} MB header values at the balancer: "
        f"{sum(flood.sent) / 1e6:.0f} MB got out, replicas' RSS {', '.join(f'{r:+.0f}' for r in rises)} MiB"
    )
    assert answered.as_numpy("LABELS") is not None
    assert max(rises) < 64, f"the flood reached a replica: RSS {rises} MiB"
    assert sum(flood.sent) < FLOOD_CONNECTIONS * FLOOD_VALUE, "no connection was refused part way"


RESET_CONNECTIONS = 4
RESET_SECONDS = 8.0


@pytest.mark.quarantine
@pytest.mark.xfail(
    strict=False,
    reason="Triton's Python backend aborted under it in two clean-clone runs in a row on 2026-12-02 "
    "(SIGSEGV, then SIGABRT, in TRITONBACKEND_ModelInstanceExecute with "
    "boost::interprocess::lock_exception: triton-inference-server/server#8882, open), so the calls "
    "beside the flood met an absent Triton; it passed in every run before. Quarantined until the "
    "crash is understood: make test-quarantine runs it (XPASS when it holds)",
)
def test_a_rapid_reset_at_the_grpc_frontend_leaves_other_callers_served(grpc_balanced: Balanced) -> None:
    """HTTP/2's rapid reset (CVE-2023-44487) from 4 anonymous connections at the balancer,
    a call made beside it every second: each is answered, and the replicas' RSS stays
    within bounds. HAProxy forwards each call before its reset, and with backend connections
    shared between clients (HAProxy's default ``http-reuse safe``) the flood's calls took
    the stream slots of the connection a client's call was sent on: that call was refused
    (REFUSED_STREAM): 9 of 11 in 12 s, 4 of 8 in 8 s. ``http-reuse never`` keeps each client's calls on
    connections of its own."""
    import tritonclient.grpc as tritongrpc

    pids = [replica.process.pid for replica in grpc_balanced.replicas]
    before = [rss_mib(pid) for pid in pids]
    failures: list[str] = []
    answered = 0
    with contextlib.ExitStack() as floods:
        resets = [floods.enter_context(rapid_reset(grpc_balanced.grpc)) for _ in range(RESET_CONNECTIONS)]
        started = time.monotonic()
        while time.monotonic() - started < RESET_SECONDS:
            time.sleep(1.0)
            client = tritongrpc.InferenceServerClient(grpc_balanced.grpc)
            try:
                client.infer("text_classifier", _text_call(), client_timeout=5)
                answered += 1
            except InferenceServerException as error:
                failures.append(str(error)[:120])
            finally:
                client.close()
        rises = [rss_mib(pid) - then for pid, then in zip(pids, before, strict=True)]
        streams = sum(reset.streams for reset in resets)
    print(
        f"rapid reset at the balancer: {streams} streams from {RESET_CONNECTIONS} connections in "
        f"{RESET_SECONDS:.0f} s, {answered} calls beside it answered, {len(failures)} refused, "
        f"replicas' RSS {', '.join(f'{r:+.0f}' for r in rises)} MiB"
    )
    assert streams > 200_000, "the flood did not get going"
    assert failures == [], failures
    assert max(rises) < 128, f"replicas' RSS {rises} MiB"


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
