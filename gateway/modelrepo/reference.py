"""A drift reference from a validation set's predictions (``add-model --reference FILE``),
carried by the model's own configuration (the ``gateway_reference`` parameter of its
ensemble), so every gateway that serves the model has it, wherever Triton runs.

The file is JSON lines, one classified input a line, either of:

- ``{"label": "tabby", "score": 0.91}`` (the top-1 answer);
- a ``POST /classify`` answer, ``{"results": [{"predictions": [{"label": ..., "score": ...}]}]}``
  (each result's first prediction is its top-1).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from gateway.errors import ConfigurationError
from gateway.names import REFERENCE_PARAMETER
from gateway.observe.drift import Distribution, Reference, score_bin
from gateway.triton import pbtxt

MAX_LABELS = 10_000
MAX_DOCUMENT_BYTES = 512 * 1024  # a config.pbtxt Triton reads at every load
MIN_INPUTS = 10


class ReferenceFileError(ConfigurationError):
    """A predictions file that does not make a reference (the message names the line)."""


def _top1(item: Any, where: str) -> list[tuple[str, float]]:
    if isinstance(item, dict) and "results" in item:
        results = item["results"]
        if not isinstance(results, list):
            raise ReferenceFileError(f"{where}: 'results' must be a list")
        found = []
        for result in results:
            predictions = result.get("predictions") if isinstance(result, dict) else None
            if not isinstance(predictions, list) or not predictions:
                raise ReferenceFileError(f"{where}: each result needs its 'predictions'")
            found.extend(_top1(predictions[0], where))
        return found
    if not isinstance(item, dict):
        raise ReferenceFileError(f'{where}: expected {{"label": ..., "score": ...}} or a /classify answer')
    label, score = item.get("label"), item.get("score")
    if not isinstance(label, str) or not label or len(label) > 1000:
        raise ReferenceFileError(f"{where}: 'label' must be a non-empty string")
    if isinstance(score, bool) or not isinstance(score, int | float) or not math.isfinite(score):
        raise ReferenceFileError(f"{where}: 'score' must be a number")
    if not 0 <= score <= 1:
        raise ReferenceFileError(f"{where}: 'score' must be between 0 and 1")
    return [(label, float(score))]


def read_reference(path: Path) -> str:
    """The reference of the predictions in ``path``, as the parameter's compact JSON."""
    distribution = Distribution()
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ReferenceFileError(f"{path}: cannot be read as UTF-8 text ({exc})") from exc
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            item = json.loads(line)
        except ValueError as exc:
            raise ReferenceFileError(f"{where}: not JSON ({exc.args[0]})") from exc
        for label, score in _top1(item, where):
            distribution.labels[label] += 1
            distribution.scores[score_bin(score)] += 1
    if distribution.inputs < MIN_INPUTS:
        raise ReferenceFileError(
            f"{path}: {distribution.inputs} predictions; a reference needs {MIN_INPUTS} or more"
        )
    if len(distribution.labels) > MAX_LABELS:
        raise ReferenceFileError(f"{path}: {len(distribution.labels)} distinct labels; at most {MAX_LABELS}")
    reference = Reference(distribution, captured_at=path.stat().st_mtime, source="model-config")
    document = json.dumps(reference.as_json(), separators=(",", ":"), ensure_ascii=False)
    if len(document.encode()) > MAX_DOCUMENT_BYTES:
        raise ReferenceFileError(f"{path}: the reference takes over {MAX_DOCUMENT_BYTES // 1024} KiB")
    return document


def attach_reference(config_path: Path, document: str) -> None:
    """Set the ``gateway_reference`` parameter of the configuration at ``config_path``
    (its leading comment kept)."""
    config = pbtxt.read_config(config_path)
    pbtxt.set_parameter(config, REFERENCE_PARAMETER, document)
    lines = config_path.read_text(encoding="utf-8").splitlines()
    header = "\n".join(line.removeprefix("#").removeprefix(" ") for line in lines if line.startswith("#"))
    config_path.write_text(pbtxt.render(config, header), encoding="utf-8")
