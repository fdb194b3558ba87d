"""What every classifier add-model writes does alike: the shipped code linked rather than
copied, and the shared logits step (``image_postprocess``: scores by activation, top-k,
labels) configured for a network's classes."""

from __future__ import annotations

from pathlib import Path

from gateway.errors import ConfigurationError
from gateway.names import ACTIVATIONS, SHIPPED_MODELS
from gateway.triton import pbtxt

POSTPROCESS = SHIPPED_MODELS["image"]["postprocess"]


def check_activation(activation: str, error: type[ConfigurationError]) -> None:
    """``--activation`` is one the shipped logits step knows."""
    if activation not in ACTIVATIONS:
        raise error(f"--activation must be one of {', '.join(ACTIVATIONS)}, not {activation!r}")


def link_code(
    staging: Path, repository: Path, part: str, shipped: str, error: type[ConfigurationError]
) -> None:
    """NAME_part/1/model.py -> ../../SHIPPED/1/model.py (the shipped code, not a copy)."""
    if not (repository / shipped / "1" / "model.py").exists():
        raise error(f"{repository} has no {shipped}/1/model.py: add-model builds on the shipped models")
    (staging / part / "1" / "model.py").symlink_to(Path("..") / ".." / shipped / "1" / "model.py")


def stage_postprocess(
    repository: Path,
    staging: Path,
    part: str,
    labels: list[str],
    *,
    max_batch: int,
    max_top_k: int,
    activation: str,
    origin: str,
    error: type[ConfigurationError],
) -> None:
    """``part`` (in ``staging``): the shipped logits step for ``labels`` (one class each),
    its labels.txt, and its code linked."""
    source = repository / POSTPROCESS / "config.pbtxt"
    if not source.is_file():
        raise error(f"{repository} has no {POSTPROCESS}: add-model builds on the shipped models")
    post = pbtxt.read_config(source)
    post.name = part
    post.max_batch_size = max_batch
    pbtxt.set_tensor(post.input, "LOGITS", "LOGITS", [len(labels)])
    pbtxt.set_parameter(post, "labels_file", "labels.txt")
    pbtxt.set_parameter(post, "max_top_k", str(max_top_k))
    pbtxt.set_parameter(post, "activation", activation)
    (staging / part / "config.pbtxt").write_text(pbtxt.render(post, origin))
    (staging / part / "labels.txt").write_text("".join(f"{label}\n" for label in labels))
    link_code(staging, repository, part, POSTPROCESS, error)
