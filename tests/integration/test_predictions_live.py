"""What the models answer, on the real stack: one observation per classified input in
gateway_prediction_* (top-1 score, margin, low confidence under the model's floor), on
/classify and on /v2, labelled by the catalog's model and the version Triton answered."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from gateway.dev.tritonserver import TritonServer
from gateway.settings import Settings

from helpers.support import chelsea_jpeg
from helpers.triton_fixtures import gateway_settings

TEXTS = [
    "The striker scored twice in the final.",
    "Parliament passed the budget after a long debate.",
    "The new phone has a faster chip and a brighter screen.",
    "Shares fell after the company missed its earnings forecast.",
    "Doctors recommend a short walk after every meal.",
    "The film won three awards at the festival.",
    "The goalkeeper saved a penalty in extra time.",
    "The central bank raised interest rates again.",
]


def samples(client: httpx.Client) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(client.get("/metrics").text):
        if family.name.startswith("gateway_prediction"):
            for sample in family.samples:
                found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def count(found: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, model: str) -> float:
    return sum(v for (n, labels), v in found.items() if n == name and ("model", model) in labels)


def test_every_classified_input_is_observed_on_classify_and_v2(
    triton: TritonServer, serve_gateway: Callable[[Settings], httpx.Client]
) -> None:
    # every text is "low confidence" for a floor of 1.0; the image model keeps the default 0.5
    client = serve_gateway(
        gateway_settings(triton, predictions={"confidence_floors": {"text_classifier": 1.0}})
    )
    before = samples(client)
    texts = client.post("/classify", json={"texts": TEXTS})
    assert texts.status_code == 200, texts.text
    image = client.post("/classify", content=chelsea_jpeg(), headers={"content-type": "image/jpeg"})
    assert image.status_code == 200, image.text
    oip = client.post(
        "/v2/models/text_classifier/infer",
        json={
            "inputs": [
                {"name": "TEXT", "shape": [2, 1], "datatype": "BYTES", "data": TEXTS[:2]},
                {"name": "TOP_K", "shape": [2, 1], "datatype": "INT32", "data": [3, 3]},
            ]
        },
    )
    assert oip.status_code == 200, oip.text
    after = samples(client)

    def grew(name: str, model: str) -> float:
        return count(after, name, model) - count(before, name, model)

    assert grew("gateway_prediction_top1_score_count", "text_classifier") == 8 + 2
    assert grew("gateway_prediction_margin_count", "text_classifier") == 8 + 2
    assert grew("gateway_prediction_low_confidence_total", "text_classifier") == 8 + 2
    assert grew("gateway_prediction_top1_score_count", "image_classifier") == 1
    # the top-1 score observed is the one answered
    top1 = texts.json()["results"][0]["predictions"][0]["score"]
    assert 0 < top1 <= 1
    versions = {
        dict(labels)["version"] for (name, labels) in after if name.startswith("gateway_prediction_top1")
    }
    assert versions == {"1"}


def test_the_prediction_log_records_what_triton_answered(
    triton: TritonServer, serve_gateway: Callable[[Settings], httpx.Client], tmp_path: Path
) -> None:
    """Every answer sampled to a file sink: the version Triton answered, the labels it gave,
    the input's digest (never the input)."""
    import hashlib
    import json
    import time

    target = tmp_path / "log.jsonl"
    client = serve_gateway(
        gateway_settings(triton, prediction_log={"url": f"file://{target}", "sample_rate": 1.0})
    )
    answer = client.post("/classify", content=chelsea_jpeg(), headers={"content-type": "image/jpeg"})
    assert answer.status_code == 200
    deadline = time.monotonic() + 10
    # the sink opens the file, then writes its line: wait for a whole line, not the file
    while not (target.exists() and target.read_text().endswith("\n")):
        assert time.monotonic() < deadline, "nothing logged"
        time.sleep(0.05)
    [record] = [json.loads(line) for line in target.read_text().splitlines()]
    assert record["request_id"] == answer.headers["x-request-id"]
    assert (record["model"], record["version"], record["status"]) == ("image_classifier", "1", 200)
    assert record["inputs"] == [
        {"sha256": hashlib.sha256(chelsea_jpeg()).hexdigest(), "size": len(chelsea_jpeg()), "data": None}
    ]
    answered = [p["label"] for p in answer.json()["results"][0]["predictions"]]
    assert [p["label"] for p in record["predictions"][0]] == answered
