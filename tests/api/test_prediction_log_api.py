"""The sampled prediction log, against a real HTTP receiver (CloudEvents, parsed by the
cloudevents package) and a real file: the format KServe's logger consumers read, inputs
only as digests, failures at their own rate, and never in a request's way: a slow sink, a
dead one and one that comes back (the transport faked, which Triton does not need to be
here: the log sits after the answer)."""

from __future__ import annotations

import base64
import hashlib
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from cloudevents.core.bindings import http as ce_http

from gateway.app import create_app
from gateway.dev.tritonserver import free_port
from gateway.settings import Settings
from gateway.shared.keyfiles import hash_key

from helpers.support import FakeBackend, ServedApp, encode

pytestmark = pytest.mark.alone  # it times or loads the machine: run with nothing beside it

TEXT = "The striker scored twice in the final."


class Receiver:
    """A CloudEvents receiver on a loopback port; ``delay`` seconds per event."""

    def __init__(self, port: int = 0, delay: float = 0.0) -> None:
        self.port = port or free_port()
        self.delay = delay
        self.events: list[tuple[dict[str, str], bytes]] = []
        self._server: ThreadingHTTPServer | None = None

    def __enter__(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                time.sleep(receiver.delay)
                receiver.events.append(({k.lower(): v for k, v in self.headers.items()}, body))
                self.send_response(202)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.shutdown()
        self._server.server_close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"

    def wait(self, count: int, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.events) < count:
            assert time.monotonic() < deadline, f"{len(self.events)} events of {count}"
            time.sleep(0.05)


def served(settings: Settings | None = None, **log: object) -> ServedApp:
    settings = settings or Settings(prediction_log=log)
    return ServedApp(create_app(settings, backend_factory=lambda *_: FakeBackend()), settings).start()


def records(path: Path, count: int, timeout: float = 10.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        found = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
        if len(found) >= count:
            return found
        assert time.monotonic() < deadline, f"{len(found)} records of {count}"
        time.sleep(0.05)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as running:
        yield running


def dropped(gateway: ServedApp, reason: str) -> float:
    for line in httpx.get(f"{gateway.url}/metrics", timeout=10).text.splitlines():
        if line.startswith(f'gateway_prediction_log_dropped_total{{reason="{reason}"}}'):
            return float(line.split()[-1])
    return 0.0


def test_a_sampled_answer_is_a_kserve_request_and_response_event(receiver: Receiver) -> None:
    gateway = served(url=receiver.url, sample_rate=1.0)
    try:
        answer = httpx.post(f"{gateway.url}/classify", json={"texts": [TEXT, "Rain again."]}, timeout=10)
        assert answer.status_code == 200
        receiver.wait(2)
    finally:
        gateway.stop()
    events = [
        ce_http.from_binary_event(ce_http.HTTPMessage(headers, body)) for headers, body in receiver.events
    ]
    request, response = sorted(events, key=lambda e: e.get_type())
    assert request.get_type() == "org.kubeflow.serving.inference.request"
    assert response.get_type() == "org.kubeflow.serving.inference.response"
    assert request.get_id() == response.get_id() == answer.headers["x-request-id"]
    assert request.get_extension("inferenceservicename") == "text_classifier"
    request_data: dict[str, Any] = request.get_data()  # type: ignore[assignment]
    digests = request_data["inputs"]
    assert digests[0] == {
        "sha256": hashlib.sha256(TEXT.encode()).hexdigest(),
        "size": len(TEXT.encode()),
        "data": None,  # never the input itself unless the operator opts in
    }
    data: dict[str, Any] = response.get_data()  # type: ignore[assignment]
    assert data["status"] == 200
    assert [row[0]["label"] for row in data["predictions"]] == [
        result["predictions"][0]["label"] for result in answer.json()["results"]
    ]
    # the request event holds digests, never the input itself (the fake model echoes it as a label)
    requests = [body for headers, body in receiver.events if headers["ce-type"].endswith("request")]
    assert requests
    assert all(TEXT not in body.decode() for body in requests)


def test_failures_are_logged_at_their_own_rate(receiver: Receiver) -> None:
    gateway = served(url=receiver.url, sample_rate=0.0, failure_sample_rate=1.0)
    try:
        ok = httpx.post(f"{gateway.url}/classify", json={"text": TEXT}, timeout=10)
        bad = httpx.post(
            f"{gateway.url}/classify",
            content=b"\xff\xd8\xffnot a jpeg",
            headers={"content-type": "image/jpeg"},
        )
        assert (ok.status_code, bad.status_code) == (200, 422)
        receiver.wait(2)
        time.sleep(0.3)
    finally:
        gateway.stop()
    ids = {headers["ce-id"] for headers, _ in receiver.events}
    assert ids == {bad.headers["x-request-id"]}
    response = next(
        json.loads(body) for headers, body in receiver.events if headers["ce-type"].endswith("response")
    )
    assert response["status"] == 422
    assert response["error"] == "invalid-input"


def test_a_slow_sink_drops_records_and_never_slows_an_answer() -> None:
    with Receiver(delay=1.0) as slow:
        gateway = served(url=slow.url, sample_rate=1.0, max_queued=2)
        try:
            with httpx.Client(base_url=gateway.url, timeout=10) as client:
                timings = []
                for _ in range(20):
                    started = time.monotonic()
                    assert client.post("/classify", json={"text": TEXT}).status_code == 200
                    timings.append(time.monotonic() - started)
            print(f"20 answers with a sink taking 1 s an event: slowest {max(timings) * 1000:.0f} ms")
            assert max(timings) < 0.5
            assert dropped(gateway, "queue_full") >= 10
        finally:
            gateway.stop()


def test_a_dead_sink_drops_and_a_sink_that_comes_back_receives() -> None:
    port = free_port()
    gateway = served(url=f"http://127.0.0.1:{port}/", sample_rate=1.0, timeout_seconds=0.5)
    try:
        with httpx.Client(base_url=gateway.url, timeout=10) as client:
            assert client.post("/classify", json={"text": TEXT}).status_code == 200
            deadline = time.monotonic() + 10
            while dropped(gateway, "sink_error") < 1:
                assert time.monotonic() < deadline, "the dead sink's record was not counted"
                time.sleep(0.1)
            with Receiver(port=port) as back:
                assert client.post("/classify", json={"text": TEXT}).status_code == 200
                back.wait(2)
    finally:
        gateway.stop()


def test_a_file_sink_writes_json_lines_and_rotates(tmp_path: Path) -> None:
    target = tmp_path / "predictions.jsonl"
    gateway = served(url=f"file://{target}", sample_rate=1.0, max_file_bytes=2048)
    try:
        with httpx.Client(base_url=gateway.url, timeout=10) as client:
            for _ in range(12):
                assert client.post("/classify", json={"text": TEXT}).status_code == 200
        deadline = time.monotonic() + 10
        while not target.with_name("predictions.jsonl.1").exists():
            assert time.monotonic() < deadline, "never rotated"
            time.sleep(0.05)
    finally:
        gateway.stop()
    records = [json.loads(line) for line in target.read_text().splitlines()]
    assert records
    assert {record["model"] for record in records} == {"text_classifier"}
    assert all(record["status"] == 200 and record["predictions"] for record in records)


def test_each_key_has_its_rate_and_a_header_cannot_claim_one(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text(f"new-app {hash_key('new-secret')}\nbatch {hash_key('batch-secret')}\n")
    target = tmp_path / "log.jsonl"
    settings = Settings(
        auth={"keys_file": keys},
        prediction_log={"url": f"file://{target}", "sample_rate": 0.0, "key_sample_rates": {"new-app": 1.0}},
    )
    gateway = served(settings)
    try:
        with httpx.Client(base_url=gateway.url, timeout=10) as client:
            for _ in range(3):
                mine = client.post("/classify", json={"text": TEXT}, headers={"X-API-Key": "new-secret"})
                assert mine.status_code == 200
                # the batch key sends the rollout header naming the sampled key: still its own rate (0)
                other = client.post(
                    "/classify",
                    json={"text": TEXT},
                    headers={"X-API-Key": "batch-secret", "X-Rollout-Key": "new-app"},
                )
                assert other.status_code == 200
        found = records(target, 3)
        time.sleep(0.3)
    finally:
        gateway.stop()
    found = [json.loads(line) for line in target.read_text().splitlines()]
    assert len(found) == 3
    assert {record["client"] for record in found} == {"new-app"}


def _traceparent(low: int) -> str:
    return f"00-{0xABCDEF:016x}{low:016x}-{0x1234:016x}-01"


def test_the_trace_id_decides_as_the_trace_sampler_does(tmp_path: Path) -> None:
    """A rate of 0.5: a trace id whose low 64 bits are under half of 2^64 is logged, one
    over it is not (OpenTelemetry's TraceIdRatioBased cut), and the record names its trace."""
    target = tmp_path / "log.jsonl"
    settings = Settings(
        tracing={
            "enabled": True,
            "trust_inbound": True,
            "endpoint": f"http://127.0.0.1:{free_port()}/v1/traces",
        },
        prediction_log={"url": f"file://{target}", "sample_rate": 0.5, "failure_sample_rate": 0.0},
    )
    gateway = served(settings)
    try:
        with httpx.Client(base_url=gateway.url, timeout=10) as client:
            for low in (2**62, 2**63 + 2**62, 2**61, 2**64 - 1):
                sent = client.post(
                    "/classify", json={"text": TEXT}, headers={"traceparent": _traceparent(low)}
                )
                assert sent.status_code == 200
        found = records(target, 2)
        time.sleep(0.3)
    finally:
        gateway.stop()
    found = [json.loads(line) for line in target.read_text().splitlines()]
    assert sorted(record["trace_id"][16:] for record in found) == sorted(
        f"{low:016x}" for low in (2**62, 2**61)
    )


def test_inputs_are_captured_only_when_asked_and_only_up_to_the_cap(tmp_path: Path) -> None:
    target = tmp_path / "log.jsonl"
    gateway = served(url=f"file://{target}", sample_rate=1.0, capture_inputs=True, max_captured_bytes=100)
    long_text = "word " * 40  # 200 bytes: over the cap, its digest only
    small_png = encode(np.full((2, 2, 3), 9, dtype=np.uint8), "PNG")  # 79 bytes: kept
    assert len(small_png) <= 100
    try:
        with httpx.Client(base_url=gateway.url, timeout=10) as client:
            assert client.post("/classify", json={"texts": [TEXT, long_text]}).status_code == 200
            image = client.post("/classify", content=small_png, headers={"content-type": "image/png"})
            assert image.status_code == 200, image.text
        found = records(target, 2)
    finally:
        gateway.stop()
    texts = next(record for record in found if record["model"] == "text_classifier")
    assert [item["data"] for item in texts["inputs"]] == [TEXT, None]
    assert texts["inputs"][1]["size"] == len(long_text.encode())
    pictures = next(record for record in found if record["model"] == "image_classifier")
    assert base64.b64decode(pictures["inputs"][0]["data"]) == small_png
