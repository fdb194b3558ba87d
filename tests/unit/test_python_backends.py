"""The Python backends' own logic against a stand-in `pb_utils` (tests/helpers/pbfake.py): what
only a GPU host would otherwise show."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from helpers import pbfake

REPOSITORY = Path(__file__).resolve().parents[2] / "model_repository"
DIM = 384


@dataclass
class Request:
    inputs: list[pbfake.Tensor]


def _unit(rows: int, seed: int) -> np.ndarray:
    vectors = np.random.default_rng(seed).normal(size=(rows, DIM)).astype(np.float32)
    unit: np.ndarray = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
    return unit


EMBEDDED: list[list[bytes]] = []  # what the fake embedder was asked, call by call


def _embedder(inputs: list[pbfake.Tensor]) -> list[pbfake.Tensor]:
    EMBEDDED.append([bytes(row[0]) for row in inputs[0].data])
    return [pbfake.Tensor("EMBEDDING", _unit(len(inputs[0].data), seed=len(EMBEDDED)))]


@pytest.fixture
def text_postprocess(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """text_postprocess initialised on a small label set, its embedder answering from a GPU."""
    monkeypatch.setattr(pbfake, "GPU_OUTPUTS", True)
    monkeypatch.setitem(pbfake.SERVER, "text_embedder", _embedder)
    (tmp_path / "1").mkdir()
    np.savez(
        tmp_path / "1" / "label_set.npz",
        names=np.array(["sport", "cooking"]),
        prompts=np.array(["This text is about sport.", "This text is about cooking."]),
    )
    module = pbfake.load_model(REPOSITORY / "text_postprocess" / "1" / "model.py")
    parameters = {
        "labels_file": "label_set.npz", "temperature": "0.05", "max_top_k": "20",
        "embedder_model": "text_embedder", "prompt_template": "This text is about {label}.",
        "label_cache_size": "16",
    }  # fmt: skip
    config = {"parameters": {k: {"string_value": v} for k, v in parameters.items()}}
    model = module.TritonPythonModel()
    model.initialize(
        {"model_config": json.dumps(config), "model_repository": str(tmp_path), "model_version": "1"}
    )
    return model


def test_candidate_labels_work_when_the_embedder_answers_from_gpu_memory(text_postprocess: Any) -> None:
    request = Request(
        [
            pbfake.Tensor("EMBEDDING", _unit(1, seed=2)),
            pbfake.Tensor("TOP_K", np.array([[2]], dtype=np.int32)),
            pbfake.Tensor("CANDIDATE_LABELS", np.array([[b"travel", b"finance"]], dtype=np.object_)),
        ]
    )
    [response] = text_postprocess.execute([request])
    assert not response.has_error(), response.error
    labels = pbfake.get_output_tensor_by_name(response, "LABELS")
    assert labels is not None
    assert sorted(labels.data[0]) == [b"finance", b"travel"]


def test_the_configured_labels_are_embedded_by_the_serving_embedder_once(text_postprocess: Any) -> None:
    """Not at build time by another runtime: labels and texts share one precision."""
    EMBEDDED.clear()
    request = Request(
        [
            pbfake.Tensor("EMBEDDING", _unit(1, seed=2)),
            pbfake.Tensor("TOP_K", np.array([[2]], dtype=np.int32)),
        ]
    )
    for _ in range(3):
        [response] = text_postprocess.execute([request])
        assert not response.has_error(), response.error
    assert EMBEDDED == [[b"This text is about sport.", b"This text is about cooking."]]


def _postprocess(tmp_path: Path, activation: str, classes: int = 4) -> Any:
    """image_postprocess (every classifier's logits step) with ``activation``."""
    (tmp_path / "labels.txt").write_text("".join(f"c{i}\n" for i in range(classes)))
    module = pbfake.load_model(REPOSITORY / "image_postprocess" / "1" / "model.py")
    parameters = {"labels_file": "labels.txt", "max_top_k": str(classes), "activation": activation}
    config = {
        "parameters": {k: {"string_value": v} for k, v in parameters.items()},
        "input": [{"name": "LOGITS", "dims": [classes]}, {"name": "TOP_K", "dims": [1]}],
    }
    model = module.TritonPythonModel()
    model.initialize(
        {"model_config": json.dumps(config), "model_repository": str(tmp_path), "model_version": "1"}
    )
    return model


def _scored(model: Any, logits: np.ndarray, top_k: int) -> tuple[np.ndarray, np.ndarray]:
    request = Request([pbfake.Tensor("LOGITS", logits.astype(np.float32)),
                       pbfake.Tensor("TOP_K", np.full((len(logits), 1), top_k, dtype=np.int32))])  # fmt: skip
    (response,) = model.execute([request])
    outputs = {t.name: t.data for t in response.output_tensors}
    return outputs["SCORES"], outputs["CLASS_IDS"]


LOGITS = np.array([[2.0, -1.0, 0.5, 3.0], [-40.0, 40.0, 0.0, 1.0]])


def test_softmax_scores_sum_to_one_and_rank_the_logits(tmp_path: Path) -> None:
    scores, ids = _scored(_postprocess(tmp_path, "softmax"), LOGITS, 4)
    assert ids.tolist() == [[3, 0, 2, 1], [1, 3, 2, 0]]
    np.testing.assert_allclose(scores.sum(axis=1), 1.0, rtol=1e-6)
    expected = np.exp(LOGITS[0] - LOGITS[0].max()) / np.exp(LOGITS[0] - LOGITS[0].max()).sum()
    np.testing.assert_allclose(scores[0], expected[[3, 0, 2, 1]], rtol=1e-6)


def test_sigmoid_scores_each_label_on_its_own(tmp_path: Path) -> None:
    scores, ids = _scored(_postprocess(tmp_path, "sigmoid"), LOGITS, 4)
    assert ids.tolist() == [[3, 0, 2, 1], [1, 3, 2, 0]]
    np.testing.assert_allclose(scores[0], 1 / (1 + np.exp(-LOGITS[0][[3, 0, 2, 1]])), rtol=1e-6)
    assert scores[0].sum() > 1.5  # not a distribution
    assert np.isfinite(scores).all()  # +-40 neither overflows nor warns
    assert scores[1][0] == pytest.approx(1.0)
    assert scores[1][-1] == pytest.approx(0.0, abs=1e-12)


def test_none_takes_the_networks_probabilities_as_they_are(tmp_path: Path) -> None:
    probabilities = np.array([[0.1, 0.6, 0.25, 0.05]])
    scores, ids = _scored(_postprocess(tmp_path, "none"), probabilities, 2)
    assert ids.tolist() == [[1, 2]]
    np.testing.assert_allclose(scores, [[0.6, 0.25]], rtol=1e-6)


def test_an_unknown_activation_refuses_to_load(tmp_path: Path) -> None:
    with pytest.raises(pbfake.TritonModelException, match="activation"):
        _postprocess(tmp_path, "softplus")


def _tokenize(tmp_path: Path, tokenizer: Any, outputs: dict[str, str], **parameters: str) -> Any:
    (tmp_path / "1").mkdir(exist_ok=True)
    tokenizer.save(str(tmp_path / "1" / "tokenizer.json"))
    module = pbfake.load_model(REPOSITORY / "text_tokenize" / "1" / "model.py")
    values = {"tokenizer_file": "tokenizer.json", "max_tokens": "8", "length_buckets": "", **parameters}
    config = {
        "parameters": {k: {"string_value": v} for k, v in values.items()},
        "output": [{"name": name, "data_type": kind} for name, kind in outputs.items()],
    }
    model = module.TritonPythonModel()
    model.initialize(
        {"model_config": json.dumps(config), "model_repository": str(tmp_path), "model_version": "1"}
    )
    return model


def _bpe() -> Any:
    """A byte-level BPE tokenizer whose pad token is <pad> (id 7), without padding set."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["a0", "a1", "a2", "a3", "a4", "a5", "<unk>", "<pad>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    tokenizer.train_from_iterator(["the cat sat on the mat", "a dog ran in the park"] * 5, trainer)
    return tokenizer


def _tokens(model: Any, texts: list[str]) -> dict[str, np.ndarray]:
    raw = np.array([[t.encode()] for t in texts], dtype=np.object_)
    (response,) = model.execute([Request([pbfake.Tensor("TEXT", raw)])])
    assert response.error is None
    return {t.name: t.data for t in response.output_tensors}


def test_tokenize_pads_with_the_tokenizers_own_pad_token_in_the_networks_integer_type(tmp_path: Path) -> None:
    model = _tokenize(
        tmp_path,
        _bpe(),
        {"INPUT_IDS": "TYPE_INT32", "ATTENTION_MASK": "TYPE_INT32", "TRUNCATED": "TYPE_BOOL"},
    )
    out = _tokens(model, ["the cat", "a dog ran in the park"])
    assert out["INPUT_IDS"].dtype == np.int32
    assert out["ATTENTION_MASK"].dtype == np.int32
    assert "TOKEN_TYPE_IDS" not in out  # the network takes none
    width = out["INPUT_IDS"].shape[1]  # no buckets: the longest text of the request
    assert width == int(out["ATTENTION_MASK"][1].sum())
    short = int(out["ATTENTION_MASK"][0].sum())
    assert (out["INPUT_IDS"][0, short:] == 7).all()  # <pad>, not id 0
    assert out["TRUNCATED"].tolist() == [[False], [False]]


def test_tokenize_gives_token_type_ids_and_fills_its_bucket(tmp_path: Path) -> None:
    outputs = {"INPUT_IDS": "TYPE_INT64", "ATTENTION_MASK": "TYPE_INT64", "TOKEN_TYPE_IDS": "TYPE_INT64",
               "TRUNCATED": "TYPE_BOOL"}  # fmt: skip
    model = _tokenize(tmp_path, _bpe(), outputs, max_tokens="6", length_buckets="6")
    out = _tokens(model, ["the cat", "the cat sat on the mat and a dog ran in the park"])
    assert out["INPUT_IDS"].shape == (2, 6)  # a fixed-length network: always its length
    assert out["TOKEN_TYPE_IDS"].shape == (2, 6)
    assert out["TOKEN_TYPE_IDS"].dtype == np.int64
    assert out["TRUNCATED"].tolist() == [[False], [True]]
