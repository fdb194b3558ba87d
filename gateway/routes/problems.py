"""OpenAPI declarations of the problem+json responses routes can give."""

from __future__ import annotations

from typing import Any

from gateway.errors import PROBLEM_MEDIA_TYPE, TYPE_PREFIX

_DESCRIPTIONS: dict[int, tuple[str, str, str]] = {
    400: ("Malformed JSON, multipart or base64.", "malformed-request", "the body is not valid JSON"),
    401: ("No admin key, or not one of the admin keys.", "unauthorized", "send a valid API key"),
    409: (
        "Not possible in the model's state (reload of a model not loaded, pin to a version not ready), "
        "or Triton could not load the model (model-load-failed, with Triton's reason).",
        "conflict",
        "text_classifier version 3 is not ready in Triton",
    ),
    404: ("No such model (or not on the /v2 allow-list).", "not-found", "there is no such model"),
    408: (
        "The body did not arrive within the body read timeout.",
        "request-timeout",
        "the body did not arrive within 30 s",
    ),
    413: (
        "Body, image bytes, image count, pixel, side or frame cap exceeded.",
        "image-too-large",
        "50000x50000 has a side over the 16384 pixel limit",
    ),
    415: (
        "Content-Type not accepted, or the bytes are not JPEG, PNG or WebP.",
        "unsupported-image-format",
        "the data is TIFF, which is not accepted; send JPEG, PNG, WEBP",
    ),
    422: (
        "Well-formed but invalid: empty input, bad top_k, NaN, wrong types, or an image the model could not decode.",
        "invalid-image",
        "the model's preprocessing rejected the input (corrupt or truncated data)",
    ),
    502: ("Triton failed.", "triton-failure", "Triton failed to process the request"),
    503: (
        "Triton or the model is unavailable, the gateway is overloaded or shutting down; see Retry-After.",
        "triton-unavailable",
        "Triton or the model is not available",
    ),
    504: ("Triton did not answer within the deadline.", "triton-timeout", "Triton did not answer in time"),
}


def problem_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    responses: dict[int | str, dict[str, Any]] = {}
    for status in statuses:
        description, slug, detail = _DESCRIPTIONS[status]
        example = {
            "type": TYPE_PREFIX + slug,
            "title": slug.replace("-", " ").capitalize(),
            "status": status,
            "detail": detail,
            "instance": "/classify",
            "request_id": "0f5c2d1e9b7a4c3d8e6f1a2b3c4d5e6f",
        }
        responses[status] = {
            "description": description,
            "content": {
                PROBLEM_MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}, "example": example}
            },
        }
    return responses
