"""Texts: Unicode rule and caps, one Triton call for all texts of a request, top-k answers.

A model of this kind (``gateway_task: text-classification``) takes ``TEXT`` (UTF-8,
BYTES [1]), ``TOP_K`` (INT32 [1]) and, when it declares the optional input,
``CANDIDATE_LABELS`` (BYTES [-1], zero-shot); it answers ``LABELS``, ``SCORES``,
``CLASS_IDS`` and ``TRUNCATED``. Read from its configuration: the ensemble's
``max_batch_size`` (texts per request), ``max_top_k`` (text_postprocess), ``max_tokens``
(text_tokenize) and ``labels_model`` (the model that lists its configured labels).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from gateway.errors import InvalidInputError, PayloadTooLargeError
from gateway.names import TEXT_TASK
from gateway.serving.kinds.base import Caps, CapsReader, Kind, classifications, top_k_tensor
from gateway.serving.payload import ClassifyInput
from gateway.serving.validation import check_count, normalize_labels, normalize_text
from gateway.settings import Settings
from gateway.triton.backend import Classification, InferResult, ModelConfig
from gateway.triton.tensors import Tensor

CANDIDATE_LABELS = "CANDIDATE_LABELS"


def _text(element: bytes, what: str) -> str:
    try:
        return element.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInputError(f"{what} is not valid UTF-8") from exc


class TextKind(Kind):
    task = TEXT_TASK
    noun = "text"
    accepts = ("application/json",)
    oip_inputs = frozenset({"TEXT", CANDIDATE_LABELS})

    def caps(self, config: ModelConfig, parameters: Mapping[str, str], settings: Settings) -> Caps:
        read = CapsReader(config.name, parameters)
        max_texts = read.narrowed(
            "max_batch_size",
            config.max_batch_size or None,
            settings.text,
            "max_texts",
            "GATEWAY_TEXT__MAX_TEXTS",
        )
        extra = {
            "candidate_labels": CANDIDATE_LABELS in config.inputs,
            "max_tokens": read.integer("max_tokens"),
            "labels_model": parameters.get("labels_model", ""),
        }
        return read.caps(
            settings, max_texts, settings.text.model_copy(update={"max_texts": max_texts}), extra
        )

    def count(self, payload: ClassifyInput) -> int:
        return len(payload.texts)

    def check(self, payload: ClassifyInput, caps: Caps) -> None:
        # The texts were normalised as the body was read (the gateway-wide caps); what is
        # left is what this model takes.
        check_count(len(payload.texts), caps.max_inputs, "texts")
        if payload.candidate_labels is not None and not caps.extra["candidate_labels"]:
            raise InvalidInputError(
                "this model classifies against its own labels: it takes no candidate_labels"
            )

    def calls(self, payload: ClassifyInput, top_k: int, caps: Caps) -> list[list[Tensor]]:
        # One call for all the texts: the tokenizer pads to the longest of them, and they
        # were validated here, so there is no bad input to isolate.
        count = len(payload.texts)
        inputs = [
            Tensor("TEXT", "BYTES", np.array([[t.encode("utf-8")] for t in payload.texts], dtype=np.object_)),
            top_k_tensor(count, top_k),
        ]
        if payload.candidate_labels is not None:
            row = [label.encode("utf-8") for label in payload.candidate_labels]
            inputs.append(Tensor(CANDIDATE_LABELS, "BYTES", np.array([row] * count, dtype=np.object_)))
        return [inputs]

    def invalid(self) -> InvalidInputError:
        return InvalidInputError("the text model rejected the input")

    def results(self, answers: Sequence[InferResult]) -> list[Classification]:
        (answer,) = answers
        truncated = answer.outputs["TRUNCATED"].array.reshape(-1).tolist()
        return classifications(answer, truncated=truncated)

    def check_tensor(self, tensor: Tensor, caps: Caps) -> Tensor:
        limits = caps.limits
        if tensor.name == "TEXT":
            elements = list(tensor.array.reshape(-1))
            check_count(len(elements), caps.max_inputs, "texts")
            for element in elements:  # before decoding: UTF-8 takes at most 4 bytes a character
                if isinstance(element, bytes) and len(element) > 4 * limits.max_chars:
                    raise PayloadTooLargeError(f"a text has over {limits.max_chars} characters")
            texts = [normalize_text(_text(e, "a text"), limits.max_chars, "a text") for e in elements]
            return Tensor(
                tensor.name,
                "BYTES",
                np.array([t.encode() for t in texts], dtype=np.object_).reshape(tensor.shape),
            )
        # CANDIDATE_LABELS: each row is one text's label set, checked as /classify checks it
        if not caps.extra["candidate_labels"]:
            raise InvalidInputError("this model takes no candidate labels")
        rows = tensor.array.reshape(-1, tensor.shape[-1]) if tensor.array.ndim else tensor.array.reshape(1, 1)
        checked = [
            [
                label.encode()
                for label in normalize_labels([_text(e, "a candidate label") for e in row], limits)
            ]
            for row in rows
        ]
        return Tensor(tensor.name, "BYTES", np.array(checked, dtype=np.object_).reshape(tensor.shape))

    def labels_call(self, caps: Caps) -> tuple[str, list[Tensor]] | None:
        model = caps.extra["labels_model"]
        if not model:
            return None
        return model, [Tensor("QUERY", "INT32", np.zeros(1, dtype=np.int32))]
