"""POST /classify."""

from __future__ import annotations

from time import perf_counter
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import Response

from gateway.bodies import read_classify_input
from gateway.dependencies import gateway_state
from gateway.errors import InvalidInputError
from gateway.routes.problems import problem_responses
from gateway.schemas import EXAMPLE_PNG_BASE64, ClassifyResponse, classify_response_json
from gateway.settings import MODEL_MAX_TOP_K
from gateway.validation import inspect_images, resolve_top_k

router = APIRouter(tags=["classify"])

_BINARY = {"schema": {"type": "string", "format": "binary"}}
REQUEST_BODY: dict[str, Any] = {
    "required": True,
    "description": (
        "Images as multipart `file` parts, as the raw body, or base64 in JSON; "
        "texts in JSON (`text` or `texts`, optionally with `candidate_labels`)."
    ),
    "content": {
        "multipart/form-data": {
            "schema": {
                "type": "object",
                "required": ["file"],
                "properties": {
                    "file": {
                        "type": "array",
                        "items": {"type": "string", "format": "binary"},
                        "description": "One or more images (JPEG, PNG, WebP); answered in order.",
                    }
                },
            },
            "encoding": {"file": {"contentType": "image/jpeg, image/png, image/webp"}},
        },
        "image/jpeg": _BINARY,
        "image/png": _BINARY,
        "image/webp": _BINARY,
        "application/octet-stream": _BINARY,
        "application/json": {
            "schema": {"$ref": "#/components/schemas/ClassifyJSONRequest"},
            "examples": {
                "one text": {"value": {"text": "The striker scored twice in the final."}},
                "texts with your own labels": {
                    "value": {
                        "texts": [
                            "Whisk the eggs and fold in the flour.",
                            "Our flight to Lisbon leaves at dawn.",
                        ],
                        "candidate_labels": ["cooking", "travel"],
                        "top_k": 2,
                    }
                },
                "one image (base64)": {"value": {"image": EXAMPLE_PNG_BASE64, "top_k": 3}},
                "a batch of images": {"value": {"images": [EXAMPLE_PNG_BASE64, EXAMPLE_PNG_BASE64]}},
            },
        },
    },
}


@router.post(
    "/classify",
    summary="Classify images or texts",
    description=(
        "Images: each is checked cheaply (magic bytes, size, header dimensions) and sent to the "
        "image ensemble. Texts: validated (Unicode, NFC, control characters removed, caps) and "
        "classified zero-shot against the configured labels or `candidate_labels`. One result "
        "per input, in input order. The declared Content-Type selects the transport only: "
        "an image's format is sniffed from its bytes."
    ),
    response_model=ClassifyResponse,
    response_model_exclude_none=True,
    responses=problem_responses(400, 408, 413, 415, 422, 502, 503, 504),
    openapi_extra={"requestBody": REQUEST_BODY},
)
async def classify(
    request: Request,
    top_k: Annotated[
        int | None, Query(ge=1, le=MODEL_MAX_TOP_K, description="Predictions per input (default 5).")
    ] = None,
) -> Response:
    # The hot path: the lifespan's state is read straight from the request (no dependency
    # resolution), and the answer is serialised once, here (FastAPI does not re-validate a
    # Response; `response_model` still documents it).
    started = perf_counter()
    state = gateway_state(request)
    settings, tracing, workers = state["settings"], state["tracing"], state["workers"]
    # The body is read before admission: a slot bounds work (checks, Triton), and a slow
    # upload, bounded by the body timeout, never holds one. Refusing only once the body is
    # in also spares a client still writing it a connection reset instead of the 503.
    with tracing.span("read body"):
        payload = await read_classify_input(request, settings, workers)  # texts are normalised here
    k = resolve_top_k(top_k, payload.top_k, settings.default_top_k, settings.max_top_k)
    kind, model = ("text", settings.text_model) if payload.texts else ("image", settings.image_model)
    if not model:
        raise InvalidInputError(f"this gateway serves no {kind} model")
    state["model"] = model  # the metrics' model label
    request_id, backend, metrics = state["request_id"], state["backend"], state["metrics"]
    version = state["served"].version(model)
    # the span covers the wait for an in-flight slot (the gateway's queue)
    async with state["admission"].slot(waiting=tracing.span("admission")):
        if payload.images:
            with tracing.span("validate images", {"gateway.inputs": len(payload.images)}):
                await workers.run(
                    sum(map(len, payload.images)), inspect_images, payload.images, settings.image
                )
        metrics.validation_duration.labels(model=model).observe(perf_counter() - started)
        metrics.inputs.labels(model=model).observe(len(payload.texts or payload.images))
        if payload.texts:
            answers = await backend.classify_texts(
                model, version, payload.texts, k, payload.candidate_labels, request_id
            )
        else:
            answers = await backend.classify_images(model, version, payload.images, k, request_id)
    return Response(classify_response_json(model, request_id, answers), media_type="application/json")
