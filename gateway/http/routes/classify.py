"""POST /classify (the default model of each kind) and POST /models/{model}/classify."""

from __future__ import annotations

from collections.abc import Awaitable
from time import perf_counter
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import Response

from gateway.errors import GatewayError, NotFoundError, WrongInputKindError
from gateway.http.bodies import read_classify_input
from gateway.http.dependencies import GatewayState, gateway_state
from gateway.http.problems import problem_responses
from gateway.http.schemas import EXAMPLE_PNG_BASE64, ClassifyResponse, classify_response_json
from gateway.serving.catalog import CatalogEntry
from gateway.serving.kinds import kind_of
from gateway.serving.payload import ClassifyInput
from gateway.serving.validation import resolve_top_k
from gateway.settings import TOP_K_CEILING
from gateway.shared.routing import Rollout
from gateway.triton.backend import Classification

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
ModelName = Annotated[str, Path(description="A classifier of the catalog (GET /models).")]
ModelVersion = Annotated[str, Path(description="A version number of that model.")]


@router.post(
    "/classify",
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
async def classify(request: Request, top_k: TopK = None) -> Response:
    return await _classify(request, top_k, None, None)


@router.post(
    "/models/{model}/classify",
    summary="Classify with one model of the catalog",
    description="As POST /classify, with the model named: any exposed classifier (GET /models). "
    "Its kind decides what it takes: images for an image classifier, texts for a text one.",
    response_model=ClassifyResponse,
    response_model_exclude_none=True,
    responses=_RESPONSES,
    openapi_extra={"requestBody": REQUEST_BODY},
)
async def classify_with(request: Request, model: ModelName, top_k: TopK = None) -> Response:
    return await _classify(request, top_k, model, None)


@router.post(
    "/models/{model}/versions/{version}/classify",
    summary="Classify with one version of one model of the catalog",
    description="As POST /models/{model}/classify, with the version named (it overrides a pin).",
    response_model=ClassifyResponse,
    response_model_exclude_none=True,
    responses=_RESPONSES,
    openapi_extra={"requestBody": REQUEST_BODY},
)
async def classify_with_version(
    request: Request, model: ModelName, version: ModelVersion, top_k: TopK = None
) -> Response:
    if not (version.isdigit() and len(version) <= 10):
        raise NotFoundError("there is no such model version")
    return await _classify(request, top_k, model, version)


async def _classify(request: Request, top_k: int | None, model: str | None, version: str | None) -> Response:
    # The hot path: the lifespan's state is read straight from the request (no dependency
    # resolution), and the answer is serialised once, here (FastAPI does not re-validate a
    # Response; `response_model` still documents it).
    started = perf_counter()
    state = gateway_state(request)
    settings, catalog = state["settings"], state["catalog"]
    # An unknown model is refused before its body is read.
    entry = catalog.get(model) if model is not None else None
    # The body is read before admission: a slot bounds work (checks, Triton), and a slow
    # upload, bounded by the body timeout, never holds one. Refusing only once the body is
    # in also spares a client still writing it a connection reset instead of the 503.
    with state["tracing"].span("read body"):
        payload = await read_classify_input(request, settings, state["workers"])  # texts normalised here
    kind = kind_of(payload)
    if entry is None:
        entry = catalog.default(kind)
    elif entry.kind is not kind:
        raise WrongInputKindError(f"{entry.name} takes {entry.kind.noun}s ({entry.task}), not {kind.noun}s")
    request_id = state["request_id"]
    rollout = catalog.routing.rollout(entry.name)
    if rollout is None or version is not None:  # a version named explicitly is never rerouted
        state["model"] = entry.name  # the metrics' model label: catalogued names only
        k = resolve_top_k(top_k, payload.top_k, entry.caps.default_top_k, entry.caps.max_top_k)
        answers = await state["plane"].classify(
            entry,
            catalog.version(entry.name) if version is None else version,
            payload,
            k,
            request_id,
            started,
        )
        return Response(
            classify_response_json(entry.name, request_id, answers), media_type="application/json"
        )
    return await _classify_in_rollout(request, state, entry, rollout, payload, top_k, started)


def _client(request: Request) -> str | None:
    """Who a canary assignment sticks to: the API key's id, else the X-Rollout-Key header."""
    client = request.scope.get("state", {}).get("client")
    return client if client is not None else request.headers.get("x-rollout-key")


async def _classify_in_rollout(
    request: Request,
    state: GatewayState,
    entry: CatalogEntry,
    rollout: Rollout,
    payload: ClassifyInput,
    top_k: int | None,
    started: float,
) -> Response:
    catalog, plane, runner = state["catalog"], state["plane"], state["rollouts"]
    request_id = state["request_id"]
    served, arm = entry, "primary"
    if rollout.canary is not None and rollout.canary_for(entry.name, _client(request)):
        candidate = catalog.find(rollout.canary.model)
        if candidate is not None and candidate.kind is entry.kind:
            served, arm = candidate, "canary"
    version = (rollout.canary.version if arm == "canary" and rollout.canary else "") or catalog.version(
        served.name
    )
    state["model"] = served.name
    k = resolve_top_k(top_k, payload.top_k, served.caps.default_top_k, served.caps.max_top_k)
    began = perf_counter()
    try:
        answers = await plane.classify(served, version, payload, k, request_id, started)
    except GatewayError:
        runner.record(entry.name, arm, perf_counter() - began, failed=True)
        raise
    runner.record(entry.name, arm, perf_counter() - began, failed=False)
    shadow = rollout.shadow
    if shadow is not None and rollout.shadowed():
        target = catalog.find(shadow.model)
        if target is not None and target.kind is entry.kind:
            shadow_version = shadow.version or catalog.version(target.name)
            shadow_k = min(k, target.caps.max_top_k)

            def run() -> Awaitable[list[Classification]]:
                return plane.classify(
                    target, shadow_version, payload, shadow_k, request_id, perf_counter(), admitted=False
                )

            runner.shadow(entry.name, len(answers), run, answers, shadow)
    return Response(classify_response_json(served.name, request_id, answers), media_type="application/json")
