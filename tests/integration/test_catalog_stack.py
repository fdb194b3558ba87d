"""The model catalog against the real stack (`triton-gateway local`, admin keys on):

- two image classifiers and two text classifiers served at once (the second ones share the
  first ones' networks, with labels of their own), each answering with its own labels;
- a new ensemble dropped into the repository and loaded through /admin answers on
  /models/NAME/classify at once, no restart; after an unload it is a problem at once,
  and the requests in flight while it goes are answered 200 or 503, none lost;
- `triton-gateway add-model` on the running stack: EfficientNet-Lite2 from the model
  build's ONNX served beside Lite0 (curl-like requests and tritonclient through /v2), a
  network whose channel order and layout differ from Lite0's, a text classifier, and a
  refused add that leaves nothing Triton could load.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as tritonhttp
from support import chelsea_jpeg, coffee_png, encode, load_script, tiny_classifier_onnx
from triton_fixtures import REPOSITORY

from gateway.auth import hash_key
from gateway.tritonserver import free_port

CATS = {"tiger cat", "tabby", "Egyptian cat"}
COFFEE = {"espresso", "cup"}
ROOT = Path(__file__).resolve().parents[2]
LITE2_ONNX = ROOT / "build" / "examples" / "efficientnet-lite2.onnx"  # make models
SENTIMENTS = {
    "positive": "Someone is pleased, happy and satisfied: this is good.",
    "negative": "Someone is unhappy, disappointed or angry: this is bad.",
}
ADMIN = {"Authorization": "Bearer ops-secret"}
JPEG = {"content-type": "image/jpeg"}


def _renamed(source: Path, target: Path, renames: dict[str, str]) -> None:
    """A copy of a model directory under another name, its config's names replaced."""
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", "*.stamp", "*.onnx"))
    config = (source / "config.pbtxt").read_text()
    for old, new in renames.items():
        config = re.sub(rf'"{re.escape(old)}"', f'"{new}"', config)
    (target / "config.pbtxt").write_text(config)


def add_second_classifiers(repository: Path) -> None:
    """image_classifier_upper: the same network, its labels upper-cased (its own
    postprocess); text_sentiment: the same encoder, a label set of its own, written by
    `triton-gateway add-model`."""
    _renamed(
        REPOSITORY / "image_postprocess",
        repository / "image_postprocess_upper",
        {"image_postprocess": "image_postprocess_upper"},
    )
    labels = (REPOSITORY / "image_postprocess" / "labels.txt").read_text().upper()
    (repository / "image_postprocess_upper" / "labels.txt").write_text(labels)
    _renamed(
        REPOSITORY / "image_classifier",
        repository / "image_classifier_upper",
        {"image_classifier": "image_classifier_upper", "image_postprocess": "image_postprocess_upper"},
    )

    labels = repository.parent / "sentiment.txt"
    labels.write_text("".join(f"{name}: {prompt}\n" for name, prompt in SENTIMENTS.items()))
    add_model("text_sentiment", labels, repository)


def add_model(name: str, labels: Path, repository: Path, *image: str) -> subprocess.CompletedProcess[str]:
    """The real command, as a user runs it (a text classifier unless ``image`` options are
    given); asserts it succeeded unless ``image`` asks for a refusal with "--expect-refusal"."""
    refusal = "--expect-refusal" in image
    options = [option for option in image if option != "--expect-refusal"]
    task = "image-classification" if options else "text-classification"
    command = [sys.executable, "-m", "gateway", "add-model", name, "--task", task,
               "--labels", str(labels), "--repository", str(repository), *options]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    assert (done.returncode != 0) == refusal, done.stderr
    return done


@dataclass
class LocalStack:
    url: str
    admin_url: str
    repository: Path
    log: Path

    def admin(self, method: str, path: str) -> httpx.Response:
        return httpx.request(method, f"{self.admin_url}{path}", headers=ADMIN, timeout=300)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, triton_python_env: Path) -> Iterator[LocalStack]:
    root = tmp_path_factory.mktemp("catalog")
    repository = root / "repository"
    shutil.copytree(
        REPOSITORY, repository, symlinks=True, ignore=shutil.ignore_patterns("__pycache__", "*.tmp")
    )
    add_second_classifiers(repository)
    keys = root / "admin-keys"
    keys.write_text(f"ops {hash_key('ops-secret')}\n")
    port, admin_port = free_port(), free_port()
    environment = {
        **os.environ,
        "GATEWAY_ADMIN__KEYS_FILE": str(keys),
        "GATEWAY_ADMIN__PORT": str(admin_port),
    }
    command = [
        sys.executable, "-m", "gateway", "local",
        "--port", str(port),
        "--triton-env", str(triton_python_env),
        "--model-repository", str(repository),
        "--workdir", str(root / "triton"),
    ]  # fmt: skip
    log = root / "local.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=environment)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            assert process.poll() is None, log.read_text()[-3000:]
            try:
                if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        else:
            pytest.fail(f"the local stack did not get ready: {log.read_text()[-3000:]}")
        yield LocalStack(url, f"http://127.0.0.1:{admin_port}", repository, log)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _top(response: httpx.Response) -> list[str]:
    assert response.status_code == 200, response.text
    return [result["predictions"][0]["label"] for result in response.json()["results"]]


