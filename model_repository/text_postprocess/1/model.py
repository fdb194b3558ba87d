"""Triton Python model: zero-shot classification of sentence embeddings.

Scores are softmax(cosine similarity / temperature) over the label set: the configured
one (names and prompts in label_set.npz, from labels.txt), or the request's
CANDIDATE_LABELS. Both are embedded through the `embedder_model` ensemble (BLS), the very
model that embeds the texts, so labels and texts share one precision (TensorRT FP16 on a
GPU): the configured set on first use (BLS is not available in initialize), candidate
labels once each, then from a bounded LRU cache. Embeddings are L2-normalised, so cosine
is a dot product; each request is one matrix product.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

EMBED_BATCH = 32


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        path = Path(args["model_repository"]) / args["model_version"] / params["labels_file"]
        with np.load(path) as stored:
            self.names = np.array([str(n).encode("utf-8") for n in stored["names"]], dtype=np.object_)
            self.prompts = [str(p) for p in stored["prompts"]]
        self.vectors: np.ndarray | None = None  # the configured set, embedded on first use
        self.temperature = float(params["temperature"])
        self.max_top_k = int(params["max_top_k"])
        self.embedder = params["embedder_model"]
        self.template = params["prompt_template"]
        self.cache_size = int(params["label_cache_size"])
        self.cache: OrderedDict[str, np.ndarray] = OrderedDict()

    def _embed_prompts(self, prompts: list[str]) -> np.ndarray:
        """The embedder's vectors for these prompts (float32, [len(prompts), dim]), in
        BLS calls of at most EMBED_BATCH prompts (under the embedder's max_batch_size)."""
        if len(prompts) > EMBED_BATCH:
            parts = [prompts[i : i + EMBED_BATCH] for i in range(0, len(prompts), EMBED_BATCH)]
            return np.concatenate([self._embed_prompts(part) for part in parts])
        texts = np.array([[prompt.encode("utf-8")] for prompt in prompts], dtype=np.object_)
        request = pb_utils.InferenceRequest(
            model_name=self.embedder,
            inputs=[pb_utils.Tensor("TEXT", texts)],
            requested_output_names=["EMBEDDING"],
            # On a GPU the embedder's output stays in GPU memory unless the request
            # asks otherwise, and as_numpy() refuses GPU tensors (a no-op on CPU).
            preferred_memory=pb_utils.PreferredMemory(pb_utils.TRITONSERVER_MEMORY_CPU, 0),
        )
        response = request.exec()
        if response.has_error():
            raise pb_utils.TritonModelException(response.error().message())
        vectors: np.ndarray = pb_utils.get_output_tensor_by_name(response, "EMBEDDING").as_numpy()
        return vectors.astype(np.float32)

    def _configured(self) -> np.ndarray:
        if self.vectors is None:
            self.vectors = self._embed_prompts(self.prompts)
        return self.vectors

    def _embed(self, labels: list[str]) -> np.ndarray:
        """Embeddings of the candidate labels' prompts, computing only the uncached ones."""
        missing = list(dict.fromkeys(label for label in labels if label not in self.cache))
        if missing:
            vectors = self._embed_prompts([self.template.format(label=label) for label in missing])
            for label, vector in zip(missing, vectors, strict=True):
                self.cache[label] = vector
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
                    names, vectors = self.names, self._configured()
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
            except Exception as exc:  # e.g. the labels' BLS call: this request's failure only
                error = pb_utils.TritonError(f"postprocess failed ({type(exc).__name__})")
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=error))
                continue
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return responses
