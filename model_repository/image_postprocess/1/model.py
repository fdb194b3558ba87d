"""Triton Python model: a classifier's raw outputs -> top-k labels, scores and class ids.

Shared by every classifier whose network ends in a score per class (the shipped image
classifier, images and fine-tuned text classifiers added with `triton-gateway
add-model`). Parameters (config.pbtxt): `labels_file` (one label a line, line n = class
id n), `max_top_k`, and `activation`, how the network's outputs become scores:

- `softmax` (default): logits, one label per input; scores sum to 1;
- `sigmoid`: multi-label, each label scored on its own in 0..1;
- `none`: the network already outputs scores (e.g. it ends in a softmax): taken as they are.

All requests of a batch share one activation and one partial sort.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

ACTIVATIONS = ("softmax", "sigmoid", "none")


def to_scores(outputs: np.ndarray, activation: str) -> np.ndarray:
    """The network's outputs (batch x classes) as scores, by the model's activation."""
    if activation == "none":
        return outputs
    if activation == "sigmoid":
        # 1 / (1 + e^-x) without overflow for large |x|
        return np.exp(-np.logaddexp(0.0, -outputs)).astype(np.float32)
    shifted = outputs - outputs.max(axis=1, keepdims=True)
    probs = np.exp(shifted)
    probs /= probs.sum(axis=1, keepdims=True)
    return probs


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        classes = pb_utils.get_input_config_by_name(config, "LOGITS")["dims"][-1]
        labels_path = Path(args["model_repository"]) / params["labels_file"]
        labels = labels_path.read_text(encoding="utf-8").splitlines()
        if len(labels) != classes:
            raise pb_utils.TritonModelException(
                f"{labels_path} has {len(labels)} labels, the model has {classes} classes"
            )
        self.labels = np.array([label.encode("utf-8") for label in labels], dtype=np.object_)
        self.max_top_k = int(params["max_top_k"])
        self.activation = params.get("activation", "softmax")
        if self.activation not in ACTIVATIONS:
            raise pb_utils.TritonModelException(
                f"activation must be one of {', '.join(ACTIVATIONS)}, not {self.activation!r}"
            )

    def execute(self, requests: list[Any]) -> list[Any]:
        logits = [pb_utils.get_input_tensor_by_name(r, "LOGITS").as_numpy() for r in requests]
        top_ks = [pb_utils.get_input_tensor_by_name(r, "TOP_K").as_numpy().reshape(-1) for r in requests]
        probs = to_scores(np.concatenate(logits, axis=0).astype(np.float32), self.activation)
        widest = int(min(self.max_top_k, max(int(k.max()) for k in top_ks), probs.shape[1]))
        # Partial sort once for the widest k of the batch, then order those few.
        candidates = np.argpartition(-probs, widest - 1, axis=1)[:, :widest]
        order = np.argsort(-np.take_along_axis(probs, candidates, axis=1), axis=1, kind="stable")
        ranked = np.take_along_axis(candidates, order, axis=1)

        responses = []
        start = 0
        for rows, k_values in zip(logits, top_ks, strict=True):
            count = rows.shape[0]
            k = int(k_values[0])
            if not 1 <= k <= self.max_top_k or np.any(k_values != k):
                error = pb_utils.TritonError(
                    f"TOP_K must be one value in 1..{self.max_top_k}", pb_utils.TritonError.INVALID_ARG
                )
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=error))
                start += count
                continue
            ids = ranked[start : start + count, :k]
            scores = np.take_along_axis(probs[start : start + count], ids, axis=1)
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("LABELS", self.labels[ids]),
                        pb_utils.Tensor("SCORES", scores.astype(np.float32)),
                        pb_utils.Tensor("CLASS_IDS", ids.astype(np.int32)),
                    ]
                )
            )
            start += count
        return responses