def test_two_image_and_two_text_classifiers_each_answer_with_their_own_labels(stack: LocalStack) -> None:
    models = {m["name"]: m for m in httpx.get(f"{stack.url}/models", timeout=30).json()["models"]}
    assert set(models) == {"image_classifier", "image_classifier_upper", "text_classifier", "text_sentiment"}
    assert models["text_sentiment"]["labels"] == list(SENTIMENTS)
    assert models["image_classifier_upper"]["task"] == "image-classification"
    assert not models["image_classifier_upper"]["default"]
    jpeg = chelsea_jpeg()
    (first,) = _top(
        httpx.post(f"{stack.url}/models/image_classifier/classify", content=jpeg, headers=JPEG, timeout=60)
    )
    (upper,) = _top(
        httpx.post(
            f"{stack.url}/models/image_classifier_upper/classify", content=jpeg, headers=JPEG, timeout=60
        )
    )
    assert first in CATS
    assert upper == first.upper()
    (default,) = _top(httpx.post(f"{stack.url}/classify", content=jpeg, headers=JPEG, timeout=60))
    assert default == first
    texts = {"texts": ["The striker scored twice in the final.", "I love this, it made my day wonderful!"]}
    topics = _top(httpx.post(f"{stack.url}/models/text_classifier/classify", json=texts, timeout=60))
    feelings = _top(httpx.post(f"{stack.url}/models/text_sentiment/classify", json=texts, timeout=60))
    assert topics[0] == "sports"
    assert set(feelings) <= set(SENTIMENTS)
    assert feelings[1] == "positive"
    # the /v2 routes serve the same catalog
    v2 = httpx.get(f"{stack.url}/v2/models/text_sentiment", timeout=30)
    assert v2.status_code == 200, v2.text


def test_a_model_dropped_in_and_loaded_is_served_at_once_and_gone_at_once(stack: LocalStack) -> None:
    name = "image_classifier_copy"
    _renamed(REPOSITORY / "image_classifier", stack.repository / name, {"image_classifier": name})
    route = f"{stack.url}/models/{name}/classify"
    assert httpx.post(route, content=chelsea_jpeg(), headers=JPEG, timeout=30).status_code == 404
    loaded = stack.admin("POST", f"/admin/models/{name}/load")
    assert loaded.status_code == 200, loaded.text
    answered_at = time.monotonic()
    while (
        response := httpx.post(route, content=chelsea_jpeg(), headers=JPEG, timeout=30)
    ).status_code != 200:
        assert time.monotonic() - answered_at < 2.0, response.text
        time.sleep(0.05)
    assert _top(response)[0] in CATS

    # Unload while clients keep sending: every answer is 200 or a 503/404 problem.
    outcomes: list[Any] = []
    stop = threading.Event()

    def client() -> None:
        with httpx.Client(timeout=30) as http:
            while not stop.is_set():
                try:
                    answer = http.post(route, content=chelsea_jpeg(), headers=JPEG)
                except httpx.HTTPError as exc:  # a lost request
                    outcomes.append(exc)
                    continue
                outcomes.append((answer.status_code, answer.headers.get("content-type")))

    threads = [threading.Thread(target=client) for _ in range(4)]
    for thread in threads:
        thread.start()
    time.sleep(1.0)
    unloaded = stack.admin("POST", f"/admin/models/{name}/unload")
    assert unloaded.status_code == 200, unloaded.text
    after = httpx.post(route, content=chelsea_jpeg(), headers=JPEG, timeout=30)
    time.sleep(0.5)
    stop.set()
    for thread in threads:
        thread.join(timeout=60)
    assert after.status_code in (404, 503), after.text
    assert after.headers["content-type"] == "application/problem+json"
    lost = [o for o in outcomes if isinstance(o, Exception)]
    assert not lost, lost[:3]
    statuses = {status for status, _ in outcomes}
    assert 200 in statuses
    assert statuses <= {200, 404, 503}, statuses
    assert all(kind == "application/problem+json" for status, kind in outcomes if status != 200)
    # the default models were never touched, and still answer once the breaker's probe ran
    # (Triton's strict readiness is false after any unload: that opened the circuit once)
    time.sleep(1.5)
    assert httpx.get(f"{stack.url}/readyz", timeout=30).json()["status"] == "ready"
    assert (
        _top(httpx.post(f"{stack.url}/classify", content=chelsea_jpeg(), headers=JPEG, timeout=30))[0] in CATS
    )


