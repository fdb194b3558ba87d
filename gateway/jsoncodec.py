"""JSON on the hot path, through orjson (the one module that imports it).

Parsing is orjson's where it accepts the document; what it refuses (NaN, a lone surrogate,
a 100-digit integer, deep nesting) raises, and the caller lets the standard library judge
it, so every refusal reads as before. Writing is compact UTF-8 (non-ASCII characters as
themselves), the form the gateway's answers always had.
"""

from __future__ import annotations

from typing import Any

import orjson


def loads(data: bytes | bytearray | memoryview) -> Any:
    """The document in ``data``; raises ValueError for anything orjson refuses."""
    return orjson.loads(data)


def dumps(document: Any) -> bytes:
    """``document`` (dicts, lists, str, int, float, bool, None) as compact UTF-8 JSON."""
    return orjson.dumps(document)
