"""The tritonserver flags `triton-gateway local` (make run) adds for tracing."""

from __future__ import annotations

from gateway.observe.tracing import triton_trace_args
from gateway.settings import TracingSettings


def test_tracing_off_adds_no_flag_so_triton_traces_nothing() -> None:
    assert triton_trace_args(TracingSettings(enabled=False)) == []


def test_tracing_on_points_triton_at_the_same_collector_for_propagated_requests_only() -> None:
    args = triton_trace_args(TracingSettings(enabled=True, endpoint="http://collector:4318/v1/traces"))
    assert "--trace-config=mode=opentelemetry" in args
    assert "--trace-config=opentelemetry,url=http://collector:4318/v1/traces" in args
    assert "--trace-config=rate=0" in args  # only requests that carry a traceparent
    assert "--trace-config=count=-1" in args
    assert all(a.startswith("--trace-config=") for a in args)
