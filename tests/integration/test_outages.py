"""Triton faults against the real stack: killed mid-load and restarted on the same port
(outages of different lengths), and hung (SIGSTOP) then resumed. Only 200, 503 or 504
problem+json, nothing hangs, and the gateway recovers by itself."""

from __future__ import annotations

import math
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx
import pytest
from prometheus_client import CollectorRegistry

from gateway.app import create_app
from gateway.dev.gatewayprocess import GatewayProcess
from gateway.dev.tritonserver import TritonServer

from helpers.support import ServedApp, coffee_png
from helpers.triton_fixtures import gateway_settings

pytestmark = pytest.mark.alone  # it times or loads the machine: run with nothing beside it

DEADLINE = 3.0


@dataclass
class Traffic:
    """Back-to-back single-image requests from two clients, each answer timestamped."""

    url: str
    answers: list[tuple[float, float, int, str]] = field(default_factory=list)  # sent, answered, status, type
    unexpected: list[str] = field(default_factory=list)  # bodies of answers other than 200/503/504
    _stop: threading.Event = field(default_factory=threading.Event)

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=DEADLINE + 10) as client:
            while not self._stop.is_set():
                sent = time.monotonic()
                response = client.post(
                    "/classify", content=coffee_png(), headers={"content-type": "image/png"}
                )
                kind = response.headers.get("content-type", "")
                self.answers.append((sent, time.monotonic(), response.status_code, kind))
                if response.status_code not in (200, 503, 504):
                    self.unexpected.append(response.text[:500])
                if response.status_code != 200:
                    time.sleep(0.02)

    def __enter__(self) -> Traffic:
        self._threads = [threading.Thread(target=self._run, daemon=True) for _ in range(2)]
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=DEADLINE + 15)

    def first(self, status: int, after: float) -> float:
        times = [answered for sent, answered, s, _ in self.answers if s == status and answered >= after]
        return min(times) - after if times else float("nan")

    def served_since(self, after: float, within: float) -> None:
        """Wait (at most ``within`` seconds) for a 200 answered after ``after``, then half a
        second more of traffic."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline and math.isnan(self.first(200, after)):
            time.sleep(0.05)
        time.sleep(0.5)


def test_kill_restart_and_hang_recover_without_restarting_the_gateway(
    faults_triton: TritonServer, spawn_gateway: Callable[..., GatewayProcess]
) -> None:
    gateway = spawn_gateway(faults_triton, GATEWAY_TRITON__TIMEOUT_SECONDS=str(DEADLINE))
    report = []
    with Traffic(gateway.url) as traffic:
        time.sleep(1.5)
        for outage in (1.0, 6.0):
            killed = time.monotonic()
            faults_triton.send_signal(signal.SIGKILL)
            faults_triton.wait_exited()
            time.sleep(outage)
            faults_triton.start()
            faults_triton.wait_ready(timeout=120)
            ready = time.monotonic()
            traffic.served_since(ready, 3.0)
            report.append(
                f"outage {outage:.0f} s (+start-up): first 503 after {traffic.first(503, killed):.2f} s, "
                f"first 200 {traffic.first(200, ready):.2f} s after Triton was ready"
            )
            assert traffic.first(200, ready) <= 2.0
        paused = time.monotonic()
        faults_triton.send_signal(signal.SIGSTOP, group=False)
        try:
            not_ready = None
            while time.monotonic() - paused < 5:
                if httpx.get(f"{gateway.url}/readyz", timeout=5).status_code == 503:
                    not_ready = time.monotonic() - paused
                    break
                time.sleep(0.05)
            time.sleep(DEADLINE + 1)
        finally:
            faults_triton.send_signal(signal.SIGCONT, group=False)
        resumed = time.monotonic()
        traffic.served_since(resumed, 3.0)
    report.append(
        f"hung: /readyz 503 after {not_ready} s, first 504 after {traffic.first(504, paused):.2f} s, "
        f"first 503 after {traffic.first(503, paused):.2f} s, first 200 {traffic.first(200, resumed):.2f} s after SIGCONT"
    )
    print("\n".join(report))
    statuses = {status for _, _, status, _ in traffic.answers}
    assert statuses <= {200, 503, 504}, (statuses, traffic.unexpected[:3])
    assert all(kind == "application/problem+json" for *_, status, kind in traffic.answers if status != 200)
    assert max(answered - sent for sent, answered, _, _ in traffic.answers) < DEADLINE + 2  # nothing hangs
    assert not_ready is not None
    assert not_ready <= 2.0
    assert traffic.first(200, resumed) <= 2.0


def _sample(registry: CollectorRegistry, name: str, labels: dict[str, str] | None = None) -> float:
    value = registry.get_sample_value(name, labels or {})
    assert value is not None, name
    return value


def test_health_signals_are_true_at_rest(faults_triton: TritonServer) -> None:
    """Triton killed and restarted while nobody sends a request (the registry is read
    directly, not through /metrics): the circuit opens and closes, the catalog's refresh
    time stops and moves again, each within its own poll period."""
    registry = CollectorRegistry()
    settings = gateway_settings(faults_triton, catalog_refresh_seconds=0.5)
    settings = settings.model_copy(
        update={"triton": settings.triton.model_copy(update={"probe_interval_seconds": 0.5})}
    )
    served = ServedApp(create_app(settings, registry=registry), settings).start()
    open_ = {"gateway_triton_circuit_state": "open"}
    closed = {"gateway_triton_circuit_state": "closed"}
    try:
        first = _sample(registry, "gateway_catalog_last_refresh_timestamp_seconds")
        time.sleep(1.2)
        assert _sample(registry, "gateway_catalog_last_refresh_timestamp_seconds") > first  # moves at rest
        assert _sample(registry, "gateway_triton_circuit_state", closed) == 1
        faults_triton.send_signal(signal.SIGKILL)
        faults_triton.wait_exited()
        killed = time.monotonic()
        while _sample(registry, "gateway_triton_circuit_state", open_) != 1:
            assert time.monotonic() - killed < 5, "the circuit did not open at rest"
            time.sleep(0.05)
        opened = time.monotonic() - killed
        stale = _sample(registry, "gateway_catalog_last_refresh_timestamp_seconds")
        time.sleep(1.2)
        assert _sample(registry, "gateway_catalog_last_refresh_timestamp_seconds") == stale  # Triton is gone
        faults_triton.start()
        faults_triton.wait_ready(timeout=120)
        ready = time.monotonic()
        while _sample(registry, "gateway_triton_circuit_state", closed) != 1 or (
            _sample(registry, "gateway_catalog_last_refresh_timestamp_seconds") == stale
        ):
            assert time.monotonic() - ready < 5, (
                "the circuit or the catalog did not recover at rest",
                {
                    s: _sample(registry, "gateway_triton_circuit_state", {"gateway_triton_circuit_state": s})
                    for s in ("closed", "open", "half_open")
                },
                _sample(registry, "gateway_catalog_last_refresh_timestamp_seconds") - stale,
            )
            time.sleep(0.05)
        print(f"at rest: circuit open {opened:.2f} s after the kill, closed and catalog fresh "
              f"{time.monotonic() - ready:.2f} s after Triton was ready")  # fmt: skip
    finally:
        served.stop()