def test_a_text_classifier_added_by_the_command_on_a_running_stack(stack: LocalStack) -> None:
    labels = stack.repository.parent / "tickets.txt"
    labels.write_text("billing: a question about an invoice, a payment or a refund\n"
                      "outage: a service that is down or not working\n")  # fmt: skip
    add_model("tickets", labels, stack.repository)
    loaded = stack.admin("POST", "/admin/models/tickets/load")
    assert loaded.status_code == 200, loaded.text
    texts = {"texts": ["I was charged twice for my invoice, please refund me.", "The website is down again."]}
    assert _top(httpx.post(f"{stack.url}/models/tickets/classify", json=texts, timeout=60)) == [
        "billing",
        "outage",
    ]
    models = {m["name"]: m for m in httpx.get(f"{stack.url}/models", timeout=30).json()["models"]}
    assert models["tickets"]["labels"] == ["billing", "outage"]
    assert stack.admin("POST", "/admin/models/tickets/unload?dependents=true").status_code == 200
    removed = subprocess.run(
        [sys.executable, "-m", "gateway", "remove-model", "tickets", "--repository", str(stack.repository)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert removed.returncode == 0, removed.stderr
    assert httpx.post(f"{stack.url}/models/tickets/classify", json=texts, timeout=30).status_code in (
        404,
        503,
    )


# Written for this test; the sentiment set is the one add-model wrote at start (SENTIMENTS).
FEELINGS = [
    ("I love this phone, it works beautifully and makes me happy.", "positive"),
    ("What a wonderful surprise, thank you so much!", "positive"),
    ("The service was excellent and the staff were friendly.", "positive"),
    ("Best holiday we have ever had, everything was perfect.", "positive"),
    ("I am thrilled with the results, great job everyone.", "positive"),
    ("This made my day, I could not be happier.", "positive"),
    ("This is the worst purchase I have ever made, it broke in a day.", "negative"),
    ("I am furious, nobody answered my complaint for weeks.", "negative"),
    ("The food was cold and disgusting and the waiter was rude.", "negative"),
    ("I hate waiting in this queue, it is a terrible waste of time.", "negative"),
    ("Very disappointed, the product does not work at all.", "negative"),
    ("Awful experience, I will never come back here again.", "negative"),
]


def test_the_added_sentiment_classifier_gets_written_sentences_right(stack: LocalStack) -> None:
    texts = {"texts": [text for text, _ in FEELINGS], "top_k": 1}
    got = _top(httpx.post(f"{stack.url}/models/text_sentiment/classify", json=texts, timeout=60))
    right = sum(label == want for label, (_, want) in zip(got, FEELINGS, strict=True))
    print(f"sentiment: {right}/{len(FEELINGS)} right")
    assert right >= 0.9 * len(FEELINGS), list(zip(got, FEELINGS, strict=True))


def add_lite2(stack: LocalStack) -> None:
    """EfficientNet-Lite2 added by the command and loaded through /admin (once)."""
    if (stack.repository / "lite2").exists():
        return
    if not LITE2_ONNX.exists():
        pytest.fail(f"{LITE2_ONNX} is missing: `make models` exports it")
    labels = REPOSITORY / "image_postprocess" / "labels.txt"  # the same 1000 ImageNet classes
    add_model(
        "lite2", labels, stack.repository, "--onnx", str(LITE2_ONNX), "--normalize", "efficientnet-lite"
    )
    loaded = stack.admin("POST", "/admin/models/lite2/load")
    assert loaded.status_code == 200, loaded.text


def test_lite2_added_by_the_command_on_a_running_stack_answers_beside_lite0(stack: LocalStack) -> None:
    add_lite2(stack)
    models = {m["name"]: m for m in httpx.get(f"{stack.url}/models", timeout=30).json()["models"]}
    assert models["lite2"]["task"] == "image-classification"
    assert models["lite2"]["state"] == "ready"
    steps = [step["name"] for step in models["lite2"]["composing_models"]]
    assert sorted(steps) == ["lite2_model", "lite2_postprocess", "lite2_preprocess"]
    photos = {"cat": (chelsea_jpeg(), "image/jpeg", CATS), "coffee": (coffee_png(), "image/png", COFFEE)}
    for model in ("image_classifier", "lite2"):
        for name, (photo, media_type, expected) in photos.items():
            response = httpx.post(
                f"{stack.url}/models/{model}/classify",
                content=photo,
                headers={"content-type": media_type},
                timeout=60,
            )
            (label,) = _top(response)
            print(f"{model}: {name} -> {label}")
            assert label in expected, (model, name, label)
            assert response.json()["model"] == model

    # Triton's own client through the gateway's /v2, as the README shows it
    client = tritonhttp.InferenceServerClient(stack.url.removeprefix("http://"), network_timeout=60)
    try:
        image = tritonhttp.InferInput("IMAGE", [1, 1], "BYTES")
        image.set_data_from_numpy(np.array([[chelsea_jpeg()]], dtype=np.object_))
        top_k = tritonhttp.InferInput("TOP_K", [1, 1], "INT32")
        top_k.set_data_from_numpy(np.array([[3]], dtype=np.int32))
        result = client.infer("lite2", [image, top_k])
    finally:
        client.close()
    labels_out = [label.decode() for label in result.as_numpy("LABELS")[0]]
    assert len(labels_out) == 3
    assert labels_out[0] in CATS


def test_channel_order_and_layout_of_an_added_network_reach_it(stack: LocalStack) -> None:
    """A network that takes BGR, channels last, at a size given on the command line: its
    logits are its input's channel means, so a red photo is class "red" only if the
    preprocess put red where the network expects it."""
    network = tiny_classifier_onnx(stack.repository.parent / "bgr.onnx", (None, None, None, 3))
    labels = stack.repository.parent / "bgr-labels.txt"
    labels.write_text("blue\ngreen\nred\n")  # the network's channel order
    add_model("colours", labels, stack.repository, "--onnx", str(network), "--channel-order", "BGR",
              "--input-size", "16x16", "--mean", "0,0,0", "--std", "255,255,255")  # fmt: skip
    assert stack.admin("POST", "/admin/models/colours/load").status_code == 200
    for colour, rgb in {"red": (255, 0, 0), "green": (0, 200, 0), "blue": (0, 0, 255)}.items():
        photo = encode(np.full((40, 60, 3), rgb, dtype=np.uint8), "PNG")
        response = httpx.post(
            f"{stack.url}/models/colours/classify",
            content=photo,
            headers={"content-type": "image/png"},
            params={"top_k": 3},
            timeout=60,
        )
        assert _top(response) == [colour]
        top = response.json()["results"][0]["predictions"][0]
        assert top["class_id"] == ["blue", "green", "red"].index(colour)


def test_a_refused_add_leaves_nothing_for_triton_to_load(stack: LocalStack) -> None:
    network = tiny_classifier_onnx(stack.repository.parent / "three.onnx")
    labels = stack.repository.parent / "four-labels.txt"
    labels.write_text("a\nb\nc\nd\n")
    before = sorted(path.name for path in stack.repository.iterdir())
    refused = add_model("four", labels, stack.repository, "--onnx", str(network), "--normalize", "inception",
                        "--expect-refusal")  # fmt: skip
    assert "has 4 labels" in refused.stderr
    assert "has 3 classes" in refused.stderr
    assert sorted(path.name for path in stack.repository.iterdir()) == before
    load = stack.admin("POST", "/admin/models/four/load")
    assert load.status_code in (404, 409), load.text
    assert load.headers["content-type"] == "application/problem+json"
    names = {m["name"] for m in httpx.get(f"{stack.url}/models", timeout=30).json()["models"]}
    assert "four" not in names


def test_the_gpu_smoke_compares_an_added_model_with_its_cpu_reference(
    stack: LocalStack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The walkthrough's last step: a reference written on the CPU stack serving Lite2,
    then the smoke's agreement check for Lite2 against it (here the same stack: PASS; a
    reference it disagrees with: FAIL)."""
    add_lite2(stack)
    smoke = load_script(ROOT / "deploy" / "gpu-smoke" / "smoke.py", "smoke")
    reference = tmp_path / "reference.json"
    assert smoke.main(["--url", stack.url, "--write-reference", "--reference", str(reference)]) == 0
    written = json.loads(reference.read_text())
    assert written["models"]["lite2"][0][0] in CATS  # chelsea first
    assert smoke.main(["--url", stack.url, "--reference", str(reference)]) == 0
    assert "PASS  lite2: top-1 agrees with the CPU twin  (7/7" in capsys.readouterr().out
    written["models"]["lite2"][0] = ["toaster", 0.9]
    reference.write_text(json.dumps(written))
    assert smoke.main(["--url", stack.url, "--reference", str(reference)]) == 1
    out = capsys.readouterr().out
    assert "FAIL  lite2: top-1 agrees with the CPU twin" in out
    assert "toaster 0.900 on the CPU twin" in out
