"""Label files: zero-shot text classifiers' (``label`` or ``label: prompt`` a line) and
image classifiers' (one class name a line, line n naming class n - 1).

Read by the model build (``deploy/model-build/build.py``, the shipped label set) and by
``triton-gateway add-model`` (a user's). Standard library only: the model build imports it
from its own environment.
"""

from __future__ import annotations

from pathlib import Path

DEFAULT_PROMPT = "This text is about {label}."


class LabelFileError(ValueError):
    """A label file that does not describe a usable label set (the message names the line)."""


def read_label_file(path: Path) -> list[tuple[str, str]]:
    """(name, prompt) per label: `label` or `label: prompt` a line; blank lines and #
    comments ignored; at least two labels, each named once."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise LabelFileError(f"{path}: cannot be read as UTF-8 text ({exc.__class__.__name__})") from exc
    labels: list[tuple[str, str]] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, _, prompt = line.partition(":")
        name, prompt = name.strip(), prompt.strip()
        if not name:
            raise LabelFileError(f"{path}:{number}: a label needs a name")
        if any(name == known for known, _ in labels):
            raise LabelFileError(f"{path}:{number}: label {name!r} is listed twice")
        labels.append((name, prompt or DEFAULT_PROMPT.format(label=name)))
    if len(labels) < 2:
        raise LabelFileError(f"{path}: at least two labels are needed, found {len(labels)}")
    return labels


def read_class_labels(path: Path) -> list[str]:
    """An image classifier's class names: one a line, line n naming class id n - 1, so
    no line may be empty (blank lines at the end are ignored); each name once."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise LabelFileError(f"{path}: cannot be read as UTF-8 text ({exc.__class__.__name__})") from exc
    names = [line.strip() for line in text.rstrip().splitlines()]
    seen: dict[str, int] = {}
    for number, name in enumerate(names, start=1):
        if not name:
            raise LabelFileError(f"{path}:{number}: empty line (line n names class n - 1)")
        if name in seen:
            raise LabelFileError(f"{path}:{number}: label {name!r} is listed twice (line {seen[name]})")
        seen[name] = number
    if len(names) < 2:
        raise LabelFileError(f"{path}: at least two labels are needed, found {len(names)}")
    return names


def read_id2label(path: Path) -> list[str]:
    """A Hugging Face model directory's ``config.json`` labels (``id2label``), in class id
    order: ids 0..n-1, each once, each name once and not empty."""
    import json

    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise LabelFileError(f"{path}: cannot be read as JSON ({exc.__class__.__name__})") from exc
    mapping = config.get("id2label") if isinstance(config, dict) else None
    if not isinstance(mapping, dict) or not mapping:
        raise LabelFileError(
            f"{path} has no id2label (a fine-tuned classifier's config.json lists its labels there)"
        )
    try:
        ids = sorted(int(key) for key in mapping)
    except ValueError:
        raise LabelFileError(f"{path}: id2label's keys must be class ids (0, 1, ...)") from None
    if ids != list(range(len(ids))):
        raise LabelFileError(f"{path}: id2label's ids must be 0..{len(ids) - 1}, each once; found {ids[:10]}")
    names = [str(mapping[str(i)] if str(i) in mapping else mapping[i]).strip() for i in ids]
    if any(not name for name in names):
        raise LabelFileError(f"{path}: id2label has an empty label")
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise LabelFileError(f"{path}: id2label names {', '.join(map(repr, repeated))} more than once")
    if len(names) < 2:
        raise LabelFileError(f"{path}: at least two labels are needed, found {len(names)}")
    return names
