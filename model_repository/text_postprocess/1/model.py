"""Triton Python model: zero-shot classification of sentence embeddings.

Scores are softmax(cosine similarity / temperature) over the label set: the configured
one (label_embeddings.npz from labels.txt), or the request's CANDIDATE_LABELS, whose
prompts are embedded through the `embedder_model` ensemble (BLS) once and then served
from a bounded LRU cache. Embeddings are L2-normalised, so cosine is a dot product;
each request is one matrix product.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        path = Path(args["model_repository"]) / args["model_version"] / params["labels_file"]
        with np.load(path) as stored:
            self.names = np.array([str(n).encode("utf-8") for n in stored["names"]], dtype=np.object_)
            self.vectors = stored["vectors"].astype(np.float32)
        self.temperature = float(params["temperature"])
        self.max_top_k = int(params["max_top_k"])
        self.embedder = params["embedder_model"]
        self.template = params["prompt_template"]
        self.cache_size = int(params["label_cache_size"])
        self.cache: OrderedDict[str, np.ndarray] = OrderedDict()

    def _embed(self, labels: list[str]) -> np.ndarray:
        """Embeddings of the candidate labels' prompts, computing only the uncached ones."""
        missing = list(dict.fromkeys(label for label in labels if label not in self.cache))
        if missing:
            prompts = np.array(
                [[self.template.format(label=label).encode("utf-8")] for label in missing], dtype=np.object_
            )
            request = pb_utils.InferenceRequest(
                model_name=self.embedder,
                inputs=[pb_utils.Tensor("TEXT", prompts)],
                requested_output_names=["EMBEDDING"],
            )
            response = request.exec()
            if response.has_error():
                raise pb_utils.TritonModelException(response.error().message())
            vectors = pb_utils.get_output_tensor_by_name(response, "EMBEDDING").as_numpy()
            for label, vector in zip(missing, vectors, strict=True):
                self.cache[label] = vector.astype(np.float32)
        for label in labels:
            self.cache.move_to_end(label)
        while len(self.cache) > self.cache_size:
            self.cache.popitem(last=False)
        return np.stack([self.cache[label] for label in labels])

    def _classify(
        self, embeddings: np.ndarray, top_k: int, names: np.ndarray, vectors: np.ndarray
    ) -> list[Any]:
        logits = embeddings @ vectors.T / self.temperature
        logits -= logits.max(axis=1, keepdims=True)
        probs = np.exp(logits)
        probs /= probs.sum(axis=1, keepdims=True)
        k = min(top_k, len(names))
        ids = np.argsort(-probs, axis=1, kind="stable")[:, :k]
        return [
            pb_utils.Tensor("LABELS", names[ids]),
            pb_utils.Tensor("SCORES", np.take_along_axis(probs, ids, axis=1).astype(np.float32)),
            pb_utils.Tensor("CLASS_IDS", ids.astype(np.int32)),
        ]

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            embeddings = pb_utils.get_input_tensor_by_name(request, "EMBEDDING").as_numpy()
            top_k = pb_utils.get_input_tensor_by_name(request, "TOP_K").as_numpy().reshape(-1)
            candidates = pb_utils.get_input_tensor_by_name(request, "CANDIDATE_LABELS")
            try:
                if not (1 <= int(top_k[0]) <= self.max_top_k) or np.any(top_k != top_k[0]):
                    raise ValueError(f"TOP_K must be one value in 1..{self.max_top_k}")
                if candidates is None:
                    names, vectors = self.names, self.vectors
                else:
                    rows = candidates.as_numpy()
                    if rows.shape[-1] == 0 or np.any(rows != rows[0]):
                        raise ValueError(
                            "CANDIDATE_LABELS must be one non-empty list, the same for every text"
                        )
                    labels = [bytes(item).decode("utf-8") for item in rows[0]]
                    if len(set(labels)) != len(labels):
                        raise ValueError("CANDIDATE_LABELS must not repeat a label")
                    names = np.array([label.encode("utf-8") for label in labels], dtype=np.object_)
                    vectors = self._embed(labels)
                tensors = self._classify(embeddings, int(top_k[0]), names, vectors)
            except (ValueError, UnicodeDecodeError) as exc:
                error = pb_utils.TritonError(str(exc), pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=error))
                continue
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return responses
