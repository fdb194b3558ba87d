"""Copies of the shipped model repository for add-model's tests, and byte-for-byte
snapshots to show a refusal left a repository exactly as it was."""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path

from helpers.triton_fixtures import REPOSITORY

# Built files (networks, stamps, tokenizers) are left out: add-model builds on configs and code.
BUILT = ("*.npz", "*.onnx", "*.stamp", "tokenizer.json", "__pycache__")


def shipped_copy(root: Path, names: Iterable[str]) -> Path:
    """The shipped models ``names`` (configs and code, symlinks kept) under ``root``."""
    for name in names:
        shutil.copytree(REPOSITORY / name, root / name, symlinks=True, ignore=shutil.ignore_patterns(*BUILT))
    return root


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# The shipped text models a zero-shot text entry builds on.
TEXT_MODELS = ("text_classifier", "text_postprocess", "text_labels")


def labels(folder: Path, text: str) -> Path:
    """A labels file holding ``text``, in ``folder``."""
    path = folder / "labels.txt"
    path.write_text(text)
    return path
