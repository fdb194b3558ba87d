"""Model control against a real tritonserver in explicit mode, through a real gateway
process with its admin surface on a listener of its own, while traffic keeps flowing:

- Triton's repository API refuses anyone without the key only the gateway holds;
- edit the text label set, rebuild it (the model build's text-labels target, what
  `make models` runs), reload: the new labels are served and no request fails meanwhile;
- add version 2 of a served ensemble, load it next to version 1, move the pin: every
  answer before the move comes from version 1 and after it from version 2, none fails;
- unload a served model: /readyz and /models say so, the other model is still served.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as tritonhttp
from tritonclient.utils import InferenceServerException

from gateway.dev.gatewayprocess import GatewayProcess
from gateway.dev.tritonserver import TritonServer, free_port
from gateway.shared.keyfiles import hash_key

from helpers.support import chelsea_jpeg
from helpers.triton_fixtures import REPOSITORY, ROOT, start_triton

ADMIN = {"Authorization": "Bearer ops-secret"}
OLD_LABELS = {"sports", "politics", "technology", "business", "health", "entertainment"}
NEW_LABELS = {"cooking", "astronomy"}
COOKING = "Knead the dough, let it rise for an hour, then bake the bread at 220 degrees."
TEXTS = [
    "The striker scored twice in the second half.",
    "Parliament passed the budget after a long debate.",
    COOKING,
    "The telescope captured a distant galaxy and its nebula.",
]


@dataclass
class Stack:
    triton: TritonServer
    repository: Path
    gateway: GatewayProcess
    admin_url: str

    def admin(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return httpx.request(method, f"{self.admin_url}{path}", headers=ADMIN, timeout=300, **kwargs)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    root = tmp_path_factory.mktemp("model-control")
    repository = root / "repository"
    shutil.copytree(
        REPOSITORY, repository, symlinks=True, ignore=shutil.ignore_patterns("__pycache__", "*.tmp")
    )
    keys = root / "admin-keys"
    keys.write_text(f"ops {hash_key('ops-secret')}\n")
    triton = start_triton(repository, root / "triton")
    admin_port = free_port()
    gateway = GatewayProcess.start(
        triton,
        root,
        env={
            "GATEWAY_ADMIN__KEYS_FILE": str(keys),
            "GATEWAY_ADMIN__PORT": str(admin_port),
            "GATEWAY_TRITON__HEALTH_TIMEOUT_SECONDS": "5",
        },
    )
    try:
        gateway.wait("/readyz", timeout=60)
        yield Stack(triton, repository, gateway, f"http://127.0.0.1:{admin_port}")
    finally:
        gateway.stop()
        triton.kill()


@dataclass
class Traffic:
    """Requests sent back to back by a few threads; every answer is kept with its time."""

    url: str
    request: dict[str, Any]
    threads: int = 3
    answers: list[tuple[float, int, dict[str, Any]]] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def _run(self, offset: int) -> None:
        with httpx.Client(base_url=self.url, timeout=60) as http:
            turn = offset
            while not self._stop.is_set():
                turn += 1
                request = dict(self.request)
                if "json" in request and "texts" in request["json"]:
                    rotated = TEXTS[turn % len(TEXTS) :] + TEXTS[: turn % len(TEXTS)]
                    request["json"] = {**request["json"], "texts": rotated[:2]}
                sent = time.monotonic()
                response = http.post("/classify", **request)
                body = response.json() if response.headers.get("content-type", "").endswith("json") else {}
                self.answers.append((sent, response.status_code, body))

    def __enter__(self) -> Traffic:
        self._workers = [threading.Thread(target=self._run, args=(i,)) for i in range(self.threads)]
        for worker in self._workers:
            worker.start()
        time.sleep(1.0)
        return self

    def __exit__(self, *exc: object) -> None:
        time.sleep(1.0)
        self._stop.set()
        for worker in self._workers:
            worker.join(timeout=120)

    def failures(self) -> list[tuple[int, dict[str, Any]]]:
        return [(status, body) for _, status, body in self.answers if status != 200]


def test_triton_refuses_its_repository_api_to_anyone_but_the_gateway(stack: Stack) -> None:
    client = grpcclient.InferenceServerClient(stack.triton.grpc_url)
    with pytest.raises(InferenceServerException, match="restricted"):
        client.get_model_repository_index()
    with pytest.raises(InferenceServerException, match="restricted"):
        client.unload_model("text_classifier")
    refused = httpx.post(
        f"http://127.0.0.1:{stack.triton.http_port}/v2/repository/models/text_classifier/unload", timeout=10
    )
    assert refused.status_code >= 400
    assert client.is_model_ready("text_classifier")
    # Through the gateway, with an admin key, on the admin listener:
    index = stack.admin("GET", "/admin/repository")
    assert index.status_code == 200, index.text
    states = {m["name"]: m["state"] for m in index.json()["models"]}
    assert states["text_classifier"] == states["text_embedder"] == "READY"


def test_admin_routes_live_on_the_admin_listener_only(stack: Stack) -> None:
    main = httpx.get(f"{stack.gateway.url}/admin/repository", headers=ADMIN, timeout=10)
    assert main.status_code == 404
    assert main.headers["content-type"] == "application/problem+json"
    assert httpx.get(f"{stack.admin_url}/models", timeout=10).status_code == 404
    assert httpx.get(f"{stack.admin_url}/admin/repository", timeout=10).status_code == 401


def _build_label_set(repository: Path) -> None:
    python = ROOT / ".venv-build" / "bin" / "python"
    if not python.exists():
        pytest.fail("no model-build environment (.venv-build): run the suite with `make test`")
    build = [str(python), str(ROOT / "deploy/model-build/build.py"), "--repository", str(repository)]
    subprocess.run([*build, "text-labels"], check=True, capture_output=True, timeout=300)


def test_a_new_label_set_is_served_after_a_reload_without_losing_a_request(stack: Stack) -> None:
    labels_file = stack.repository / "text_postprocess" / "labels.txt"
    before = httpx.get(f"{stack.gateway.url}/models", timeout=30).json()
    text_model = next(m for m in before["models"] if m["name"] == "text_classifier")
    assert set(text_model["labels"]) == OLD_LABELS
    readiness: list[int] = []
    polling = threading.Event()

    def poll_readyz() -> None:  # /readyz stays honest (and 200) while the models reload
        while not polling.is_set():
            readiness.append(httpx.get(f"{stack.gateway.url}/readyz", timeout=30).status_code)
            time.sleep(0.05)

    poller = threading.Thread(target=poll_readyz)
    poller.start()
    with Traffic(stack.gateway.url, {"json": {"texts": TEXTS[:2], "top_k": 3}}) as traffic:
        labels_file.write_text(
            labels_file.read_text() + "cooking: This text is about cooking, recipes and baking.\nastronomy\n"
        )
        _build_label_set(stack.repository)
        reload_started = time.monotonic()
        reloaded = stack.admin("POST", "/admin/repository/reload")
        reload_done = time.monotonic()
        assert reloaded.status_code == 200, reloaded.text
        time.sleep(1.0)
    polling.set()
    poller.join(timeout=60)
    assert len(traffic.answers) > 20
    assert traffic.failures() == [], traffic.failures()[:3]
    assert len(readiness) > 10
    assert set(readiness) == {200}, readiness
    seen_new = []
    for sent, _, body in traffic.answers:
        labels = {p["label"] for result in body["results"] for p in result["predictions"]}
        assert labels <= OLD_LABELS | NEW_LABELS, labels
        if labels & NEW_LABELS:
            assert sent >= reload_started, "a new label before the reload"
            seen_new.append(sent)
    assert seen_new, "no answer used the new label set after the reload"
    assert max(sent for sent, _, _ in traffic.answers) > reload_done
    after = httpx.post(f"{stack.gateway.url}/classify", json={"text": COOKING, "top_k": 1}, timeout=30)
    assert after.json()["results"][0]["predictions"][0]["label"] == "cooking"
    models = httpx.get(f"{stack.gateway.url}/models", timeout=30).json()
    text_model = next(m for m in models["models"] if m["name"] == "text_classifier")
    assert set(text_model["labels"]) == OLD_LABELS | NEW_LABELS


def _versions_of(traffic: Traffic, since: float = 0.0, until: float = float("inf")) -> set[str]:
    return {body["model_version"] for sent, _, body in traffic.answers if since <= sent < until}


def _v2_version(stack: Stack, version: str = "") -> str:
    """The version that answers a /v2 inference (Triton's own HTTP client; unversioned
    unless ``version``)."""
    client = tritonhttp.InferenceServerClient(stack.gateway.url.removeprefix("http://"), network_timeout=60)
    try:
        image = tritonhttp.InferInput("IMAGE", [1, 1], "BYTES")
        image.set_data_from_numpy(np.array([[chelsea_jpeg()]], dtype=np.object_))
        k = tritonhttp.InferInput("TOP_K", [1, 1], "INT32")
        k.set_data_from_numpy(np.full((1, 1), 1, dtype=np.int32))
        answer = client.infer("image_classifier", [image, k], model_version=version).get_response()
    finally:
        client.close()
    assert answer["model_name"] == "image_classifier"
    return str(answer["model_version"])


def test_version_two_loads_beside_version_one_and_takes_traffic_when_pinned(stack: Stack) -> None:
    ensemble = stack.repository / "image_classifier"
    pinned = stack.admin("PUT", "/admin/served/image_classifier", json={"version": "1"})
    assert pinned.status_code == 200, pinned.text
    jpeg = {"content": chelsea_jpeg(), "headers": {"Content-Type": "image/jpeg"}}
    with Traffic(stack.gateway.url, jpeg) as traffic:
        (ensemble / "2").mkdir()
        config = (ensemble / "config.pbtxt").read_text()
        (ensemble / "config.pbtxt").write_text(
            config + "\nversion_policy: { specific: { versions: [1, 2] } }\n"
        )
        loaded = stack.admin("POST", "/admin/models/image_classifier/load")
        assert loaded.status_code == 200, loaded.text
        assert {(m["version"], m["state"]) for m in loaded.json()["models"]} == {
            ("1", "READY"),
            ("2", "READY"),
        }
        ready_2 = httpx.get(f"{stack.gateway.url}/v2/models/image_classifier/versions/2/ready", timeout=10)
        assert ready_2.status_code == 200
        # Triton's latest is 2, but the pin holds /v2 to 1 as it holds /classify
        assert _v2_version(stack) == "1"
        time.sleep(1.0)
        moved_at = time.monotonic()
        moved = stack.admin("PUT", "/admin/served/image_classifier", json={"version": "2"})
        settled = time.monotonic()
        assert moved.status_code == 200, moved.text
    assert _v2_version(stack) == "2"
    assert traffic.failures() == [], traffic.failures()[:3]
    assert _versions_of(traffic, until=moved_at) == {"1"}
    assert _versions_of(traffic, since=settled) == {"2"}
    models = httpx.get(f"{stack.gateway.url}/models", timeout=30).json()
    image = next(m for m in models["models"] if m["name"] == "image_classifier")
    assert image["pinned_version"] == "2"
    assert set(image["versions"]) >= {"1", "2"}
    # a canary of version 1 at 100 %: unversioned /v2 calls go to it, as /classify's do;
    # a call naming version 2 is never rerouted
    canary = stack.admin("PUT", "/admin/models/image_classifier/rollout",
                         json={"canary": {"target": "image_classifier:1", "weight": 1.0}})  # fmt: skip
    assert canary.status_code == 200, canary.text
    try:
        assert _v2_version(stack) == "1"
        assert _v2_version(stack, "2") == "2"
    finally:
        assert stack.admin("DELETE", "/admin/models/image_classifier/rollout").status_code == 200


def test_an_unloaded_model_is_reported_and_the_other_one_still_served(stack: Stack) -> None:
    unloaded = stack.admin("POST", "/admin/models/text_classifier/unload")
    assert unloaded.status_code == 200, unloaded.text
    try:
        ready = httpx.get(f"{stack.gateway.url}/readyz", timeout=30)
        assert ready.status_code == 200, ready.text
        assert ready.json()["status"] == "degraded"
        assert ready.json()["unloaded"] == ["text_classifier"]
        models = {m["name"]: m for m in httpx.get(f"{stack.gateway.url}/models", timeout=30).json()["models"]}
        assert models["text_classifier"]["state"] == "unloaded"
        assert models["image_classifier"]["state"] == "ready"
        text = httpx.post(f"{stack.gateway.url}/classify", json={"text": COOKING}, timeout=30)
        assert text.status_code == 503
        assert text.headers["content-type"] == "application/problem+json"
        image = httpx.post(
            f"{stack.gateway.url}/classify",
            content=chelsea_jpeg(),
            headers={"Content-Type": "image/jpeg"},
            timeout=30,
        )
        assert image.status_code == 200
    finally:
        loaded = stack.admin("POST", "/admin/models/text_classifier/load")
    assert loaded.status_code == 200, loaded.text
    ready = httpx.get(f"{stack.gateway.url}/readyz", timeout=30)
    assert ready.status_code == 200
    assert ready.json()["status"] == "ready"


def test_a_model_triton_cannot_load_keeps_the_loaded_one_serving(stack: Stack) -> None:
    config = stack.repository / "text_postprocess" / "config.pbtxt"
    good = config.read_text()
    config.write_text(good.replace('name: "text_postprocess"', 'name: "text_postprocess" bogus_field: 1'))
    try:
        failed = stack.admin("POST", "/admin/models/text_postprocess/reload")
        assert failed.status_code == 409, failed.text
        assert failed.json()["type"].endswith(":model-load-failed")
        assert "text_postprocess" in failed.json()["detail"]
        served = httpx.post(f"{stack.gateway.url}/classify", json={"text": COOKING}, timeout=30)
        assert served.status_code == 200, served.text
    finally:
        config.write_text(good)
