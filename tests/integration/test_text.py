"""Zero-shot text classification through the gateway and the real Triton text ensemble."""

from __future__ import annotations

import time

import httpx
import pytest

# Written for this suite: four or more plain sentences per default label.
SENTENCES: dict[str, list[str]] = {
    "sports": [
        "The striker scored twice in the final.",
        "The home team won the championship after a penalty shootout.",
        "She broke the world record in the 100 metres sprint.",
        "The coach benched the quarterback for the second half.",
        "The tennis match went to a fifth set tiebreak.",
    ],
    "politics": [
        "The senate passed the bill after a long debate.",
        "The prime minister called an early election.",
        "Voters head to the polls to choose a new president.",
        "The opposition party criticised the government's immigration policy.",
    ],
    "technology": [
        "The new smartphone ships with a faster processor and more memory.",
        "Engineers released an open-source framework for training neural networks.",
        "The software update fixes a security vulnerability in the browser.",
        "The company unveiled a quantum computer with more qubits.",
    ],
    "business": [
        "The company's quarterly revenue beat analysts' expectations.",
        "Shares fell after the retailer cut its profit forecast.",
        "The two banks agreed to a merger worth ten billion dollars.",
        "The startup raised a new round of venture capital funding.",
    ],
    "health": [
        "Regular exercise lowers the risk of heart disease.",
        "Doctors recommend getting a flu vaccine every autumn.",
        "The hospital opened a new clinic for diabetes patients.",
        "A balanced diet and enough sleep strengthen the immune system.",
    ],
    "entertainment": [
        "The film won the award for best picture at the ceremony.",
        "The band announced a world tour to promote their new album.",
        "The actress will star in a new television series next year.",
        "Fans lined up for the premiere of the superhero movie.",
    ],
}


def classify(http: httpx.Client, body: dict) -> httpx.Response:  # type: ignore[type-arg]
    return http.post("/classify", json=body)


def top(response: httpx.Response, index: int = 0) -> str:
    assert response.status_code == 200, response.text
    return str(response.json()["results"][index]["predictions"][0]["label"])


def test_the_striker_scored_is_sports(http: httpx.Client) -> None:
    response = classify(http, {"text": "The striker scored twice in the final."})
    body = response.json()
    assert body["model"] == "text_classifier"
    assert body["model_version"] == "1"
    predictions = body["results"][0]["predictions"]
    assert predictions[0]["label"] == "sports"
    assert len(predictions) == 5
    assert body["results"][0]["truncated"] is False
    scores = [p["score"] for p in predictions]
    assert scores == sorted(scores, reverse=True)
    assert sum(scores) <= 1.0 + 1e-5


def test_accuracy_on_the_default_labels(http: httpx.Client) -> None:
    texts = [text for sentences in SENTENCES.values() for text in sentences]
    expected = [label for label, sentences in SENTENCES.items() for _ in sentences]
    assert len(texts) >= 24
    half = len(texts) // 2  # two requests, so batches of different lengths are exercised too
    results = classify(http, {"texts": texts[:half], "top_k": 1}).json()["results"]
    results += classify(http, {"texts": texts[half:], "top_k": 1}).json()["results"]
    got = [r["predictions"][0]["label"] for r in results]
    misses = [
        (text, want, have) for text, want, have in zip(texts, expected, got, strict=True) if want != have
    ]
    accuracy = 1 - len(misses) / len(texts)
    assert accuracy >= 0.9, f"top-1 accuracy {accuracy:.0%}; misses: {misses}"


def test_scores_over_all_labels_sum_to_one(http: httpx.Client) -> None:
    predictions = classify(http, {"text": "A new phone was released.", "top_k": 20}).json()["results"][0][
        "predictions"
    ]
    assert len(predictions) == 6  # every configured label, no more
    assert sum(p["score"] for p in predictions) == pytest.approx(1.0, abs=1e-4)
    assert sorted(p["class_id"] for p in predictions) == list(range(6))


