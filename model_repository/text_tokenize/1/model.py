"""Triton Python model: UTF-8 texts -> token ids, attention mask (token type ids),
truncation flags; any Hugging Face `tokenizer.json` (WordPiece, BPE, Unigram).

Shared by the shipped text models and every fine-tuned text classifier added with
`triton-gateway add-model` (a symlink to this file, the differences in the config):

- `tokenizer_file`: the tokenizer, beside this file in the version directory;
- `max_tokens`: truncation, special tokens included;
- `length_buckets`: padded lengths (max_tokens is always the last one); "" pads each
  request to its longest text; a network with a fixed sequence length has one bucket;
- the outputs the config declares: `INPUT_IDS`, `ATTENTION_MASK`, `TRUNCATED`, and
  `TOKEN_TYPE_IDS` when the network takes them; their data type (TYPE_INT64 or
  TYPE_INT32) is the network's.

One `encode_batch` call per request. Each request is padded to the smallest length bucket
that holds its longest text: Triton's dynamic batcher only merges requests of equal shape
(and a request of another shape ends a batch), so padding each request to its own longest
text left nearly every model execution with one request. The attention mask keeps the
padding inert. The padding id is the tokenizer's own (its padding setting, else its
pad token), never a guess.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils
from tokenizers import Tokenizer

# Pad tokens of the common tokenizer families, for a tokenizer.json without padding set.
PAD_TOKENS = ("[PAD]", "<pad>", "<|pad|>", "<|endoftext|>")
DTYPES = {"TYPE_INT64": np.int64, "TYPE_INT32": np.int32}


def pad_id(tokenizer: Tokenizer) -> int:
    """The id the tokenizer pads with: its padding setting, else a known pad token, else 0."""
    if tokenizer.padding:
        return int(tokenizer.padding["pad_id"])
    for token in PAD_TOKENS:
        found = tokenizer.token_to_id(token)
        if found is not None:
            return int(found)
    return 0


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        path = Path(args["model_repository"]) / args["model_version"] / params["tokenizer_file"]
        self.max_tokens = int(params["max_tokens"])
        self.tokenizer = Tokenizer.from_file(str(path))
        self.pad_id = pad_id(self.tokenizer)
        self.tokenizer.no_padding()  # padded here, to a bucket
        self.tokenizer.enable_truncation(self.max_tokens)
        buckets = sorted({int(b) for b in params.get("length_buckets", "").split(",") if b.strip()})
        self.buckets = [b for b in buckets if b < self.max_tokens] + [self.max_tokens]
        self.pad_to_longest = not buckets
        outputs = {item["name"]: item["data_type"] for item in config["output"]}
        self.dtype = DTYPES[outputs["INPUT_IDS"]]
        self.token_types = "TOKEN_TYPE_IDS" in outputs

    def _width(self, longest: int) -> int:
        if self.pad_to_longest:
            return longest
        return next(b for b in self.buckets if b >= longest)

    def _pad(self, rows: list[list[int]], fill: int) -> np.ndarray:
        width = self._width(max(len(row) for row in rows))
        out = np.full((len(rows), width), fill, dtype=self.dtype)
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
            tensors = [
                pb_utils.Tensor("INPUT_IDS", self._pad([e.ids for e in encodings], self.pad_id)),
                pb_utils.Tensor("ATTENTION_MASK", self._pad([e.attention_mask for e in encodings], 0)),
                pb_utils.Tensor(
                    "TRUNCATED", np.array([[bool(e.overflowing)] for e in encodings], dtype=np.bool_)
                ),
            ]
            if self.token_types:
                tensors.append(
                    pb_utils.Tensor("TOKEN_TYPE_IDS", self._pad([e.type_ids for e in encodings], 0))
                )
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
        return responses
