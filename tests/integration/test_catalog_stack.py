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

import asyncio
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as tritonhttp

from helpers.local_stack import ADMIN, JPEG, SENTIMENTS, LocalStack, add_model, renamed
from helpers.support import chelsea_jpeg, coffee_png, encode, load_script, tiny_classifier_onnx
from helpers.triton_fixtures import REPOSITORY

pytestmark = pytest.mark.alone  # it times or loads the machine: run with nothing beside it

CATS = {"tiger cat", "tabby", "Egyptian cat"}
COFFEE = {"espresso", "cup"}
ROOT = Path(__file__).resolve().parents[2]
LITE2_ONNX = ROOT / "build" / "examples" / "efficientnet-lite2.onnx"  # make models


@pytest.fixture
def stack(local_stack: LocalStack) -> LocalStack:
    """The session's local stack (tests/integration/conftest.py), with this module's
    second classifiers added at its start."""
    return local_stack


def _top(response: httpx.Response) -> list[str]:
    assert response.status_code == 200, response.text
    return [result["predictions"][0]["label"] for result in response.json()["results"]]


def test_two_image_and_two_text_classifiers_each_answer_with_their_own_labels(stack: LocalStack) -> None:
    models = {m["name"]: m for m in httpx.get(f"{stack.url}/models", timeout=30).json()["models"]}
    # the stack is the session's: test_own_classifiers adds its models to it when run first
    assert {"image_classifier", "image_classifier_upper", "text_classifier", "text_sentiment"} <= set(models)
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
    renamed(REPOSITORY / "image_classifier", stack.repository / name, {"image_classifier": name})
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
    served = {m["name"]: m for m in stack.admin("GET", "/admin/served").json()}
    steps = [step["name"] for step in served["lite2"]["composing_models"]]
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


# --- rollouts: canary and shadow between real models ------------------------------------

PHOTOS = (
    "chelsea",
    "coffee",
    "astronaut",
    "rocket",
    "immunohistochemistry",
    "hubble_deep_field",
    "colorwheel",
)


def photo_jpeg(name: str) -> bytes:
    from skimage import data

    pixels = np.asarray(getattr(data, name)())[..., :3]
    return encode(np.ascontiguousarray(pixels), "JPEG", quality=90)


def rollout_state(stack: LocalStack, model: str) -> dict[str, Any]:
    answer = stack.admin("GET", f"/admin/models/{model}/rollout")
    assert answer.status_code == 200, answer.text
    state: dict[str, Any] = answer.json()
    return state


