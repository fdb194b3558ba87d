"""Drift, proven on the real stack: a real Triton, two `triton-gateway serve` replicas
sharing a real redis-server, and a real Prometheus scraping the replica that takes no
traffic (what it reports is the window the two share).

1. Photos (random crops of scikit-image's photos) sent to replica A; the reference is
   captured through A's admin surface.
2. More photos of the same kind (other crops): replica B's drift stays under its
   thresholds, and the PredictionDrift expression is empty in Prometheus.
3. The same kind of photos darkened (a camera's firmware update): B's drift rises past the
   threshold within the window, and the alert's expression fires in Prometheus; the
   dashboard's drift queries, in Prometheus' page rendered by headless Chromium, show it.
4. B restarted: the reference is still there (it lives in Redis).
"""

from __future__ import annotations

import io
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import numpy as np
import pytest
import yaml
from PIL import Image

from gateway.dev.gatewayprocess import GatewayProcess
from gateway.dev.redisserver import RedisServer
from gateway.dev.tritonserver import TritonServer
from gateway.shared.keyfiles import hash_key

from helpers.chromium import dump_dom
from helpers.support import running_prometheus

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "deploy" / "prometheus" / "rules" / "alerts.yml"
ADMIN = {"Authorization": "Bearer ops-secret"}
MODEL = "image_classifier"
WINDOW = 240  # inputs: the drift window is the newest slots that reach this many


COLOUR = ("astronaut", "chelsea", "coffee", "rocket", "hubble_deep_field", "immunohistochemistry", "retina")
GREY = ("camera", "moon", "brick", "grass", "gravel", "page", "text")


def _scenes() -> list[np.ndarray]:
    """scikit-image's photos (bundled with it: no download), the grey ones as RGB."""
    from skimage import data

    colour = [getattr(data, name)()[..., :3] for name in (*COLOUR, "colorwheel")]
    grey = [getattr(data, name)() for name in GREY]
    return colour + [np.stack([g] * 3, axis=-1) for g in grey]


def photos(seed: int, count: int, light: float = 1.0) -> list[bytes]:
    """``count`` JPEGs: random crops (40-100 % of a side) of the scenes, some mirrored,
    224 px, with their brightness scaled by ``light``."""
    rng = np.random.default_rng(seed)
    scenes = _scenes()
    found = []
    for _ in range(count):
        scene = scenes[rng.integers(len(scenes))]
        height, width = scene.shape[:2]
        side = int(min(height, width) * rng.uniform(0.4, 1.0))
        top, left = rng.integers(0, height - side + 1), rng.integers(0, width - side + 1)
        crop = scene[top : top + side, left : left + side]
        if rng.random() < 0.5:
            crop = crop[:, ::-1]
        pixels = np.clip(crop.astype(float) * light, 0, 255).astype(np.uint8)
        buffer = io.BytesIO()
        Image.fromarray(pixels).resize((224, 224)).save(buffer, "JPEG", quality=85)
        found.append(buffer.getvalue())
    return found


def classify_all(url: str, images: list[bytes]) -> None:
    with httpx.Client(base_url=url, timeout=120) as client:
        for start in range(0, len(images), 8):
            batch = images[start : start + 8]
            files = [("file", (f"{i}.jpg", body, "image/jpeg")) for i, body in enumerate(batch)]
            answer = client.post(f"/models/{MODEL}/classify", files=files)
            assert answer.status_code == 200, answer.text


def drift_of(url: str) -> dict[str, Any]:
    info = httpx.get(f"{url}/models/{MODEL}", timeout=10).json()
    versions = info["drift"]["versions"]
    assert len(versions) == 1, versions
    return dict(next(iter(versions.values())))


def wait_for_window(url: str, inputs: int, timeout: float = 30) -> dict[str, Any]:
    """The reading once the window holds ``inputs`` new inputs' worth and drift is measured."""
    deadline = time.monotonic() + timeout
    reading: dict[str, Any] = {}
    while time.monotonic() < deadline:
        reading = drift_of(url)
        if reading["inputs"] >= inputs and reading["drift"] is not None:
            return reading
        time.sleep(0.3)
    raise AssertionError(f"the window did not fill: {reading}")


def drift_panels() -> list[tuple[str, str]]:
    """The model-quality dashboard's drift queries, as Grafana sends them for every model."""
    board = json.loads((ROOT / "deploy" / "grafana" / "dashboards" / "model-quality.json").read_text())
    found = []
    for panel in board["panels"]:
        if panel["title"].startswith("Drift"):
            for target in panel["targets"]:
                found.append((panel["title"], target["expr"].replace("$model", ".*")))
    assert len(found) == 4, found
    return found


def rendered(prometheus: str, query: str) -> str:
    """Prometheus' graph page for ``query`` in its table view, after Chromium ran its scripts."""
    return dump_dom(f"{prometheus}/graph?{urlencode({'g0.expr': query, 'g0.tab': '1'})}")


