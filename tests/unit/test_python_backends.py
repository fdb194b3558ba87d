"""The Python backends' own logic against a stand-in `pb_utils` (tests/pbfake.py): what
only a GPU host would otherwise show."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pbfake
import pytest

REPOSITORY = Path(__file__).resolve().parents[2] / "model_repository"
DIM = 384


@dataclass
class Request:
    inputs: list[pbfake.Tensor]


def _unit(rows: int, seed: int) -> np.ndarray:
    vectors = np.random.default_rng(seed).normal(size=(rows, DIM)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


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
