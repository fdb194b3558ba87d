"""POST /classify."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from gateway.bodies import read_classify_input
from gateway.dependencies import BackendDep, RequestIdDep, SettingsDep
from gateway.errors import ClientError
from gateway.routes.problems import problem_responses
from gateway.schemas import EXAMPLE_PNG_BASE64, ClassificationResult, ClassifyResponse, Prediction
from gateway.settings import MODEL_MAX_TOP_K
from gateway.validation import inspect_image, resolve_top_k

router = APIRouter(tags=["classify"])

_BINARY = {"schema": {"type": "string", "format": "binary"}}
REQUEST_BODY: dict[str, Any] = {
    "required": True,
    "description": "Images as multipart `file` parts, as the raw body, or base64 in JSON.",
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
            "schema": {"$ref": "#/components/schemas/ImageJSONRequest"},
            "examples": {
                "one image": {"value": {"image": EXAMPLE_PNG_BASE64, "top_k": 3}},
                "a batch": {"value": {"images": [EXAMPLE_PNG_BASE64, EXAMPLE_PNG_BASE64]}},
            },
        },
    },
}


@router.post(
    "/classify",
    summary="Classify images",
    description=(
        "Checks each image cheaply (magic bytes, size, header dimensions) and sends it to the "
        "Triton ensemble. One result per input, in input order. The declared Content-Type "
        "selects the transport only: the image format is sniffed from the bytes."
    ),
    response_model=ClassifyResponse,
    responses=problem_responses(400, 413, 415, 422, 502, 503, 504),
    openapi_extra={"requestBody": REQUEST_BODY},
)
async def classify(
    request: Request,
    settings: SettingsDep,
    backend: BackendDep,
    request_id: RequestIdDep,
    top_k: Annotated[
        int | None, Query(ge=1, le=MODEL_MAX_TOP_K, description="Predictions per input (default 5).")
    ] = None,
) -> ClassifyResponse:
    payload = await read_classify_input(request, settings)
    for index, data in enumerate(payload.images):
        try:
            inspect_image(data, settings.image)
        except ClientError as exc:
            exc.at(index)
            raise
    k = resolve_top_k(top_k, payload.top_k, settings.default_top_k, settings.max_top_k)
    answers = await backend.classify(
        settings.image_model, settings.image_model_version, payload.images, k, request_id
    )
    return ClassifyResponse(
        model=settings.image_model,
        model_version=answers[0].model_version,
        request_id=request_id,
        results=[
            ClassificationResult(
                index=index,
                predictions=[
                    Prediction(label=p.label, score=p.score, class_id=p.class_id) for p in answer.predictions
                ],
            )
            for index, answer in enumerate(answers)
        ],
    )
