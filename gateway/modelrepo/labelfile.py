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
