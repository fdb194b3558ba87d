"""Tracing at the gateway's edge, with a fake backend and a real OTLP/HTTP receiver:
trace context in, the server span and its steps out, trace ids in problems, access log
lines and exemplars; nothing at all when tracing is off; a dead collector costs nothing."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from gateway.app import create_app
from gateway.dev.otlpsink import OtlpReceiver, ReceivedSpan
from gateway.dev.tritonserver import free_port
from gateway.settings import Settings, TracingSettings

from helpers.support import FakeBackend, random_bytes, small_png

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CALLER_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"
SERVER = 2  # OTLP SpanKind


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as running:
        yield running


def traced_client(backend: FakeBackend, endpoint: str, **tracing: object) -> TestClient:
    options: dict[str, object] = {"trust_inbound": True, **tracing}
    settings = Settings(
        tracing=TracingSettings(enabled=True, endpoint=endpoint, export_delay_seconds=0.1, **options)
    )
    return TestClient(create_app(settings, backend_factory=lambda *_: backend), raise_server_exceptions=False)


def server_span(spans: list[ReceivedSpan], trace_id: str) -> ReceivedSpan:
    [span] = [s for s in spans if s.trace_id == trace_id and s.kind == SERVER]
    return span


def test_a_callers_trace_is_continued_with_a_server_span_and_its_steps(receiver: OtlpReceiver) -> None:
    with traced_client(FakeBackend(), receiver.endpoint) as client:
        response = client.post(
            "/classify",
            content=small_png(),
            headers={"content-type": "image/png", "traceparent": TRACEPARENT},
        )
    assert response.status_code == 200
    spans = receiver.wait_for(lambda s: any(x.kind == SERVER for x in s))
    server = server_span(spans, CALLER_TRACE)
    assert server.parent_id == CALLER_SPAN
    assert server.name == "POST /classify"
    assert server.attributes["http.route"] == "/classify"
    assert server.attributes["http.response.status_code"] == 200
    assert server.service == "triton-gateway"
    children = {s.name for s in spans if s.parent_id == server.span_id}
    assert {"read body", "admission", "validate images"} <= children


def test_an_untrusted_callers_sampled_flag_forces_nothing(receiver: OtlpReceiver) -> None:
    """By default (tracing.trust_inbound off) a client's traceparent is not continued: its
    sampled flag does not force a trace; the request is sampled at sample_ratio (0 here)."""
    with traced_client(FakeBackend(), receiver.endpoint, trust_inbound=False, sample_ratio=0.0) as client:
        response = client.post(
            "/classify",
            content=small_png(),
            headers={"content-type": "image/png", "traceparent": TRACEPARENT},
        )
        assert response.status_code == 200
        client.post("/classify", json={"text": "hello there"})
    time.sleep(0.5)  # past the export delay (and the app's shutdown flushed): anything recorded is here
    assert receiver.trace(CALLER_TRACE) == []
    assert receiver.spans == []


def test_without_traceparent_a_new_trace_starts(receiver: OtlpReceiver) -> None:
    with traced_client(FakeBackend(), receiver.endpoint) as client:
        response = client.post("/classify", json={"text": "hello there"})
    assert response.status_code == 200
    spans = receiver.wait_for(lambda s: any(x.kind == SERVER for x in s))
    [server] = [s for s in spans if s.kind == SERVER]
    assert server.parent_id == ""
    assert server.trace_id != CALLER_TRACE
    assert len(server.trace_id) == 32


def test_problems_carry_the_trace_id_and_the_span_its_type(
    receiver: OtlpReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    with traced_client(FakeBackend(), receiver.endpoint) as client, caplog.at_level(logging.INFO):
        response = client.post(
            "/classify",
            content=random_bytes(),
            headers={"content-type": "image/png", "traceparent": TRACEPARENT},
        )
    assert response.status_code == 415
    assert response.json()["trace_id"] == CALLER_TRACE
    assert CALLER_TRACE.encode() not in random_bytes()  # (the id did not come from the body)
    spans = receiver.wait_for(lambda s: any(x.kind == SERVER for x in s))
    server = server_span(spans, CALLER_TRACE)
    assert server.attributes["error.type"] == "urn:triton-gateway:problem:unsupported-image-format"
    assert server.status_code == 0  # a 4xx is the client's error, not the server span's
    [line] = [r for r in caplog.records if r.name == "gateway.access"]
    assert line.trace_id == CALLER_TRACE  # type: ignore[attr-defined]
    assert f"trace_id={CALLER_TRACE}" in line.getMessage()


def test_an_unsampled_caller_is_not_recorded_but_keeps_its_trace_id(receiver: OtlpReceiver) -> None:
    with traced_client(FakeBackend(), receiver.endpoint) as client:
        response = client.post(
            "/classify",
            content=random_bytes(),
            headers={"content-type": "image/png", "traceparent": TRACEPARENT[:-2] + "00"},
        )
        client.post("/classify", json={"text": "flush marker"})  # a sampled one, to wait for
    assert response.json()["trace_id"] == CALLER_TRACE
    spans = receiver.wait_for(lambda s: any(x.kind == SERVER for x in s))
    assert [s for s in spans if s.trace_id == CALLER_TRACE] == []


def test_openmetrics_scrapes_get_exemplars_with_the_trace_id(receiver: OtlpReceiver) -> None:
    with traced_client(FakeBackend(), receiver.endpoint) as client:
        client.post("/classify", json={"text": "hello"}, headers={"traceparent": TRACEPARENT})
        response = client.get("/metrics", headers={"accept": "application/openmetrics-text; version=1.0.0"})
        classic = client.get("/metrics")
    assert response.headers["content-type"].startswith("application/openmetrics-text")
    assert response.text.endswith("# EOF\n")
    exemplars = [
        sample.exemplar
        for family in text_string_to_metric_families(response.text)  # type: ignore[no-untyped-call]
        if family.name == "gateway_request_duration_seconds"
        for sample in family.samples
        if sample.exemplar is not None
    ]
    assert [e.labels["trace_id"] for e in exemplars] == [CALLER_TRACE]
    assert classic.headers["content-type"].startswith("text/plain")
    assert "trace_id" not in classic.text  # the classic format has no exemplars


def test_tracing_off_records_nothing_and_adds_no_trace_id(receiver: OtlpReceiver) -> None:
    settings = Settings(tracing=TracingSettings(enabled=False, endpoint=receiver.endpoint))
    with TestClient(create_app(settings, backend_factory=lambda *_: FakeBackend())) as client:
        problem = client.post(
            "/classify",
            content=random_bytes(),
            headers={"content-type": "image/png", "traceparent": TRACEPARENT},
        )
        client.post("/classify", json={"text": "hello"}, headers={"traceparent": TRACEPARENT})
    time.sleep(0.5)
    assert "trace_id" not in problem.json()
    assert receiver.posts == 0


def test_a_dead_collector_neither_fails_nor_slows_requests() -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1/traces"  # nothing listens there
    with traced_client(FakeBackend(), dead, export_timeout_seconds=5.0) as client:
        started = time.monotonic()
        statuses = [client.post("/classify", json={"text": f"text {i}"}).status_code for i in range(50)]
        elapsed = time.monotonic() - started
    assert statuses == [200] * 50
    # exports fail on the exporter's thread; 50 requests take well under one export timeout
    assert elapsed < 5.0, elapsed
