"""What every input kind provides, and the parts classifiers share.

A kind (image, text, ...) is one module holding everything about that input: what a
model of its task can take (read from the model's configuration, narrowed by settings),
the checks its inputs pass before Triton (pure functions), the Triton tensors they
become, the fan-out policy (how many Triton calls one request makes) and how the
answers are read back. :mod:`gateway.serving.plane` runs them; the routes never branch on kinds.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
from pydantic import BaseModel

from gateway.errors import ConfigurationError, InvalidInputError
from gateway.names import ACTIVATIONS, DEFAULT_ACTIVATION
from gateway.serving.payload import ClassifyInput
from gateway.settings import Settings
from gateway.triton.backend import Classification, InferResult, ModelConfig, ScoredLabel
from gateway.triton.tensors import Tensor, strings


@dataclass(frozen=True)
class Caps:
    """What one model takes, after the settings narrowed it: the caps checked before
    Triton. ``notes`` say where a setting tried to widen one (refused: the model's holds)."""

    max_top_k: int
    default_top_k: int
    max_inputs: int
    limits: Any  # the kind's own limits (ImageLimits, TextLimits), narrowed
    extra: Mapping[str, Any] = field(default_factory=dict)  # shown in /models
    notes: tuple[str, ...] = ()

    def as_json(self) -> dict[str, Any]:
        limits = self.limits.model_dump() if hasattr(self.limits, "model_dump") else {}
        return {
            "max_top_k": self.max_top_k,
            "default_top_k": self.default_top_k,
            "max_inputs": self.max_inputs,
            **limits,
            **self.extra,
            "refused_settings": list(self.notes),
        }


class CapsReader:
    """Reads a model's caps from the merged ``parameters`` of an ensemble and its steps,
    and narrows each by the setting of the same meaning: a setting may lower a cap, never
    raise it (a raise is refused, noted, and the model's own cap holds)."""

    def __init__(self, model: str, parameters: Mapping[str, str]) -> None:
        self.model = model
        self.parameters = parameters
        self.notes: list[str] = []

    def integer(self, key: str) -> int | None:
        value = self.parameters.get(key)
        if value is None:
            return None
        try:
            return int(value)
        except ValueError:
            raise ConfigurationError(f"{self.model}: parameter {key}={value!r} is not an integer") from None

    def narrowed(self, key: str, model_cap: int | None, group: BaseModel, field: str, env: str) -> int:
        """The effective cap: the model's ``key``, lowered by the setting ``group.field``
        (environment variable ``env``) where that is lower."""
        setting: int = getattr(group, field)
        if model_cap is None:
            return setting
        if field in group.model_fields_set and setting > model_cap:
            self.notes.append(
                f"{env}={setting} would widen {self.model}'s {key} ({model_cap}): refused, "
                f"the model's cap holds (settings may only narrow)"
            )
        return min(setting, model_cap)

    def caps(self, settings: Settings, max_inputs: int, limits: Any, extra: Mapping[str, Any]) -> Caps:
        """The kind's caps with what every classifier has: its top-k (``max_top_k``, from
        the step that enforces it) and the notes of refused settings."""
        max_top_k = self.narrowed(
            "max_top_k", self.integer("max_top_k"), settings, "max_top_k", "GATEWAY_MAX_TOP_K"
        )
        activation = self.parameters.get("activation", DEFAULT_ACTIVATION)
        if activation not in ACTIVATIONS:
            raise ConfigurationError(
                f"{self.model}: parameter activation={activation!r} is none of {', '.join(ACTIVATIONS)}"
            )
        return Caps(
            max_top_k=max_top_k,
            default_top_k=min(settings.default_top_k, max_top_k),
            max_inputs=max_inputs,
            limits=limits,
            extra={**extra, "activation": activation},
            notes=tuple(self.notes),
        )


def merged_parameters(config: ModelConfig, steps: Sequence[ModelConfig]) -> dict[str, str]:
    """An ensemble's own parameters, then its steps' (the ensemble's win): each fact lives
    once, in the model that enforces it (image_preprocess's formats, the postprocess's
    max_top_k)."""
    merged: dict[str, str] = {}
    for step in steps:
        for key, value in step.parameters.items():
            merged.setdefault(key, value)
    return {**merged, **config.parameters}


# A classifier's scores output: each input's top-k scores, best first (LABELS beside it).
SCORES = "SCORES"


def classifications(result: InferResult, truncated: Sequence[bool] | None = None) -> list[Classification]:
    """One Classification per row of a classifier's LABELS, SCORES and CLASS_IDS."""
    scores = result.outputs[SCORES].rows()
    cuts: Sequence[bool | None] = truncated if truncated is not None else [None] * len(scores)
    return [
        Classification(
            predictions=[
                ScoredLabel(label=label, score=float(score), class_id=int(class_id))
                for label, score, class_id in zip(strings(labels), row, ids, strict=True)
            ],
            model_version=result.model_version,
            truncated=None if cut is None else bool(cut),
        )
        for labels, row, ids, cut in zip(
            result.outputs["LABELS"].rows(), scores, result.outputs["CLASS_IDS"].rows(), cuts, strict=True
        )
    ]


def top_k_tensor(rows: int, top_k: int) -> Tensor:
    return Tensor("TOP_K", "INT32", np.full((rows, 1), top_k, dtype=np.int32))


class Kind(ABC):
    """One input kind: see the module docstring."""

    task: ClassVar[str]  # the model's `gateway_task` parameter
    noun: ClassVar[str]  # what one input is called in messages ("image", "text")
    accepts: ClassVar[tuple[str, ...]]  # request media types, for /models
    oip_inputs: ClassVar[frozenset[str]]  # BYTES inputs /v2 checks by this kind's rules

    @abstractmethod
    def caps(self, config: ModelConfig, parameters: Mapping[str, str], settings: Settings) -> Caps:
        """What the model takes (from its configuration), narrowed by the settings."""

    @abstractmethod
    def count(self, payload: ClassifyInput) -> int:
        """How many inputs of this kind the payload holds (0: it holds none)."""

    @abstractmethod
    def check(self, payload: ClassifyInput, caps: Caps) -> None:
        """The checks before Triton (CPU-bound: run in the check workers). Raises ClientError."""

    # True: a call of several inputs that Triton refuses as invalid is retried an input at
    # a time (rows of every tensor), so the error names the input and the others answer.
    isolates_failures: ClassVar[bool] = False

    @abstractmethod
    def calls(self, payload: ClassifyInput, top_k: int, caps: Caps) -> list[list[Tensor]]:
        """The inputs of each Triton call this request makes, in input order (every
        tensor's first dimension is the call's inputs)."""

    @abstractmethod
    def invalid(self) -> InvalidInputError:
        """What Triton refusing a call's input as invalid means, in words for the client."""

    @abstractmethod
    def results(self, answers: Sequence[InferResult]) -> list[Classification]:
        """The answers of :meth:`calls`, in order, as one classification per input."""

    @abstractmethod
    def check_tensor(self, tensor: Tensor, caps: Caps) -> Tensor:
        """/v2: the same checks on one BYTES input of a model of this kind (returns the
        tensor to send: texts normalised)."""

    def labels_call(self, caps: Caps) -> tuple[str, list[Tensor]] | None:
        """The model to ask for the model's label list, and what to send; None: not listable."""
        return None

    def payload_bytes(self, payload: ClassifyInput) -> int:
        """The size of the work :meth:`check` does (large work leaves the event loop)."""
        return 0
