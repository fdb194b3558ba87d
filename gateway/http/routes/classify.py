"""POST /classify (the default model of each kind) and POST /models/{model}/classify."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import Response

from gateway.errors import InvalidInputError
from gateway.http.bodies import read_classify_input, unread_body
from gateway.http.dependencies import gateway_state, new_call
from gateway.http.paths import CLASSIFY, CLASSIFY_MODEL, CLASSIFY_VERSION, classify_template
from gateway.http.problems import problem_responses
from gateway.http.schemas import EXAMPLE_PNG_BASE64, ClassifyResponse, classify_response_json
from gateway.http.tasks import task_response
from gateway.serving.predictions import logged
from gateway.serving.tasks import classify_every_class
from gateway.settings import TOP_K_CEILING

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


_RESPONSES = problem_responses(400, 404, 408, 413, 415, 422, 502, 503, 504)
TopK = Annotated[
    int | None,
    Query(
        ge=1,
        le=TOP_K_CEILING,
        description="Predictions per input (default 5; at most the model's max_top_k).",
    ),
]
Threshold = Annotated[
    float | None,
    Query(
        gt=0,
        le=1,
        description="Only labels scoring at least this, best first: at most top_k of them when top_k "
        "is given, else at most the model's max_top_k; possibly none.",
    ),
]
ModelName = Annotated[str, Path(description="A classifier of the catalog (GET /models).")]
ModelVersion = Annotated[str, Path(description="A version number of that model.")]


@router.post(
    CLASSIFY,
    summary="Classify images or texts with the default model of their kind",
    description=(
        "Images: each is checked cheaply (magic bytes, size, header dimensions) and sent to the "
        "default image classifier. Texts: validated (Unicode, NFC, control characters removed, caps) "
        "and sent to the default text classifier, which classifies them against its configured "
        "labels or `candidate_labels`. One result per input, in input order. The declared "
        "Content-Type selects the transport only: an image's format is sniffed from its bytes."
    ),
    response_model=ClassifyResponse,
    response_model_exclude_none=True,
    responses=_RESPONSES,
    openapi_extra={"requestBody": REQUEST_BODY},
)
async def classify(request: Request, top_k: TopK = None, threshold: Threshold = None) -> Response:
    return await classify_request(request, top_k, threshold, None, None)


@router.post(
    CLASSIFY_MODEL,
    summary="Classify with one model of the catalog",
    description="As POST /classify, with the model named: any exposed classifier (GET /models). "
    "Its kind decides what it takes: images for an image classifier, texts for a text one.",
    response_model=ClassifyResponse,
    response_model_exclude_none=True,
    responses=_RESPONSES,
    openapi_extra={"requestBody": REQUEST_BODY},
)
async def classify_with(
    request: Request, model: ModelName, top_k: TopK = None, threshold: Threshold = None
) -> Response:
    return await classify_request(request, top_k, threshold, model, None)


@router.post(
    CLASSIFY_VERSION,
    summary="Classify with one version of one model of the catalog",
    description="As POST /models/{model}/classify, with the version named (it overrides a pin).",
    response_model=ClassifyResponse,
    response_model_exclude_none=True,
    responses=_RESPONSES,
    openapi_extra={"requestBody": REQUEST_BODY},
)
async def classify_with_version(
    request: Request, model: ModelName, version: ModelVersion, top_k: TopK = None, threshold: Threshold = None
) -> Response:
    return await classify_request(request, top_k, threshold, model, version)


async def classify_request(
    request: Request, top_k: int | None, threshold: float | None, model: str | None, version: str | None
) -> Response:
    # The hot path: the lifespan's state is read straight from the request (no dependency
    # resolution), and the answer is serialised once, here (FastAPI does not re-validate a
    # Response; `response_model` still documents it).
    state = gateway_state(request)
    call = new_call(request, state)
    dispatcher = state["dispatcher"]
    async with logged(state["prediction_log"], call, classify_template(model, version)):
        # an unknown model (or one the caller may not use) is refused before its body is read
        dispatcher.check_model(model, version, call.caller)
        # The body is read before admission: a slot bounds work (checks, Triton), and a slow
        # upload, bounded by the body timeout, never holds one. Refusing only once the body is
        # in also spares a client still writing it a connection reset instead of the 503. A
        # client that asked `Expect: 100-continue` is refused unsent when the gateway is full.
        async with dispatcher.before_body(call, unread_body(request)) as upload:
            with state["tracing"].span("read body"):
                payload = await read_classify_input(request, state["settings"], state["workers"])
            upload.done()
            if payload.task_model is not None:  # vLLM's body: vLLM's answer
                if model is not None or top_k is not None or threshold is not None:
                    raise InvalidInputError(
                        "a body of 'model' and 'input' (vLLM's) goes to POST /classify or /v1/classify, "
                        "without top_k or threshold: it answers every class"
                    )
                answer, rows = await classify_every_class(dispatcher, payload.task_model, payload.texts, call)
                return task_response(call.request_id, answer, rows)
            answer = await dispatcher.classify(
                payload, call, model=model, version=version, top_k=top_k, threshold=threshold
            )
    body = classify_response_json(answer.model, call.request_id, answer.classifications)
    return Response(body, media_type="application/json")