def set_rollout(stack: LocalStack, model: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.put(f"{stack.admin_url}/admin/models/{model}/rollout", json=body, headers=ADMIN, timeout=60)


def test_a_shadow_reports_the_agreement_the_two_models_show(stack: LocalStack) -> None:
    """Lite0 (the default image model) shadowed by Lite2 at 100 % over seven photos: the
    agreement the gateway reports is what the two models' own answers give."""
    add_lite2(stack)
    refused = set_rollout(stack, "image_classifier", {"shadow": {"target": "text_sentiment", "sample": 1.0}})
    assert refused.status_code == 409, refused.text  # another task
    assert (
        set_rollout(stack, "image_classifier", {"shadow": {"target": "nothing", "sample": 1}}).status_code
        == 409
    )
    started = set_rollout(stack, "image_classifier", {"shadow": {"target": "lite2", "sample": 1.0}})
    assert started.status_code == 200, started.text
    served, shadowed = [], []
    for name in PHOTOS:
        jpeg = photo_jpeg(name)
        answer = httpx.post(f"{stack.url}/classify", content=jpeg, headers=JPEG, timeout=60)
        assert answer.json()["model"] == "image_classifier"  # the client hears the primary only
        served.append(_top(answer)[0])
        shadowed.append(
            _top(httpx.post(f"{stack.url}/models/lite2/classify", content=jpeg, headers=JPEG, timeout=60))[0]
        )
    expected = sum(a == b for a, b in zip(served, shadowed, strict=True))
    deadline = time.monotonic() + 30
    while (shadow := rollout_state(stack, "image_classifier")["statistics"]["shadow"])["agree"] + shadow[
        "disagree"
    ] < len(PHOTOS):
        assert time.monotonic() < deadline, shadow
        time.sleep(0.2)
    print(f"shadow Lite0 -> Lite2: {shadow}; the models' own answers agree on {expected}/{len(PHOTOS)}")
    assert shadow["agree"] == expected
    assert shadow["disagree"] == len(PHOTOS) - expected
    assert shadow["error"] == shadow["dropped"] == 0
    assert shadow["agreement"] == pytest.approx(expected / len(PHOTOS))
    metrics = httpx.get(f"{stack.url}/metrics", timeout=10).text
    assert (
        f'gateway_shadow_comparisons_total{{model="image_classifier",outcome="agree",target="lite2"}} {expected}.0'
        in metrics
    )
    assert stack.admin("DELETE", "/admin/models/image_classifier/rollout").status_code == 200
    assert stack.admin("GET", "/admin/models/image_classifier/rollout").status_code == 404


REQUESTS_EACH = 10  # a client on two arms shows within a few requests (each is a coin toss at 0.3)


def test_a_canary_sticks_to_each_client(stack: LocalStack) -> None:
    """0.3 of 50 clients (X-Rollout-Key), 10 requests each: every client always on one arm,
    and about 30 % of them on the target (15 expected, binomial sd 3.2)."""
    started = set_rollout(stack, "text_classifier", {"canary": {"target": "text_sentiment", "weight": 0.3}})
    assert started.status_code == 200, started.text
    seen: dict[int, set[str]] = {client: set() for client in range(50)}

    async def client(number: int) -> None:
        async with httpx.AsyncClient(base_url=stack.url, timeout=60) as http:
            for i in range(REQUESTS_EACH):
                answer = await http.post(
                    "/classify",
                    json={"text": f"Message {i} from client {number}."},
                    headers={"X-Rollout-Key": f"client-{number}"},
                )
                assert answer.status_code == 200, answer.text
                seen[number].add(answer.json()["model"])

    async def everyone() -> None:
        clients = list(range(50))
        for start in range(0, 50, 10):  # ten clients at a time
            await asyncio.gather(*(client(n) for n in clients[start : start + 10]))

    asyncio.run(everyone())
    assert all(len(models) == 1 for models in seen.values()), seen
    on_target = sum(models == {"text_sentiment"} for models in seen.values())
    print(f"canary 0.3: {on_target} of 50 clients on the target")
    assert abs(on_target - 15) <= 3 * 3.24
    arms = rollout_state(stack, "text_classifier")["statistics"]["arms"]
    assert arms["canary"]["requests"] == REQUESTS_EACH * on_target
    assert arms["primary"]["requests"] == REQUESTS_EACH * (50 - on_target)
    assert stack.admin("POST", "/admin/models/text_classifier/rollout/rollback").status_code == 200


def test_a_canary_of_another_model_does_not_answer_on_v2(stack: LocalStack) -> None:
    """/v2 (and the gRPC door: the same Dispatcher.infer_request) under a canary of another
    model at 100 %: /classify goes to the canary, /v2 stays on the model it names (another
    model would answer for one the client did not ask for). A version canary does apply:
    tests/integration/test_model_control.py."""
    started = set_rollout(stack, "text_classifier", {"canary": {"target": "text_sentiment", "weight": 1.0}})
    assert started.status_code == 200, started.text
    body = {
        "inputs": [
            {"name": "TEXT", "shape": [1, 1], "datatype": "BYTES", "data": ["Thank you, that was quick."]},
            {"name": "TOP_K", "shape": [1, 1], "datatype": "INT32", "data": [1]},
        ]
    }
    try:
        classified = httpx.post(f"{stack.url}/classify", json={"text": "Thank you."}, timeout=60)
        assert classified.json()["model"] == "text_sentiment"
        oip = httpx.post(f"{stack.url}/v2/models/text_classifier/infer", json=body, timeout=60)
        assert oip.status_code == 200, oip.text
        assert oip.json()["model_name"] == "text_classifier"
    finally:
        assert stack.admin("POST", "/admin/models/text_classifier/rollout/rollback").status_code == 200


SLOW_MODEL = """
import time
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(1.0)
        responses = []
        for request in requests:
            rows = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy().shape[0]
            labels = np.array([[b"slow", b"slower"]] * rows, dtype=np.object_)
            scores = np.array([[0.6, 0.4]] * rows, dtype=np.float32)
            ids = np.array([[0, 1]] * rows, dtype=np.int32)
            truncated = np.zeros((rows, 1), dtype=bool)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("LABELS", labels),
                pb_utils.Tensor("SCORES", scores), pb_utils.Tensor("CLASS_IDS", ids),
                pb_utils.Tensor("TRUNCATED", truncated)]))
        return responses
"""
SLOW_CONFIG = """name: "slow_text"
backend: "python"
max_batch_size: 64
input [ { name: "TEXT" data_type: TYPE_STRING dims: [ 1 ] }, { name: "TOP_K" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "LABELS" data_type: TYPE_STRING dims: [ -1 ] }, { name: "SCORES" data_type: TYPE_FP32 dims: [ -1 ] },
         { name: "CLASS_IDS" data_type: TYPE_INT32 dims: [ -1 ] }, { name: "TRUNCATED" data_type: TYPE_BOOL dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
parameters [ { key: "gateway_task" value: { string_value: "text-classification" } },
             { key: "max_top_k" value: { string_value: "2" } } ]
"""


def test_a_slow_shadow_never_slows_the_primary_and_is_dropped_past_its_cap(stack: LocalStack) -> None:
    (stack.repository / "slow_text" / "1").mkdir(parents=True)
    (stack.repository / "slow_text" / "config.pbtxt").write_text(SLOW_CONFIG)
    (stack.repository / "slow_text" / "1" / "model.py").write_text(SLOW_MODEL)
    assert stack.admin("POST", "/admin/models/slow_text/load").status_code == 200

    def p50(count: int) -> float:
        times = []
        with httpx.Client(base_url=stack.url, timeout=60) as http:
            for i in range(count):
                began = time.monotonic()
                answer = http.post("/classify", json={"text": f"Is this slow? Question {i}."})
                times.append(time.monotonic() - began)
                assert answer.status_code == 200, answer.text
                assert answer.json()["model"] == "text_classifier"
        return sorted(times)[count // 2]

    before = p50(30)
    assert (
        set_rollout(stack, "text_classifier", {"shadow": {"target": "slow_text", "sample": 1.0}}).status_code
        == 200
    )
    during = p50(30)
    shadow = rollout_state(stack, "text_classifier")["statistics"]["shadow"]
    print(f"primary p50 {before * 1000:.1f} ms without the shadow, {during * 1000:.1f} ms with it; {shadow}")
    assert during < before + 0.25  # the shadow sleeps 1 s: awaited, it would add that to every request
    assert shadow["dropped"] > 0  # past its cap of 4 shadows at once
    assert shadow["error"] == 0
    # the ones that ran were compared once done (the slow model says "slow": a disagreement)
    deadline = time.monotonic() + 10
    while (shadow := rollout_state(stack, "text_classifier")["statistics"]["shadow"])["dropped"] + shadow[
        "disagree"
    ] < 30:
        assert time.monotonic() < deadline, shadow
        time.sleep(0.2)
    assert shadow["agree"] == shadow["error"] == 0
    assert stack.admin("DELETE", "/admin/models/text_classifier/rollout").status_code == 200


def test_weights_changed_and_a_promotion_under_traffic_lose_nothing(stack: LocalStack) -> None:
    outcomes: list[tuple[int, str]] = []
    stop = threading.Event()

    def client(number: int) -> None:
        with httpx.Client(base_url=stack.url, timeout=60) as http:
            i = 0
            while not stop.is_set():
                i += 1
                try:
                    answer = http.post(
                        "/classify", json={"text": f"Client {number} says hello {i}."},
                        headers={"X-Rollout-Key": f"c{number}-{i}"},
                    )  # fmt: skip
                except httpx.HTTPError as exc:
                    outcomes.append((-1, repr(exc)))
                    continue
                outcomes.append((answer.status_code, answer.json().get("model", "")))

    threads = [threading.Thread(target=client, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    try:
        for weight in (0.2, 0.6, 1.0):
            answer = set_rollout(
                stack, "text_classifier", {"canary": {"target": "text_sentiment", "weight": weight}}
            )
            assert answer.status_code == 200, answer.text
            time.sleep(1.0)
        promoted = stack.admin("POST", "/admin/models/text_classifier/rollout/promote")
        assert promoted.status_code == 200, promoted.text
        assert promoted.json()["change"] == "default"
        time.sleep(1.0)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
    statuses = {status for status, _ in outcomes}
    assert statuses == {200}, [o for o in outcomes if o[0] != 200][:5]
    assert outcomes[-1][1] == "text_sentiment"  # promoted: the default text model now
    assert {model for _, model in outcomes} == {"text_classifier", "text_sentiment"}
    ready = httpx.get(f"{stack.url}/readyz", timeout=10)
    assert ready.status_code == 200, ready.text
    # and back, the same way, so the module's other tests find the shipped default
    back = set_rollout(stack, "text_sentiment", {"canary": {"target": "text_classifier", "weight": 1.0}})
    assert back.status_code == 200, back.text
    assert stack.admin("POST", "/admin/models/text_sentiment/rollout/promote").status_code == 200
    answer = httpx.post(f"{stack.url}/classify", json={"text": "The striker scored twice."}, timeout=60)
    assert answer.json()["model"] == "text_classifier"
