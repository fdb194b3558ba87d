"""Triton's response cache, through the gateway: a repeated image is answered from the
cache (Triton's own statistics count the hit) with the same answer, and anything that
changes the answer (another top_k, another input) is a miss; the Triton dashboard's
hit-ratio panel shows it, read from a real Prometheus scraping the gateway. The text ensemble is not
cached: its label set is reloaded at run time, and Triton keeps cached answers across a
reload (tests/integration/test_model_control.py reloads it)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway.app import create_app
from gateway.dev.tritonserver import TritonServer

from helpers.support import ServedApp, chelsea_jpeg, running_prometheus
from helpers.triton_fixtures import REPOSITORY, gateway_settings, start_triton


@pytest.fixture(scope="module")
def cached_triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    server = start_triton(
        REPOSITORY, tmp_path_factory.mktemp("cached"), response_cache_bytes=64 * 1024 * 1024
    )
    yield server
    server.kill()


def cache_counts(triton: TritonServer, model: str) -> tuple[int, int]:
    url = f"http://{triton.host}:{triton.http_port}/v2/models/{model}/stats"
    stats = httpx.get(url, timeout=10).json()["model_stats"][0]["inference_stats"]
    return int(stats["cache_hit"]["count"]), int(stats["cache_miss"]["count"])


def send_image(http: httpx.Client, top_k: int) -> httpx.Response:
    return http.post(f"/classify?top_k={top_k}", files={"file": ("c.jpg", chelsea_jpeg())})


def test_repeated_images_are_answered_from_the_cache_and_texts_never(
    cached_triton: TritonServer, tmp_path: Path
) -> None:
    settings = gateway_settings(cached_triton)
    served = ServedApp(create_app(settings), settings).start()
    try:
        with httpx.Client(base_url=served.url, timeout=60) as http:
            image = "image_classifier"
            hits, misses = cache_counts(cached_triton, image)
            first = send_image(http, 3)
            started = time.perf_counter()
            again = send_image(http, 3)
            hit_ms = 1000 * (time.perf_counter() - started)
            other = send_image(http, 4)
            assert first.status_code == again.status_code == other.status_code == 200
            assert first.json()["results"] == again.json()["results"]
            assert len(other.json()["results"][0]["predictions"]) == 4
            new_hits, new_misses = cache_counts(cached_triton, image)
            print(f"{image}: hit answered through the gateway in {hit_ms:.1f} ms")
            assert (new_hits - hits, new_misses - misses) == (1, 2)

            text = {"text": "The striker scored.", "top_k": 3}
            answers = [http.post("/classify", json=text) for _ in range(2)]
            assert [a.status_code for a in answers] == [200, 200]
            assert cache_counts(cached_triton, "text_classifier") == (0, 0)
    finally:
        served.stop()


def test_the_dashboards_hit_ratio_panel_shows_the_cache(cached_triton: TritonServer, tmp_path: Path) -> None:
    dashboard = Path(__file__).resolve().parents[2] / "deploy/grafana/dashboards/triton-models.json"
    [panel] = [
        p for p in json.loads(dashboard.read_text())["panels"] if p["title"] == "Response cache hit ratio"
    ]
    expr = panel["targets"][0]["expr"].replace("$__rate_interval", "1m").replace("$model", ".*")
    settings = gateway_settings(cached_triton)
    served = ServedApp(create_app(settings), settings).start()
    try:
        with (
            running_prometheus(served.url, tmp_path) as prometheus,
            httpx.Client(base_url=served.url) as http,
        ):
            deadline = time.monotonic() + 8
            while time.monotonic() < deadline:  # one photo, again and again: hits after the first
                assert send_image(http, 2).status_code == 200
                time.sleep(0.1)
            time.sleep(3)  # a few scrapes after the last request
            body = httpx.get(f"{prometheus}/api/v1/query", params={"query": expr}, timeout=30).json()
    finally:
        served.stop()
    ratios = {item["metric"]["model"]: float(item["value"][1]) for item in body["data"]["result"]}
    assert 0.5 < ratios["image_classifier"] <= 1.0, ratios
