"""Triton Python model: UTF-8 texts -> token ids, attention mask, truncation flags.

One `encode_batch` call per request. Each request is padded to the smallest length bucket
that holds its longest text (config `length_buckets`, then max_tokens): Triton's dynamic
batcher only merges requests of equal shape (and a request of another shape ends a
batch), so padding each request to its own longest text left nearly every text_model
execution with one request. The attention mask keeps the padding out of the mean
pooling, so the embeddings do not change.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils
from tokenizers import Tokenizer


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        path = Path(args["model_repository"]) / args["model_version"] / params["tokenizer_file"]
        self.max_tokens = int(params["max_tokens"])
        self.tokenizer = Tokenizer.from_file(str(path))
        shipped = self.tokenizer.padding
        self.pad_id = int(shipped["pad_id"]) if shipped else 0
        self.tokenizer.no_padding()  # padded here, to a bucket
        self.tokenizer.enable_truncation(self.max_tokens)
        buckets = sorted({int(b) for b in params.get("length_buckets", "").split(",") if b.strip()})
        self.buckets = [b for b in buckets if b < self.max_tokens] + [self.max_tokens]

    def _bucket(self, longest: int) -> int:
        return next(b for b in self.buckets if b >= longest)

    def _pad(self, rows: list[list[int]], fill: int) -> np.ndarray:
        width = self._bucket(max(len(row) for row in rows))
        out = np.full((len(rows), width), fill, dtype=np.int64)
        for index, row in enumerate(rows):
            out[index, : len(row)] = row
        return out

    def execute(self, requests: list[Any]) -> list[Any]:
        responses = []
        for request in requests:
            raw = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy().reshape(-1)
            try:
                texts = [bytes(item).decode("utf-8") for item in raw]
                encodings = self.tokenizer.encode_batch(texts)
            except Exception as exc:  # any failure is this request's, never the batch's
                message = (
                    "TEXT must be UTF-8"
                    if isinstance(exc, UnicodeDecodeError)
                    else "TEXT cannot be tokenized"
                )
                error = pb_utils.TritonError(message, pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=error))
                continue
            ids = self._pad([e.ids for e in encodings], self.pad_id)
            mask = self._pad([e.attention_mask for e in encodings], 0)
            truncated = np.array([[bool(e.overflowing)] for e in encodings], dtype=np.bool_)
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("INPUT_IDS", ids),
                        pb_utils.Tensor("ATTENTION_MASK", mask),
                        pb_utils.Tensor("TRUNCATED", truncated),
                    ]
                )
            )
        return responses
