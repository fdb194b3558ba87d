"""What a classification request carries once its transport is removed: the inputs of
one kind (images or texts) and what the client asked for. The HTTP side
(:mod:`gateway.http.bodies`) builds it; the serving side never sees a request."""

from __future__ import annotations

from dataclasses import dataclass, field

# Raw bodies that are one image (their format is sniffed from the bytes, not the type).
RAW_IMAGE_TYPES = ("image/jpeg", "image/png", "image/webp", "application/octet-stream")


@dataclass(frozen=True)
class ClassifyInput:
    """What the client sent, transport removed: images or texts, never both."""

    images: list[bytes] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    candidate_labels: list[str] | None = None
    top_k: int | None = None
    threshold: float | None = None  # only labels scoring at least this (0 < t <= 1)
    # vLLM's /classify body ({"model", "input"}): the model it names, answered in its shape
    task_model: str | None = None
