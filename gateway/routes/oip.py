"""The Open Inference Protocol's HTTP routes (``/v2``), for the models on the allow-list.

Same path as ``/classify`` for everything that matters in production: the body is read
with the same caps and timeout, checked before Triton (shapes, datatypes, element counts,
byte caps, and the gateway's own image and text checks on the served ensembles' BYTES
inputs), sent over the same gRPC channel under the same admission control, deadline,
circuit breaker, metrics and tracing. Models off the allow-list are 404, as if they did
not exist. Problem bodies on these routes also carry ``error`` (the protocol's error
shape, which ``tritonclient.http`` reads).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Request
from fastapi.responses import Response

from gateway import __version__
from gateway.admission import Admission
from gateway.backend import InferenceBackend
from gateway.bodies import limited_body
from gateway.dependencies import (
    AdmissionDep,
    BackendDep,
    RequestIdDep,
    SettingsDep,
    TracingDep,
    WorkersDep,
)
from gateway.errors import InvalidInputError, NotFoundError, TritonUnavailableError
from gateway.oip import (
    HEADER_LENGTH,
    BytesCheck,
    Caps,
    Tensor,
    encode_infer_response,
    parse_infer_request,
    split_body,
)
from gateway.routes.problems import problem_responses
from gateway.settings import Settings
from gateway.tracing import Tracing
from gateway.validation import check_count, inspect_images, normalize_text
from gateway.workers import CheckWorkers

router = APIRouter(prefix="/v2", tags=["open inference protocol"])

# Unconstrained on purpose: a name off the allow-list or a version that is not a number is
# a model that does not exist (404), not a malformed request.
ModelName = Annotated[str, Path(description="A model on the gateway's allow-list.")]
ModelVersion = Annotated[str, Path(description="A version number.")]


def allowed(settings: Settings, name: str, version: str = "") -> str:
    """The model if it is on the allow-list; otherwise 404, exactly as an unknown model."""
    if name not in settings.oip_models() or not (version == "" or (version.isdigit() and len(version) <= 10)):
        raise NotFoundError("there is no such model")
    return name


@router.get("", summary="Server metadata (OIP)")
async def server_metadata(backend: BackendDep) -> dict[str, Any]:
    status = await backend.server_status()
    return {
        "name": "triton-gateway",
        "version": __version__,
        "triton_version": status.version,
        "extensions": ["binary_tensor_data"],
    }


@router.get("/health/live", summary="Triton is live (OIP)", responses=problem_responses(503))
async def health_live(backend: BackendDep) -> dict[str, bool]:
    if not (await backend.server_status()).live:
        raise TritonUnavailableError("Triton is not live", headers={"Retry-After": "1"})
    return {"live": True}


@router.get(
    "/health/ready", summary="Every allow-listed model is ready (OIP)", responses=problem_responses(503)
)
async def health_ready(settings: SettingsDep, backend: BackendDep) -> dict[str, bool]:
    statuses = await asyncio.gather(*(backend.model_status(m, "") for m in settings.oip_models()))
    if not all(s.ready for s in statuses):
        raise TritonUnavailableError("a model is not ready", headers={"Retry-After": "1"})
    return {"ready": True}


@router.get("/models/{model_name}", summary="Model metadata (OIP)", responses=problem_responses(404, 503))
async def model_metadata(model_name: ModelName, settings: SettingsDep, backend: BackendDep) -> dict[str, Any]:
    return (await backend.model_signature(allowed(settings, model_name), "")).as_json()


@router.get(
    "/models/{model_name}/versions/{model_version}",
    summary="Model metadata of one version (OIP)",
    responses=problem_responses(404, 503),
)
async def model_version_metadata(
    model_name: ModelName, model_version: ModelVersion, settings: SettingsDep, backend: BackendDep
) -> dict[str, Any]:
    return (
        await backend.model_signature(allowed(settings, model_name, model_version), model_version)
    ).as_json()


async def _ready(settings: Settings, backend: InferenceBackend, name: str, version: str) -> dict[str, bool]:
    model = allowed(settings, name, version)
    if version:
        await backend.model_signature(model, version)  # an unknown version is 404, not "not ready"
    status = await backend.model_status(model, version)
    if not status.ready:
        raise TritonUnavailableError("the model is not ready", headers={"Retry-After": "1"})
    return {"ready": True}


@router.get(
    "/models/{model_name}/ready", summary="Model readiness (OIP)", responses=problem_responses(404, 503)
)
async def model_ready(model_name: ModelName, settings: SettingsDep, backend: BackendDep) -> dict[str, bool]:
    return await _ready(settings, backend, model_name, "")


@router.get(
    "/models/{model_name}/versions/{model_version}/ready",
    summary="Readiness of one model version (OIP)",
    responses=problem_responses(404, 503),
)
async def model_version_ready(
    model_name: ModelName, model_version: ModelVersion, settings: SettingsDep, backend: BackendDep
) -> dict[str, bool]:
    return await _ready(settings, backend, model_name, model_version)


def _bytes_checks(settings: Settings, model: str) -> BytesCheck:
    """The gateway's own checks on a served ensemble's BYTES inputs: images as on
    /classify, texts and candidate labels by the text rule. Returns the elements to send
    (texts normalised)."""

    def check(name: str, elements: list[bytes]) -> list[bytes]:
        if model == settings.image_model and name == "IMAGE":
            check_count(len(elements), settings.image.max_images, "images")
            inspect_images(elements, settings.image)
            return elements
        if model == settings.text_model and name in ("TEXT", "CANDIDATE_LABELS"):
            limit, what = (
                (settings.text.max_chars, "a text")
                if name == "TEXT"
                else (settings.text.max_label_chars, "a candidate label")
            )
            out = []
            for element in elements:
                try:
                    text = element.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise InvalidInputError(f"{what} is not valid UTF-8") from exc
                out.append(normalize_text(text, limit, what).encode("utf-8"))
            return out
        return elements

    return check


def _check_top_k(settings: Settings, inputs: list[Tensor]) -> None:
    for tensor in inputs:
        if tensor.name == "TOP_K" and ((tensor.array < 1).any() or (tensor.array > settings.max_top_k).any()):
            raise InvalidInputError(f"TOP_K must be between 1 and {settings.max_top_k}")


def _caps(settings: Settings) -> Caps:
    """What one /v2 request may hold: the largest image batch or text request the
    gateway's caps allow, and the JSON body cap."""
    return Caps(
        max_tensor_bytes=max(
            settings.image.max_bytes * settings.image.max_images, settings.max_text_body_bytes
        ),
        max_request_bytes=settings.max_json_body_bytes,
        max_batch=max(settings.image.max_images, settings.text.max_texts),
    )