def test_eight_texts_come_back_in_order(http: httpx.Client) -> None:
    picks = [
        ("health", 0), ("sports", 1), ("business", 2), ("technology", 0),
        ("politics", 1), ("entertainment", 2), ("sports", 3), ("health", 3),
    ]  # fmt: skip
    texts = [SENTENCES[label][i] for label, i in picks]
    response = classify(http, {"texts": texts})
    assert [r["index"] for r in response.json()["results"]] == list(range(8))
    assert [top(response, i) for i in range(8)] == [label for label, _ in picks]


def test_candidate_labels_change_the_answer(http: httpx.Client) -> None:
    recipe = "Whisk the eggs and fold in the flour."
    cooking = classify(http, {"text": recipe, "candidate_labels": ["cooking", "travel"]})
    assert top(cooking) == "cooking"
    predictions = cooking.json()["results"][0]["predictions"]
    assert [p["label"] for p in predictions] == ["cooking", "travel"]
    assert [p["class_id"] for p in predictions] == [0, 1]
    assert sum(p["score"] for p in predictions) == pytest.approx(1.0, abs=1e-4)
    trip = classify(
        http, {"text": "Our flight to Lisbon leaves at dawn.", "candidate_labels": ["cooking", "travel"]}
    )
    assert top(trip) == "travel"
    # The same sentence against the configured labels gets a configured label.
    assert top(classify(http, {"text": recipe})) in {
        "health",
        "entertainment",
        "business",
        "technology",
        "sports",
        "politics",
    }


def test_candidate_labels_apply_to_every_text_of_a_batch(http: httpx.Client) -> None:
    body = {
        "texts": [
            "Whisk the eggs and fold in the flour.",
            "Our flight to Lisbon leaves at dawn.",
            "Simmer the sauce.",
        ],
        "candidate_labels": ["travel", "cooking"],
    }
    response = classify(http, body)
    assert [top(response, i) for i in range(3)] == ["cooking", "travel", "cooking"]


def test_long_text_is_truncated_and_reported(http: httpx.Client) -> None:
    long_text = "The striker scored again. " * 200  # about 1,200 tokens, model limit 256
    result = classify(http, {"text": long_text}).json()["results"][0]
    assert result["truncated"] is True
    assert result["predictions"][0]["label"] == "sports"


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        ('{"text": ""}', 422),
        ('{"text": "   "}', 422),
        ('{"text": "\\ud800"}', 422),
        ('{"text": 12345}', 422),
        ('{"texts": ["ok"], "images": ["AAAA"]}', 422),
        ("{}", 422),
        ('{"texts": ' + str(["hello"] * 1000).replace("'", '"') + "}", 413),
        ('{"text": "' + "a" * 1_000_000 + '"}', 413),
    ],
)
def test_invalid_text_input_is_4xx_and_next_request_succeeds(
    http: httpx.Client, raw: str, status: int
) -> None:
    response = http.post(
        "/classify", content=raw.encode("utf-8"), headers={"content-type": "application/json"}
    )
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert top(classify(http, {"text": "The striker scored twice in the final."})) == "sports"


def test_models_lists_the_label_set(http: httpx.Client) -> None:
    # ready is three metadata calls to Triton under a 1 s deadline each: on a loaded
    # machine (the suite's other workers) one once took longer, and the model read not
    # ready while Triton had it READY. The label set is what this test is about.
    deadline = time.monotonic() + 15
    while True:
        text = {m["name"]: m for m in http.get("/models").json()["models"]}["text_classifier"]
        if text["ready"] or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert text["ready"] is True, text
    assert text["labels"] == ["sports", "politics", "technology", "business", "health", "entertainment"]
    assert "composing_models" not in text  # ensemble steps: /admin/served only
    assert http.get("/readyz").json()["checks"]["model:text_classifier"] is True
