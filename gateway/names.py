"""The rules for the names the gateway passes around, each written once: a model
version, a model name and a task. Standard library only (settings, routes, the serving
side and add-model all use them)."""

from __future__ import annotations

import re

# A Triton model version: a positive decimal number (Triton's are int64; ten digits is
# what the gateway accepts, so a path segment never becomes a huge integer). ASCII digits:
# Python's \d also takes other scripts' digits (a fullwidth one, U+FF11).
VERSION = r"[0-9]{1,10}"
# A model name as Triton's repository may hold it (a path segment of /v2 and /admin).
MODEL_NAME = r"[A-Za-z0-9_.\-]{1,128}"
# A model reference with an optional version: "model" or "model:3".
MODEL_REF = rf"{MODEL_NAME}(:{VERSION})?"

# The models the repository ships, by part; add-model builds on them and never overwrites one.
SHIPPED_MODELS = {
    "image": {
        "ensemble": "image_classifier",
        "preprocess": "image_preprocess",
        "model": "image_model",
        "postprocess": "image_postprocess",
    },
    "text": {
        "ensemble": "text_classifier",
        "tokenize": "text_tokenize",
        "model": "text_model",
        "postprocess": "text_postprocess",
        "labels": "text_labels",
        "embedder": "text_embedder",
    },
}
DEFAULT_IMAGE_MODEL = SHIPPED_MODELS["image"]["ensemble"]
DEFAULT_TEXT_MODEL = SHIPPED_MODELS["text"]["ensemble"]

IMAGE_TASK = "image-classification"
TEXT_TASK = "text-classification"
TASKS = (IMAGE_TASK, TEXT_TASK)

# How a classifier's network outputs become scores (its postprocess's `activation`):
# softmax (logits, one label per input), sigmoid (multi-label: each label on its own),
# none (the network already outputs scores, e.g. it ends in a softmax).
ACTIVATIONS = ("softmax", "sigmoid", "none")
DEFAULT_ACTIVATION = "softmax"

_VERSION = re.compile(VERSION)
_MODEL_NAME = re.compile(MODEL_NAME)


def is_version(text: str) -> bool:
    """Whether ``text`` is a model version (ASCII digits only, at most ten; the whole of it:
    ``re.match`` with ``$`` would let a trailing newline through)."""
    return _VERSION.fullmatch(text) is not None


def is_model_name(text: str) -> bool:
    """Whether ``text`` is a model name as Triton's repository may hold it (the whole of it)."""
    return _MODEL_NAME.fullmatch(text) is not None


# A drift reference carried by a model's configuration (add-model --reference), as JSON:
# gateway.observe.drift reads it, gateway.modelrepo.reference writes it.
REFERENCE_PARAMETER = "gateway_reference"
