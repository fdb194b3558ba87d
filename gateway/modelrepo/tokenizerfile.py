"""What a Hugging Face ``tokenizer.json`` says: the one place add-model uses the
``tokenizers`` library (never while serving; Triton's tokenize step loads the same file
with the same library).

``tokenizers`` is an optional dependency (``pip install 'triton-gateway[models]'``):
imported when a file is read, its absence a clear error.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gateway.errors import ConfigurationError


class TokenizerFileError(ConfigurationError):
    """The file is not a tokenizer this command can use (the message says why)."""


@dataclass(frozen=True)
class TokenizerInfo:
    path: Path
    model: str  # WordPiece, BPE, Unigram, WordLevel
    vocabulary: int  # ids the tokenizer can emit, added tokens included
    max_id: int  # the largest of them


def read_tokenizer(path: Path) -> TokenizerInfo:
    """Load ``path`` as the tokenize step will, and encode a probe text with it."""
    try:
        from tokenizers import Tokenizer
    except ImportError as exc:  # pragma: no cover - the dev and models extras have it
        raise TokenizerFileError(
            "reading tokenizer files needs the tokenizers package: pip install 'triton-gateway[models]'"
        ) from exc
    if not path.is_file():
        raise TokenizerFileError(f"{path}: no such file")
    try:
        tokenizer = Tokenizer.from_file(str(path))
        tokenizer.encode("A probe, with punctuation and 123 digits.")
    except Exception as exc:  # tokenizers raises plain Exception subclasses with messages
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TokenizerFileError(
            f"{path}: not a Hugging Face tokenizer.json the tokenizers library loads ({reason[:200]})"
        ) from exc
    vocabulary = tokenizer.get_vocab(with_added_tokens=True)
    kind = type(tokenizer.model).__name__
    return TokenizerInfo(path, kind, len(vocabulary), max(vocabulary.values(), default=-1))
