"""Proof that every dashboard panel and recording rule shows real data.

A real Triton, the real gateway and a real Prometheus (Debian's package) scraping the
gateway's /metrics every second on loopback; mixed traffic (images, texts, invalid
input); then every PromQL expression of every panel and rule is run against Prometheus.
"""

from __future__ import annotations

import base64
import json
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gateway.app import create_app
from gateway.dev.tritonserver import TritonServer
from gateway.settings import AdminSettings
from gateway.shared.keyfiles import hash_key

from helpers.support import (
    ServedApp,
    chelsea_jpeg,
    coffee_png,
    random_bytes,
    running_prometheus,
    truncated_jpeg,
)
from helpers.triton_fixtures import gateway_settings

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "rules"
DASHBOARDS = ROOT / "deploy" / "grafana" / "dashboards"
# Triton exports these only on GPU hosts (there is no GPU here); every other query must
# return data.
GPU_ONLY = ("nv_gpu_utilization", "nv_gpu_memory_used_bytes", "nv_gpu_memory_total_bytes")
# The suite's Triton runs without a response cache (Triton counts no hits and no misses):
# tests/integration/test_response_cache.py proves that panel on a cached Triton.
CACHE_ONLY = ("nv_cache_num_hits_per_model",)


ADMIN = {"Authorization": "Bearer ops-secret"}


@pytest.fixture(scope="module")
def gateway(triton: TritonServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedApp]:
    """The session's gateway with an admin surface: the rollout is started as operators do."""
    keys = tmp_path_factory.mktemp("admin") / "keys"
    keys.write_text(f"ops {hash_key('ops-secret')}\n")
    log = tmp_path_factory.mktemp("predictions") / "log.jsonl"
    settings = gateway_settings(
        triton,
        admin=AdminSettings(keys_file=keys),
        # small windows, so the drift panels have data within the module's traffic
        drift={"window_seconds": 60, "slot_seconds": 2, "min_inputs": 10, "interval_seconds": 0.5},
        prediction_log={"url": f"file://{log}", "sample_rate": 1.0},
    )
    served = ServedApp(create_app(settings), settings).start()
    yield served
    served.stop()


@pytest.fixture(scope="module")
def prometheus(gateway: ServedApp, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_prometheus(
        gateway.url, tmp_path_factory.mktemp("prometheus"), rule_files=sorted(RULES.glob("*.yml"))
    ) as url:
        yield url


def send_mixed_traffic(base: str, seconds: float) -> None:
    encoded = base64.b64encode(coffee_png()).decode()
    deadline = time.monotonic() + seconds
    with httpx.Client(base_url=base, timeout=60) as client:
        while time.monotonic() < deadline:
            client.post(
                "/classify", files=[("file", ("a.jpg", chelsea_jpeg())), ("file", ("b.png", coffee_png()))]
            )
            client.post("/classify", json={"images": [encoded]})
            client.post(
                "/classify", json={"texts": ["The striker scored twice in the final.", "Rates rose."]}
            )
            client.post(
                "/classify", json={"text": "Whisk the eggs.", "candidate_labels": ["cooking", "travel"]}
            )
            client.post("/classify", content=random_bytes(), headers={"content-type": "image/jpeg"})
            client.post("/classify", content=truncated_jpeg(), headers={"content-type": "image/jpeg"})
            client.post("/classify", json={"text": ""})
            client.get("/readyz")
            time.sleep(0.2)


def query(prometheus: str, expr: str) -> list[dict[str, Any]]:
    response = httpx.get(f"{prometheus}/api/v1/query", params={"query": expr}, timeout=30)
    body = response.json()
    assert body["status"] == "success", f"{expr}: {body}"
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def finite(result: list[dict[str, Any]]) -> bool:
    return any(math.isfinite(float(item["value"][1])) for item in result)


def panel_queries() -> list[tuple[str, str]]:
    found = []
    for path in sorted(DASHBOARDS.glob("*.json")):
        for panel in json.loads(path.read_text())["panels"]:
            for target in panel["targets"]:
                # As Grafana would send them with "All" models over a short range.
                expr = target["expr"].replace("$__rate_interval", "1m").replace("$model", ".*")
                found.append((f"{path.stem} / {panel['title']} / {target['refId']}", expr))
    return found


def rule_queries() -> list[tuple[str, str]]:
    found = []
    for path in sorted(RULES.glob("*.yml")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                if "record" in rule:
                    found.append((rule["record"], rule["expr"]))
    return found


@pytest.fixture(scope="module")
def traffic(prometheus: str, gateway: ServedApp) -> Iterator[str]:
    """Mixed traffic, with the text model under a rollout (shadowed by its version 1 at
    100 %) so the rollout panels have data; the rollout ends with the module."""

    path = f"{gateway.url}/admin/models/text_classifier/rollout"
    started = httpx.put(path, json={"shadow": {"target": "text_classifier:1", "sample": 1.0}}, headers=ADMIN)
    assert started.status_code == 200, started.text
    try:
        send_mixed_traffic(gateway.url, seconds=6)
        for model in ("image_classifier", "text_classifier"):  # drift needs a reference
            captured = httpx.post(f"{gateway.url}/admin/models/{model}/reference", headers=ADMIN)
            assert captured.status_code == 200, captured.text
        send_mixed_traffic(gateway.url, seconds=6)
        time.sleep(3)  # a few more scrapes after the last request
        yield prometheus
    finally:
        assert httpx.delete(path, headers=ADMIN).status_code == 200


def test_prometheus_scrapes_the_gateway(traffic: str) -> None:
    targets = httpx.get(f"{traffic}/api/v1/targets", timeout=10).json()["data"]["activeTargets"]
    assert [t["health"] for t in targets] == ["up"]
    assert finite(query(traffic, 'gateway_triton_metrics_up{job="triton-gateway"} == 1'))


@pytest.mark.parametrize(("name", "expr"), panel_queries(), ids=[name for name, _ in panel_queries()])
def test_every_panel_query_returns_data(traffic: str, name: str, expr: str) -> None:
    result = query(traffic, expr)
    if any(metric in expr for metric in GPU_ONLY):
        assert all(metric.startswith("nv_gpu_") for metric in GPU_ONLY)
        assert result == [], "no GPU here, so GPU panels must be empty rather than wrong"
        return
    if any(metric in expr for metric in CACHE_ONLY):
        # Triton counts 0 hits and 0 misses without a cache: no ratio (NaN), never a number
        assert not finite(result), "no response cache on this Triton, so no hit ratio"
        return
    assert finite(result), f"{name}: {expr} returned {result}"


@pytest.mark.parametrize(("name", "expr"), rule_queries(), ids=[name for name, _ in rule_queries()])
def test_every_recording_rule_returns_data(traffic: str, name: str, expr: str) -> None:
    assert finite(query(traffic, expr)), f"{name}: {expr}"


def test_rules_load_and_evaluate_in_prometheus(traffic: str) -> None:
    groups = httpx.get(f"{traffic}/api/v1/rules", timeout=10).json()["data"]["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    assert len(rules) == 20
    assert all(rule["health"] == "ok" for rule in rules), [r for r in rules if r["health"] != "ok"]
    assert finite(query(traffic, "route:gateway_request_duration_seconds:p99_rate5m"))
