"""Your own classifiers, added with `triton-gateway add-model` on the running local stack
(no restart) from the networks the model build makes (build/examples, `make models`):

- a fine-tuned text classifier (all-MiniLM-L6-v2 + head, WordPiece, labels from its
  config.json's id2label): held-out accuracy, beside zero-shot on the same sentences;
- a second tokenizer family (byte-level BPE, a small BERT, INT32 inputs, no token type ids);
- a multi-label tagger (sigmoid): a text about two of its labels gets both over a threshold;
- an image network ending in softmax, added with --activation none: no second softmax;
- for each activation, the gateway's scores equal the network's own output, run here with
  ONNX Runtime on the same tokens or pixels (to 1e-5).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.http as tritonhttp
from google.protobuf import json_format
from tokenizers import Tokenizer

from gateway.triton import pbtxt

from helpers import pbfake
from helpers.local_stack import LocalStack
from helpers.support import chelsea_jpeg, coffee_png
from helpers.triton_fixtures import REPOSITORY

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "build" / "examples"
DATA = ROOT / "deploy" / "model-build" / "data"
TOL = 1e-5


def _examples(path: Path) -> list[tuple[list[str], str]]:
    rows = [
        line.split("\t", 1) for line in path.read_text().splitlines() if line and not line.startswith("#")
    ]
    return [([label.strip() for label in labels.split(",")], text.strip()) for labels, text in rows]


def _add(stack: LocalStack, name: str, *options: str) -> None:
    """The real command, then a load through /admin: no restart."""
    import subprocess

    if (stack.repository / name).exists():
        return
    for needed in options:
        if needed.startswith(str(EXAMPLES)) and not Path(needed).exists():
            pytest.fail(f"{needed} is missing: `make models` builds it")
    command = [
        sys.executable,
        "-m",
        "gateway",
        "add-model",
        name,
        "--repository",
        str(stack.repository),
        *options,
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    loaded = stack.admin("POST", f"/admin/models/{name}/load")
    assert loaded.status_code == 200, loaded.text


@pytest.fixture(scope="module")
def own(local_stack: LocalStack) -> LocalStack:
    text = ("--task", "text-classification")
    sentiment, bpe, topics = EXAMPLES / "sentiment", EXAMPLES / "sentiment-bpe", EXAMPLES / "topics"
    _add(local_stack, "sentiment", *text, "--onnx", str(sentiment / "model.onnx"),
         "--tokenizer", str(sentiment / "tokenizer.json"), "--labels-from", str(sentiment / "config.json"))  # fmt: skip
    _add(local_stack, "sentiment_bpe", *text, "--onnx", str(bpe / "model.onnx"),
         "--tokenizer", str(bpe / "tokenizer.json"), "--labels", str(bpe / "labels.txt"))  # fmt: skip
    _add(local_stack, "topics", *text, "--onnx", str(topics / "model.onnx"),
         "--tokenizer", str(topics / "tokenizer.json"), "--labels", str(topics / "labels.txt"),
         "--activation", "sigmoid")  # fmt: skip
    _add(local_stack, "lite0_softmax", "--task", "image-classification",
         "--onnx", str(EXAMPLES / "lite0-softmax.onnx"), "--labels", str(REPOSITORY / "image_postprocess" / "labels.txt"),
         "--normalize", "efficientnet-lite", "--activation", "none")  # fmt: skip
    return local_stack


def _classify(stack: LocalStack, model: str, texts: list[str], **query: Any) -> list[list[dict[str, Any]]]:
    answer = httpx.post(
        f"{stack.url}/models/{model}/classify", json={"texts": texts}, params=query, timeout=120
    )
    assert answer.status_code == 200, answer.text
    return [result["predictions"] for result in answer.json()["results"]]


def _accuracy(stack: LocalStack, model: str, examples: list[tuple[list[str], str]]) -> float:
    got = _classify(stack, model, [text for _, text in examples], top_k=1)
    return float(sum(p[0]["label"] == labels[0] for p, (labels, _) in zip(got, examples, strict=True))) / len(
        examples
    )


def test_the_fine_tuned_classifier_gets_held_out_sentences_right_and_zero_shot_is_reported(
    own: LocalStack,
) -> None:
    held_out = _examples(DATA / "sentiment-heldout.tsv")
    models = {m["name"]: m for m in httpx.get(f"{own.url}/models", timeout=30).json()["models"]}
    assert models["sentiment"]["task"] == "text-classification"
    assert models["sentiment"]["caps"]["activation"] == "softmax"
    assert models["sentiment"]["caps"]["max_tokens"] == 512  # the network's position embeddings
    assert models["sentiment"]["caps"]["candidate_labels"] is False
    fine_tuned = _accuracy(own, "sentiment", held_out)
    # Zero-shot on the same sentences: the shipped encoder with a label set of prompts.
    labels = own.repository.parent / "sentiment-prompts.txt"
    labels.write_text(
        "negative: This text is negative: a complaint, disappointment or anger.\n"
        "neutral: This text is neutral: a plain fact, a question or a request.\n"
        "positive: This text is positive: praise, satisfaction or joy.\n"
    )
    # The fine-tuned model's answers on the held-out set: the zero-shot one's drift reference
    # (a validation set's predictions, as /classify answers, one a line).
    reference = own.repository.parent / "sentiment-reference.jsonl"
    answers = _classify(own, "sentiment", [text for _, text in held_out], top_k=1)
    reference.write_text("".join(json.dumps({"results": [{"predictions": a}]}) + "\n" for a in answers))
    _add(own, "sentiment_zero_shot", "--task", "text-classification", "--labels", str(labels),
         "--reference", str(reference))  # fmt: skip
    drift = httpx.get(f"{own.url}/models/sentiment_zero_shot", timeout=30).json()["drift"]
    assert drift["reference"]["source"] == "model-config"
    assert drift["reference"]["inputs"] == len(held_out)
    zero_shot = _accuracy(own, "sentiment_zero_shot", held_out)
    print(
        f"held-out sentiment ({len(held_out)} sentences): fine-tuned {fine_tuned:.0%}, zero-shot {zero_shot:.0%}"
    )
    assert fine_tuned >= 0.9


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    out: np.ndarray = e / e.sum(axis=-1, keepdims=True)
    return out


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x.astype(np.float64)))


def _local_text_scores(
    example: Path, texts: list[str], activation: Callable[[np.ndarray], np.ndarray]
) -> np.ndarray:
    """The network's own scores: its tokenizer and ONNX Runtime, here, one text at a time."""
    tokenizer = Tokenizer.from_file(str(example / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(512)
    session = ort.InferenceSession(str(example / "model.onnx"), providers=["CPUExecutionProvider"])
    wanted = {i.name: (np.int32 if "int32" in i.type else np.int64) for i in session.get_inputs()}
    rows = []
    for text in texts:
        encoding = tokenizer.encode(text)
        values = {"input_ids": encoding.ids, "attention_mask": encoding.attention_mask,
                  "token_type_ids": encoding.type_ids}  # fmt: skip
        feeds = {name: np.array([values[name]], dtype=dtype) for name, dtype in wanted.items()}
        rows.append(activation(session.run(None, feeds)[0][0]))
    return np.array(rows)


TEXTS = [
    "The basketball team was bought by a billionaire investor.",
    "Doctors use artificial intelligence to read X-ray images.",
    "Thank you, the repair was quick and the price was fair.",
    "My parcel never arrived and nobody answers the phone.",
    "The office is closed on public holidays.",
]


@pytest.mark.parametrize(
    ("model", "example", "activation"),
    [
        ("sentiment", "sentiment", _softmax),
        ("sentiment_bpe", "sentiment-bpe", _softmax),
        ("topics", "topics", _sigmoid),
    ],
    ids=["wordpiece-softmax", "bpe-int32-softmax", "multi-label-sigmoid"],
)
def test_scores_equal_the_networks_own_output(
    own: LocalStack, model: str, example: str, activation: Callable[[np.ndarray], np.ndarray]
) -> None:
    labels = (EXAMPLES / example / "labels.txt").read_text().split()
    expected = _local_text_scores(EXAMPLES / example, TEXTS, activation)
    got = _classify(own, model, TEXTS, top_k=len(labels))
    for predictions, row in zip(got, expected, strict=True):
        assert len(predictions) == len(labels)
        for prediction in predictions:
            assert prediction["label"] == labels[prediction["class_id"]]
            assert abs(prediction["score"] - row[prediction["class_id"]]) <= TOL, (prediction, row)
        assert [p["class_id"] for p in predictions] == sorted(range(len(labels)), key=lambda i: -row[i])


def test_the_bpe_classifier_is_served_with_its_own_tokenizer(own: LocalStack) -> None:
    config = (own.repository / "sentiment_bpe_tokenize" / "config.pbtxt").read_text()
    assert "(BPE)" in config
    assert "TYPE_INT32" in config
    assert "TOKEN_TYPE_IDS" not in config  # the network takes none
    accuracy = _accuracy(own, "sentiment_bpe", _examples(DATA / "sentiment-heldout.tsv"))
    print(f"held-out sentiment, BPE model trained from scratch: {accuracy:.0%}")
    assert accuracy > 1 / 3  # better than chance over three classes


def test_a_multi_label_text_gets_both_of_its_labels_over_the_threshold(own: LocalStack) -> None:
    two = "The basketball team was bought by a billionaire investor."
    one = "Slice the onions and fry them until golden."
    over, single = _classify(own, "topics", [two, one], threshold=0.5)
    assert {p["label"] for p in over} == {"sports", "business"}
    assert all(p["score"] >= 0.5 for p in over)
    assert [p["label"] for p in single] == ["food"]
    # the scores are each label's own: they need not sum to 1
    everything = _classify(own, "topics", [two], top_k=6)[0]
    assert sum(p["score"] for p in everything) > 1.05
    # with top_k too: the labels over the threshold, at most top_k of them
    (capped,) = _classify(own, "topics", [two], threshold=0.5, top_k=1)
    assert [p["label"] for p in capped] == ["sports"]
    # in the JSON body as well; a threshold nothing reaches answers no labels
    body = {"texts": [one], "threshold": 0.99}
    answer = httpx.post(f"{own.url}/models/topics/classify", json=body, timeout=60)
    assert answer.status_code == 200, answer.text
    assert answer.json()["results"][0]["predictions"] == []
    refused = httpx.post(
        f"{own.url}/models/topics/classify", json={"texts": [one], "threshold": 1.5}, timeout=60
    )
    assert refused.status_code == 422
    assert refused.headers["content-type"] == "application/problem+json"


def _preprocessed(image: bytes, config_file: Path) -> np.ndarray:
    """The pixels exactly as the model's preprocess makes them: the shipped code, run here
    with the config add-model wrote for it."""
    config = json_format.MessageToDict(pbtxt.read_config(config_file), preserving_proto_field_name=True)
    for tensor in config["output"]:
        tensor["dims"] = [int(dim) for dim in tensor["dims"]]  # protobuf's JSON writes int64 as text
    module = pbfake.load_model(REPOSITORY / "image_preprocess" / "1" / "model.py")
    model = module.TritonPythonModel()
    model.initialize({"model_config": json.dumps(config), "model_repository": "", "model_version": "1"})
    (response,) = model.execute([Request([pbfake.Tensor("IMAGE", np.array([[image]], dtype=np.object_))])])
    return np.asarray(response.output_tensors[0].as_numpy())


@dataclass
class Request:
    inputs: list[pbfake.Tensor]


def test_an_image_network_ending_in_softmax_gets_no_second_one(own: LocalStack) -> None:
    session = ort.InferenceSession(str(EXAMPLES / "lite0-softmax.onnx"), providers=["CPUExecutionProvider"])
    for image in (chelsea_jpeg(), coffee_png()):
        pixels = _preprocessed(image, own.repository / "lite0_softmax_preprocess" / "config.pbtxt")
        own_scores = session.run(None, {session.get_inputs()[0].name: pixels})[0][0]
        answer = httpx.post(f"{own.url}/models/lite0_softmax/classify", content=image, params={"top_k": 5},
                            headers={"content-type": "application/octet-stream"}, timeout=60)  # fmt: skip
        assert answer.status_code == 200, answer.text
        predictions = answer.json()["results"][0]["predictions"]
        assert predictions[0]["class_id"] == int(np.argmax(own_scores))
        for prediction in predictions:
            assert abs(prediction["score"] - own_scores[prediction["class_id"]]) <= TOL
        # and the shipped classifier (logits + softmax) agrees: the same probabilities
        shipped = httpx.post(f"{own.url}/models/image_classifier/classify", content=image, params={"top_k": 5},
                             headers={"content-type": "application/octet-stream"}, timeout=60)  # fmt: skip
        for mine, theirs in zip(predictions, shipped.json()["results"][0]["predictions"], strict=True):
            assert mine["class_id"] == theirs["class_id"]
            assert abs(mine["score"] - theirs["score"]) <= TOL
    models = {m["name"]: m for m in httpx.get(f"{own.url}/models", timeout=30).json()["models"]}
    assert models["lite0_softmax"]["caps"]["activation"] == "none"
    assert models["image_classifier"]["caps"]["activation"] == "softmax"


def test_a_fine_tuned_classifier_answers_through_v2_with_tritonclient(own: LocalStack) -> None:
    client = tritonhttp.InferenceServerClient(own.url.removeprefix("http://"), network_timeout=60)
    try:
        text = tritonhttp.InferInput("TEXT", [2, 1], "BYTES")
        text.set_data_from_numpy(np.array([[t.encode()] for t in TEXTS[2:4]], dtype=np.object_))
        k = tritonhttp.InferInput("TOP_K", [2, 1], "INT32")
        k.set_data_from_numpy(np.full((2, 1), 1, dtype=np.int32))
        result = client.infer("sentiment", [text, k])
    finally:
        client.close()
    labels = [row[0].decode() for row in result.as_numpy("LABELS")]
    assert labels == ["positive", "negative"]