@dataclass(frozen=True)
class InferContext:
    """What an inference route needs from the app, as one dependency."""

    settings: Settings
    backend: InferenceBackend
    workers: CheckWorkers
    admission: Admission
    tracing: Tracing
    request_id: str


async def _infer_context(
    settings: SettingsDep,
    backend: BackendDep,
    workers: WorkersDep,
    admission: AdmissionDep,
    tracing: TracingDep,
    request_id: RequestIdDep,
) -> InferContext:
    return InferContext(settings, backend, workers, admission, tracing, request_id)


InferContextDep = Annotated[InferContext, Depends(_infer_context)]


async def _infer(request: Request, name: str, version: str, context: InferContext) -> Response:
    settings, backend, tracing = context.settings, context.backend, context.tracing
    model = allowed(settings, name, version)
    request.state.model = model  # the metrics' model label
    with tracing.span("read body"):
        body = await limited_body(request, settings.max_json_body_bytes, settings.server.body_timeout_seconds)
    signature = await backend.model_signature(model, version)
    with tracing.span("validate tensors"):
        header, binary = split_body(body, request.headers.get(HEADER_LENGTH))
        parsed = await context.workers.run(
            len(body),
            parse_infer_request,
            header,
            binary,
            signature,
            _caps(settings),
            _bytes_checks(settings, model),
        )
        _check_top_k(settings, parsed.inputs)
    async with context.admission.slot(waiting=tracing.span("admission")):
        answered, outputs = await backend.infer_tensors(
            model, version, parsed.inputs, parsed.outputs, context.request_id
        )
    content, header_length = encode_infer_response(model, answered, parsed.id, outputs, parsed.binary_outputs)
    if header_length is None:
        return Response(content, media_type="application/json")
    return Response(
        content, media_type="application/octet-stream", headers={HEADER_LENGTH: str(header_length)}
    )


INFER_DOC = {
    "requestBody": {
        "required": True,
        "description": "An OIP inference request: JSON, or with the binary tensor extension a JSON "
        "header of Inference-Header-Content-Length bytes followed by the binary tensors.",
        "content": {
            "application/json": {"schema": {"type": "object", "required": ["inputs"]}},
            "application/octet-stream": {"schema": {"type": "string", "format": "binary"}},
        },
    }
}


@router.post(
    "/models/{model_name}/infer",
    summary="Inference (OIP)",
    responses=problem_responses(400, 404, 408, 413, 422, 502, 503, 504),
    openapi_extra=INFER_DOC,
)
async def infer(request: Request, model_name: ModelName, context: InferContextDep) -> Response:
    return await _infer(request, model_name, "", context)


@router.post(
    "/models/{model_name}/versions/{model_version}/infer",
    summary="Inference on one model version (OIP)",
    responses=problem_responses(400, 404, 408, 413, 422, 502, 503, 504),
    openapi_extra=INFER_DOC,
)
async def infer_version(
    request: Request, model_name: ModelName, model_version: ModelVersion, context: InferContextDep
) -> Response:
    return await _infer(request, model_name, model_version, context)
