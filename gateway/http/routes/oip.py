"""The Open Inference Protocol's HTTP routes (``/v2``), for the catalog's classifiers
and the models named in ``GATEWAY_V2_MODELS``.

Same path as ``/classify`` for everything that matters in production: the body is read
with the same caps and timeout, checked before Triton (shapes, datatypes, element counts,
byte caps, and, on a classifier's BYTES inputs, the same checks of its kind as on
``/classify``), and sent through the same inference plane (admission, deadline, circuit
breaker, metrics, tracing). A model loaded through ``/admin`` is reachable here as soon
as the catalog has it, with no restart. Any other model is 404, as if it did not exist.
Errors on these routes are ``application/json`` (the protocol's media type) and carry
``error`` (the protocol's error shape, which ``tritonclient.http`` reads) besides the
problem members.
"""

from __future__ import annotations

from functools import partial
from typing import Annotated, Any

from fastapi import APIRouter, Path, Request
from fastapi.responses import Response

from gateway import __version__
from gateway.errors import ControlNotServedError, NotServedError, ShuttingDownError, TritonUnavailableError
from gateway.http.bodies import byte_count, read_json, unread_body
from gateway.http.dependencies import (
    BackendDep,
    CallerDep,
    ExposureDep,
    ReadinessDep,
    SettingsDep,
    gateway_state,
    new_call,
)
from gateway.http.paths import INFER, INFER_VERSION, OIP_PREFIX, relative
from gateway.http.problems import problem_responses as _problem_responses
from gateway.serving.caller import Caller
from gateway.serving.exposure import Exposure
from gateway.serving.oip import (
    EXTENSIONS,
    GATEWAY_NAME,
    HEADER_LENGTH,
    NOT_SERVED_CONTROL,
    NOT_SERVED_SETTINGS,
    NOT_SERVED_SHARED_MEMORY,
    SERVER_NAME,
    encode_infer_response,
    oip_bounds,
)
from gateway.serving.oipcall import OipBody
from gateway.settings import Settings


def problem_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """Errors here are application/json, the Open Inference Protocol's media type."""
    return _problem_responses(*statuses, media_type="application/json")


router = APIRouter(prefix=OIP_PREFIX, tags=["open inference protocol"])


# Unconstrained on purpose: a name off the allow-list or a version that is not a number is
# a model that does not exist (404), not a malformed request.
ModelName = Annotated[str, Path(description="A model on the gateway's allow-list.")]
ModelVersion = Annotated[str, Path(description="A version number.")]


@router.get("", summary="Server metadata (OIP)")
async def server_metadata(backend: BackendDep) -> dict[str, Any]:
    """Triton's name (what its clients check) and version, the extensions the gateway
    serves, and the gateway itself."""
    status = await backend.server_status()
    return {
        "name": SERVER_NAME,
        "version": status.version,
        "extensions": list(EXTENSIONS),
        "gateway": {"name": GATEWAY_NAME, "version": __version__},
    }


@router.get("/health/live", summary="Triton is live (OIP)", responses=problem_responses(503))
async def health_live(readiness: ReadinessDep, settings: SettingsDep) -> dict[str, bool]:
    if not await readiness.live():
        raise TritonUnavailableError("Triton is not live", retry_after=settings.triton.retry_after_seconds)
    return {"live": True}


@router.get(
    "/health/ready",
    summary="Every default and allow-listed model is ready, and the gateway is not draining (OIP)",
    responses=problem_responses(503),
)
async def health_ready(readiness: ReadinessDep, settings: SettingsDep) -> dict[str, bool]:
    if not await readiness.ready():
        if readiness.draining:
            raise ShuttingDownError(
                "the gateway is draining", retry_after=settings.triton.retry_after_seconds
            )
        raise TritonUnavailableError("a model is not ready", retry_after=settings.triton.retry_after_seconds)
    return {"ready": True}


@router.get(
    "/models/stats",
    summary="Inference statistics of every exposed model (OIP statistics extension)",
    responses=problem_responses(503),
)
async def all_statistics(exposure: ExposureDep, caller: CallerDep) -> dict[str, Any]:
    return await exposure.statistics(None, caller=caller)


@router.get(
    "/models/{model_name}/config",
    summary="Model configuration (OIP model configuration extension), as Triton's JSON less "
    "what stays private (an ensemble's steps, file names)",
    responses=problem_responses(404, 503),
)
async def model_configuration(
    model_name: ModelName, exposure: ExposureDep, caller: CallerDep
) -> dict[str, Any]:
    return await exposure.configuration(model_name, "", caller)


@router.get(
    "/models/{model_name}/versions/{model_version}/config",
    summary="Configuration of one model version (OIP model configuration extension)",
    responses=problem_responses(404, 503),
)
async def model_version_configuration(
    model_name: ModelName, model_version: ModelVersion, exposure: ExposureDep, caller: CallerDep
) -> dict[str, Any]:
    return await exposure.configuration(model_name, model_version, caller)


@router.get(
    "/models/{model_name}/stats",
    summary="Inference statistics of a model, every version (OIP statistics extension)",
    responses=problem_responses(404, 503),
)
async def model_statistics(model_name: ModelName, exposure: ExposureDep, caller: CallerDep) -> dict[str, Any]:
    return await exposure.statistics(model_name, caller=caller)


