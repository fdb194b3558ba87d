"""GET /livez, /readyz and /models."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from gateway.bodies import RAW_IMAGE_TYPES
from gateway.dependencies import BackendDep, RequestIdDep, SettingsDep
from gateway.errors import PROBLEM_MEDIA_TYPE, TYPE_PREFIX
from gateway.routes.problems import problem_responses
from gateway.schemas import ComposingModel, Liveness, ModelInfo, ModelsResponse, Readiness, TritonInfo

router = APIRouter(tags=["health"])


@router.get("/livez", summary="The process is up (never calls Triton)")
async def livez() -> Liveness:
    return Liveness(status="ok")


@router.get(
    "/readyz",
    summary="Triton is live and every served model and its steps are ready",
    response_model=Readiness,
    responses=problem_responses(503),
)
async def readyz(settings: SettingsDep, backend: BackendDep, request_id: RequestIdDep) -> JSONResponse:
    server, image = await asyncio.gather(
        backend.server_status(), backend.model_status(settings.image_model, settings.image_model_version)
    )
    checks = {"triton_live": server.live, f"model:{image.name}": image.ready}
    checks.update({f"model:{step.name}": step.ready for step in image.composing})
    if all(checks.values()):
        return JSONResponse(Readiness(status="ready", checks=checks).model_dump())
    failing = ", ".join(name for name, ok in checks.items() if not ok)
    problem = {
        "type": TYPE_PREFIX + "not-ready",
        "title": "Not ready",
        "status": 503,
        "detail": f"not ready: {failing}",
        "instance": "/readyz",
        "request_id": request_id,
        "checks": checks,
    }
    return JSONResponse(
        problem,
        status_code=503,
        media_type=PROBLEM_MEDIA_TYPE,
        headers={"Retry-After": str(settings.triton.retry_after_seconds)},
    )


@router.get("/models", summary="The classifiers the gateway serves, as Triton reports them")
async def models(settings: SettingsDep, backend: BackendDep) -> ModelsResponse:
    server, image = await asyncio.gather(
        backend.server_status(), backend.model_status(settings.image_model, settings.image_model_version)
    )
    return ModelsResponse(
        triton=TritonInfo(url=settings.triton.url, live=server.live, version=server.version),
        models=[
            ModelInfo(
                name=image.name,
                task="image-classification",
                ready=image.ready,
                versions=image.versions,
                platform=image.platform,
                accepts=["multipart/form-data", "application/json", *RAW_IMAGE_TYPES],
                composing_models=[
                    ComposingModel(name=step.name, ready=step.ready, versions=step.versions)
                    for step in image.composing
                ],
            )
        ],
    )