def alert_expression() -> str:
    for group in yaml.safe_load(ALERTS.read_text())["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == "PredictionDrift":
                return str(rule["expr"])
    raise AssertionError("no PredictionDrift alert in deploy/prometheus/rules/alerts.yml")


def firing(prometheus: str, expr: str) -> list[dict[str, Any]]:
    answer = httpx.get(f"{prometheus}/api/v1/query", params={"query": expr}, timeout=10).json()
    assert answer["status"] == "success", answer
    return list(answer["data"]["result"])


def wait_for(prometheus: str, expr: str, present: bool, timeout: float = 20) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    found = firing(prometheus, expr)
    while bool(found) != present and time.monotonic() < deadline:
        time.sleep(0.5)
        found = firing(prometheus, expr)
    return found


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.stop()


def test_darkened_photos_drift_past_the_threshold_and_fire_the_alert(
    triton: TritonServer, redis: RedisServer, tmp_path: Path
) -> None:
    admin = tmp_path / "admin-keys"
    admin.write_text(f"ops {hash_key('ops-secret')}\n")
    env = {
        "GATEWAY_REDIS__URL": redis.url,
        "GATEWAY_ADMIN__KEYS_FILE": str(admin),
        "GATEWAY_DRIFT__SLOT_SECONDS": "1",
        "GATEWAY_DRIFT__WINDOW_SECONDS": "600",
        "GATEWAY_DRIFT__WINDOW_INPUTS": str(WINDOW),
        "GATEWAY_DRIFT__MIN_INPUTS": "100",
        "GATEWAY_DRIFT__INTERVAL_SECONDS": "0.5",
        # fewer false alarms (the documented knob): 240 undrifted crops of 15 scenes put the
        # confidence statistic at 0.133, near the 0.99 quantile (0.13 to 0.15 by reference)
        "GATEWAY_DRIFT__QUANTILE": "0.999",
    }
    started: list[GatewayProcess] = []

    def spawn() -> GatewayProcess:
        process = GatewayProcess.start(triton, tmp_path, env=env).wait()
        started.append(process)
        return process

    try:
        busy, watched = spawn(), spawn()
        (tmp_path / "prometheus").mkdir()
        with running_prometheus(watched.url, tmp_path / "prometheus", rule_files=[ALERTS]) as prometheus:
            expr = alert_expression()

            # 1. the reference: normal photos through A, captured through A
            classify_all(busy.url, photos(seed=1, count=WINDOW))
            time.sleep(1.5)  # A's last counts shared (every 0.5 s), the slot closed
            captured = httpx.post(f"{busy.url}/admin/models/{MODEL}/reference", headers=ADMIN, timeout=10)
            assert captured.status_code == 200, captured.text
            assert captured.json()["inputs"] >= WINDOW
            assert captured.json()["source"] == "captured"

            # 2. the same kind of photos: B (no traffic of its own) measures the shared window
            time.sleep(1.5)
            classify_all(busy.url, photos(seed=2, count=WINDOW))
            time.sleep(1.5)
            steady = wait_for_window(watched.url, WINDOW)
            print("undrifted", steady)
            assert steady["drift"]["drifting"] is False, steady
            assert steady["drift"]["labels"] < steady["drift"]["labels_threshold"]
            assert steady["drift"]["confidence"] < steady["drift"]["confidence_threshold"]
            assert wait_for(prometheus, "gateway_prediction_drift", present=True)
            assert firing(prometheus, expr) == []

            # 3. darkened photos: past the threshold, and the alert's expression fires
            time.sleep(1.5)
            classify_all(busy.url, photos(seed=3, count=WINDOW, light=0.15))
            time.sleep(1.5)
            shifted = wait_for_window(watched.url, WINDOW)
            print("darkened", shifted)
            assert shifted["drift"]["drifting"] is True, shifted
            assert shifted["drift"]["confidence"] > shifted["drift"]["confidence_threshold"]
            fired = wait_for(prometheus, expr, present=True)
            assert {item["metric"]["model"] for item in fired} == {MODEL}
            # the dashboard's drift panels, as a browser shows them: Prometheus' own page
            # (no Grafana server runs here), rendered by headless Chromium
            for title, query in drift_panels():
                shown = rendered(prometheus, query)
                assert MODEL in shown, f"{title}: {query} shows no {MODEL} series"
                assert re.search(r"0\.\d{3,}", shown), f"{title}: no value rendered"

        # 4. the reference outlives a replica: it is Redis's
        watched.stop()
        again = spawn()
        info = httpx.get(f"{again.url}/models/{MODEL}", timeout=10).json()
        assert info["drift"]["reference"]["source"] == "captured"
        assert info["drift"]["reference"]["inputs"] == captured.json()["inputs"]
    finally:
        for process in started:
            process.stop()
