"""No single request holds the event loop: while 4 clients send the most expensive bodies
the caps allow, /livez keeps answering fast (its latency percentiles are reported)."""

from __future__ import annotations

import base64
import itertools
import json
import random
import statistics
import threading
import time
from collections.abc import Callable

import httpx
import pytest

from gateway.dev.gatewayprocess import GatewayProcess
from gateway.dev.tritonserver import TritonServer
from gateway.settings import MiB, Settings

from helpers.support import jpeg_with_app_segments, png_with_private_chunks

pytestmark = pytest.mark.alone  # it times or loads the machine: run with nothing beside it

SECONDS = 10.0
CLIENTS = 4


def worst_case_bodies(settings: Settings) -> list[tuple[str, bytes, str]]:
    """(name, body, content type): each near a cap, each costly in a different step."""
    noise = random.Random(0).randbytes(6 * MiB)
    fake_png = b"\x89PNG\r\n\x1a\n" + noise  # passes the magic check, fails the header walk
    images = [base64.b64encode(fake_png).decode()] * (settings.max_body_bytes // len(fake_png) - 1)
    empty_items = (settings.max_text_body_bytes - 32) // 3
    return [
        ("base64 JSON at the body cap", json.dumps({"images": images}).encode(), "application/json"),
        ("PNG of 600k chunks", png_with_private_chunks(600_000), "image/png"),
        ("JPEG of 100k markers", jpeg_with_app_segments(100_000), "image/jpeg"),
        ("texts of empty objects", b'{"texts": [' + b"{}," * empty_items + b"{}]}", "application/json"),
        ("100,000-digit integer", b'{"texts": ["a"], "top_k": ' + b"9" * 100_000 + b"}", "application/json"),
    ]


def test_livez_stays_fast_while_clients_send_worst_case_bodies(
    triton: TritonServer, spawn_gateway: Callable[..., GatewayProcess]
) -> None:
    gateway = spawn_gateway(triton)
    bodies = worst_case_bodies(Settings())
    stop = threading.Event()
    answers: dict[str, list[int]] = {name: [] for name, _, _ in bodies}

    def hostile(offset: int) -> None:
        with httpx.Client(base_url=gateway.url, timeout=60) as client:
            for name, body, kind in itertools.islice(itertools.cycle(bodies), offset, None):
                if stop.is_set():
                    return
                response = client.post("/classify", content=body, headers={"content-type": kind})
                answers[name].append(response.status_code)

    threads = [threading.Thread(target=hostile, args=(i,), daemon=True) for i in range(CLIENTS)]
    for thread in threads:
        thread.start()
    latencies = []
    with httpx.Client(base_url=gateway.url, timeout=10) as probe:
        time.sleep(0.5)
        until = time.monotonic() + SECONDS
        while time.monotonic() < until:
            started = time.monotonic()
            assert probe.get("/livez").status_code == 200
            latencies.append(time.monotonic() - started)
            time.sleep(0.02)
    stop.set()
    for thread in threads:
        thread.join(timeout=60)
    latencies.sort()
    p50 = statistics.median(latencies)
    p99 = latencies[int(len(latencies) * 0.99)]
    print(
        f"/livez under {CLIENTS} worst-case clients: {len(latencies)} probes, p50 {p50 * 1000:.1f} ms, "
        f"p99 {p99 * 1000:.1f} ms, max {latencies[-1] * 1000:.1f} ms; answers "
        + ", ".join(f"{name}: {sorted(set(codes))} x{len(codes)}" for name, codes in answers.items())
    )
    assert all(answers.values()), answers  # every kind of body was sent at least once
    assert all(400 <= code < 500 for codes in answers.values() for code in codes), answers
    assert p99 < 1.0, f"/livez p99 {p99 * 1000:.0f} ms"
