"""The rules for the names the gateway passes around, each written once: a model
version, a model name and a task. Standard library only (settings, routes, the serving
side and add-model all use them)."""

from __future__ import annotations

import re

# A Triton model version: a positive decimal number (Triton's are int64; ten digits is
# what the gateway accepts, so a path segment never becomes a huge integer).
VERSION = r"\d{1,10}"
# A model name as Triton's repository may hold it (a path segment of /v2 and /admin).
MODEL_NAME = r"[A-Za-z0-9_.\-]{1,128}"
# A model reference with an optional version: "model" or "model:3".
MODEL_REF = rf"{MODEL_NAME}(:{VERSION})?"

IMAGE_TASK = "image-classification"
TEXT_TASK = "text-classification"
TASKS = (IMAGE_TASK, TEXT_TASK)

_VERSION = re.compile(rf"^{VERSION}$")


def is_version(text: str) -> bool:
    """Whether ``text`` is a model version (digits only, at most ten)."""
    return _VERSION.match(text) is not None
