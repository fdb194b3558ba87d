"""OpenAPI declarations of the problem+json responses routes can give, rendered from the
error classes themselves (type, title and status can never disagree with what is sent)."""

from __future__ import annotations

from typing import Any

from gateway.errors import (
    PROBLEM_MEDIA_TYPE,
    ConflictError,
    GatewayError,
    ImageTooLargeError,
    InvalidImageError,
    MalformedRequestError,
    NotFoundError,
    RequestTimeoutError,
    TritonFailureError,
    TritonTimeoutError,
    TritonUnavailableError,
    UnauthorizedError,
    UnsupportedImageFormatError,
)

# Per status: what it means on the routes, and one example of it (an instance of the
# class that answers it).
_EXAMPLES: dict[int, tuple[str, GatewayError]] = {
    400: ("Malformed JSON, multipart or base64.", MalformedRequestError("the body is not valid JSON")),
    401: ("No key, or not one of the keys.", UnauthorizedError("send a valid API key")),
    404: (
        "No such model (not in the catalog, or not exposed).",
        NotFoundError("there is no such model"),
    ),
    408: (
        "The body did not arrive within the body read timeout.",
        RequestTimeoutError("the body did not arrive within 30 s"),
    ),
    409: (
        "Not possible in the model's state (reload of a model not loaded, pin to a version not ready), "
        "or Triton could not load the model (model-load-failed, with Triton's reason).",
        ConflictError("text_classifier version 3 is not ready in Triton"),
    ),
    413: (
        "Body, image bytes, image or text count, pixel, side or frame cap exceeded (the model's caps).",
        ImageTooLargeError("50000x50000 has a side over the 16384 pixel limit"),
    ),
    415: (
        "Content-Type not accepted, or the bytes are not an image format the model takes.",
        UnsupportedImageFormatError("the data is TIFF, which is not accepted; send JPEG, PNG, WEBP"),
    ),
    422: (
        "Well-formed but invalid: empty input, bad top_k, NaN, wrong types, an input of the wrong kind "
        "for the model (wrong-input-kind), or an image the model could not decode (invalid-image).",
        InvalidImageError("the model's preprocessing rejected the input (corrupt or truncated data)"),
    ),
    502: ("Triton failed.", TritonFailureError("Triton failed to process the request")),
    503: (
        "Triton or the model is unavailable (loading, unloaded), the gateway is overloaded or shutting "
        "down, or not ready; see Retry-After.",
        TritonUnavailableError("Triton or the model is not available"),
    ),
    504: ("Triton did not answer within the deadline.", TritonTimeoutError("Triton did not answer in time")),
}


def problem_responses(
    *statuses: int, media_type: str = PROBLEM_MEDIA_TYPE
) -> dict[int | str, dict[str, Any]]:
    """The responses of ``statuses``; ``media_type`` is what the routes answer errors in
    (the /v2 routes: application/json, the protocol's)."""
    responses: dict[int | str, dict[str, Any]] = {}
    for status in statuses:
        description, error = _EXAMPLES[status]
        example = error.problem("0f5c2d1e9b7a4c3d8e6f1a2b3c4d5e6f", "/classify")
        responses[status] = {
            "description": description,
            "content": {media_type: {"schema": {"$ref": "#/components/schemas/Problem"}, "example": example}},
        }
    return responses
