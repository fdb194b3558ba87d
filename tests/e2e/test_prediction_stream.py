"""The prediction log's Redis sink against a real redis-server: a stream per model,
trimmed near its cap, read back by `triton-gateway predictions export` (a process of its
own) and resumed from the id it prints; Redis killed: records dropped and counted, every
answer still 200; Redis back: records flow again. (The backend is faked: the log sits after
the answer, Triton is not what is under test.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from gateway.app import create_app
from gateway.dev.redisserver import RedisServer
from gateway.settings import Settings

from helpers.support import FakeBackend, ServedApp

TEXT = "The striker scored twice in the final."
PREFIX = "tg:predictions"


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.stop()


def export(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GATEWAY_PREDICTION_LOG__URL": url, "GATEWAY_PREDICTION_LOG__STREAM_PREFIX": PREFIX}
    return subprocess.run(
        [sys.executable, "-m", "gateway", "predictions", "export", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )


def metric(gateway: ServedApp, name: str) -> float:
    for line in httpx.get(f"{gateway.url}/metrics", timeout=10).text.splitlines():
        if line.startswith(name):
            return float(line.split()[-1])
    return 0.0


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_records_go_to_a_stream_per_model_and_export_reads_them_back(redis: RedisServer) -> None:
    settings = Settings(
        prediction_log={
            "url": redis.url,
            "sample_rate": 1.0,
            "stream_prefix": PREFIX,
            "max_stream_length": 100,
            "timeout_seconds": 0.5,
        }
    )
    gateway = ServedApp(create_app(settings, backend_factory=lambda *_: FakeBackend()), settings).start()
    sent = "gateway_prediction_log_sent_total"
    try:
        with httpx.Client(base_url=gateway.url, timeout=10) as client:
            ids = []
            for _ in range(5):
                answer = client.post("/classify", json={"text": TEXT})
                assert answer.status_code == 200
                ids.append(answer.headers["x-request-id"])
            wait_for(lambda: metric(gateway, sent) >= 5)

            first = export(redis.url)
            assert first.returncode == 0, first.stderr
            records = [json.loads(line) for line in first.stdout.splitlines()]
            assert [record["request_id"] for record in records] == ids
            assert {record["model"] for record in records} == {"text_classifier"}
            assert all(record["predictions"] for record in records)
            summary = first.stderr.strip().splitlines()[-1]
            assert summary.startswith("text_classifier: 5 records")
            last = summary.split("--since ")[1].split()[0]

            # resumed from the id it printed: only what came after
            more = client.post("/classify", json={"text": TEXT})
            wait_for(lambda: metric(gateway, sent) >= 6)
            resumed = export(redis.url, "--since", last, "--model", "text_classifier")
            assert resumed.returncode == 0, resumed.stderr
            assert [json.loads(line)["request_id"] for line in resumed.stdout.splitlines()] == [
                more.headers["x-request-id"]
            ]

            # a stream holds about its cap (Redis trims whole nodes: MAXLEN ~)
            for _ in range(400):
                assert client.post("/classify", json={"text": TEXT}).status_code == 200
            wait_for(lambda: metric(gateway, sent) >= 406)
            kept = export(redis.url, "--model", "text_classifier")
            assert 100 <= len(kept.stdout.splitlines()) < 406

            # Redis gone: dropped and counted, every answer still 200; back: flowing again
            redis.kill()
            for _ in range(3):
                assert client.post("/classify", json={"text": TEXT}).status_code == 200
            wait_for(
                lambda: metric(gateway, 'gateway_prediction_log_dropped_total{reason="sink_error"}') >= 3
            )
            down = export(redis.url)
            assert down.returncode == 1
            assert "Traceback" not in down.stderr
            redis.start()
            before = metric(gateway, sent)
            assert client.post("/classify", json={"text": TEXT}).status_code == 200
            wait_for(lambda: metric(gateway, sent) > before)
    finally:
        gateway.stop()