@router.get(
    "/models/{model_name}/versions/{model_version}/stats",
    summary="Inference statistics of one model version (OIP statistics extension)",
    responses=problem_responses(404, 503),
)
async def model_version_statistics(
    model_name: ModelName, model_version: ModelVersion, exposure: ExposureDep, caller: CallerDep
) -> dict[str, Any]:
    return await exposure.statistics(model_name, model_version, caller)


@router.get("/models/{model_name}", summary="Model metadata (OIP)", responses=problem_responses(404, 503))
async def model_metadata(
    model_name: ModelName, exposure: ExposureDep, backend: BackendDep, caller: CallerDep
) -> dict[str, Any]:
    exposure.target(model_name, caller=caller)  # 404 for a model that is not exposed
    return (await backend.model_signature(model_name, "")).as_json()


@router.get(
    "/models/{model_name}/versions/{model_version}",
    summary="Model metadata of one version (OIP)",
    responses=problem_responses(404, 503),
)
async def model_version_metadata(
    model_name: ModelName,
    model_version: ModelVersion,
    exposure: ExposureDep,
    backend: BackendDep,
    caller: CallerDep,
) -> dict[str, Any]:
    exposure.target(model_name, model_version, caller=caller)
    return (await backend.model_signature(model_name, model_version)).as_json()


async def _ready(
    exposure: Exposure, settings: Settings, name: str, version: str, caller: Caller
) -> dict[str, bool]:
    if not await exposure.model_ready(name, version, caller):
        raise TritonUnavailableError(
            "the model is not ready", retry_after=settings.triton.retry_after_seconds
        )
    return {"ready": True}


@router.get(
    "/models/{model_name}/ready", summary="Model readiness (OIP)", responses=problem_responses(404, 503)
)
async def model_ready(
    model_name: ModelName, exposure: ExposureDep, settings: SettingsDep, caller: CallerDep
) -> dict[str, bool]:
    return await _ready(exposure, settings, model_name, "", caller)


@router.get(
    "/models/{model_name}/versions/{model_version}/ready",
    summary="Readiness of one model version (OIP)",
    responses=problem_responses(404, 503),
)
async def model_version_ready(
    model_name: ModelName,
    model_version: ModelVersion,
    exposure: ExposureDep,
    settings: SettingsDep,
    caller: CallerDep,
) -> dict[str, bool]:
    return await _ready(exposure, settings, model_name, model_version, caller)


async def _infer(request: Request, name: str, version: str) -> Response:
    state = gateway_state(request)
    settings, tracing = state["settings"], state["tracing"]
    call = new_call(request, state)

    async def read() -> OipBody:
        json_bytes = byte_count(request.headers.get(HEADER_LENGTH), HEADER_LENGTH)
        with tracing.span("read body"):
            body = await read_json(
                request,
                settings.max_json_body_bytes,
                settings.server.body_timeout_seconds,
                partial(oip_bounds, settings),
                state["workers"],
                json_bytes,
            )
        return OipBody(body.document, body.rest, body.size)

    # the sequence both doors share (gateway.serving.oipcall); the model is the path's
    route = INFER_VERSION if version else INFER
    done = await state["oip_calls"].infer(call, route, unread_body(request), read, named=(name, version))
    answer, parsed = done.result, done.request
    outputs = list(answer.outputs.values())
    content, header_length = encode_infer_response(
        done.served.name, answer.model_version, parsed.id, outputs, parsed.binary_outputs
    )
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
    relative(INFER, OIP_PREFIX),
    summary="Inference (OIP)",
    responses=problem_responses(400, 404, 408, 413, 422, 502, 503, 504),
    openapi_extra=INFER_DOC,
)
async def infer(request: Request, model_name: ModelName) -> Response:
    return await _infer(request, model_name, "")


@router.post(
    relative(INFER_VERSION, OIP_PREFIX),
    summary="Inference on one model version (OIP)",
    responses=problem_responses(400, 404, 408, 413, 422, 502, 503, 504),
    openapi_extra=INFER_DOC,
)
async def infer_version(request: Request, model_name: ModelName, model_version: ModelVersion) -> Response:
    return await _infer(request, model_name, model_version)


# Triton's HTTP routes the gateway does not serve: refused with a problem that says so
# (counted and logged as any refusal), never "no route at this path".


@router.api_route("/systemsharedmemory/{rest:path}", methods=["GET", "POST"], include_in_schema=False)
@router.api_route("/cudasharedmemory/{rest:path}", methods=["GET", "POST"], include_in_schema=False)
async def shared_memory(rest: str) -> None:
    raise NotServedError(NOT_SERVED_SHARED_MEMORY)


@router.api_route("/trace/setting", methods=["GET", "POST"], include_in_schema=False)
@router.api_route("/models/{model_name}/trace/setting", methods=["GET", "POST"], include_in_schema=False)
@router.api_route("/logging", methods=["GET", "POST"], include_in_schema=False)
async def settings_routes() -> None:
    raise NotServedError(NOT_SERVED_SETTINGS)


@router.api_route("/repository/{rest:path}", methods=["GET", "POST"], include_in_schema=False)
async def repository(rest: str) -> None:
    raise ControlNotServedError(NOT_SERVED_CONTROL)
