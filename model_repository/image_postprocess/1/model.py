"""Triton Python model: logits -> top-k labels, softmax scores and class ids.

The labels file is named in config.pbtxt (`labels_file`), one label a line. All
requests of a batch share one softmax and one partial sort.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils


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

    def execute(self, requests: list[Any]) -> list[Any]:
        logits = [pb_utils.get_input_tensor_by_name(r, "LOGITS").as_numpy() for r in requests]
        top_ks = [pb_utils.get_input_tensor_by_name(r, "TOP_K").as_numpy().reshape(-1) for r in requests]
        everything = np.concatenate(logits, axis=0)
        shifted = everything - everything.max(axis=1, keepdims=True)
        probs = np.exp(shifted)
        probs /= probs.sum(axis=1, keepdims=True)
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
