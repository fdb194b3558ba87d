"""GET /livez, /readyz and /models."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from gateway.backend import InferenceBackend, ModelStatus
from gateway.bodies import RAW_IMAGE_TYPES
from gateway.dependencies import AdmissionDep, BackendDep, RequestIdDep, SettingsDep
from gateway.errors import PROBLEM_MEDIA_TYPE, TYPE_PREFIX
from gateway.routes.problems import problem_responses
from gateway.schemas import ComposingModel, Liveness, ModelInfo, ModelsResponse, Readiness, TritonInfo
from gateway.settings import ServedModel, Settings

router = APIRouter(tags=["health"])

_ACCEPTS = {
    "image-classification": ["multipart/form-data", "application/json", *RAW_IMAGE_TYPES],
    "zero-shot-text-classification": ["application/json"],
}


async def model_statuses(backend: InferenceBackend, served: list[ServedModel]) -> list[ModelStatus]:
    return list(await asyncio.gather(*(backend.model_status(m.name, m.version) for m in served)))


@router.get("/livez", summary="The process is up (never calls Triton)")
async def livez() -> Liveness:
    return Liveness(status="ok")


@router.get(
    "/readyz",
    summary="Triton is live and every served model and its steps are ready",
    response_model=Readiness,
    responses=problem_responses(503),
)
async def readyz(
    settings: SettingsDep, backend: BackendDep, admission: AdmissionDep, request_id: RequestIdDep
) -> JSONResponse:
    if admission.draining:
        checks = {"accepting": False}
    else:
        server, statuses = await asyncio.gather(
            backend.server_status(), model_statuses(backend, settings.served_models())
        )
        checks = {"accepting": True, "triton_live": server.live}
        for status in statuses:
            checks[f"model:{status.name}"] = status.ready
            checks.update({f"model:{step.name}": step.ready for step in status.composing})
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


async def _labels(settings: Settings, backend: InferenceBackend, served: ServedModel) -> list[str] | None:
    if served.task != "zero-shot-text-classification" or not settings.text_labels_model:
        return None
    return await backend.label_set(settings.text_labels_model)


@router.get("/models", summary="The classifiers the gateway serves, as Triton reports them")
async def models(settings: SettingsDep, backend: BackendDep) -> ModelsResponse:
    served = settings.served_models()
    server, statuses, labels = await asyncio.gather(
        backend.server_status(),
        model_statuses(backend, served),
        asyncio.gather(*(_labels(settings, backend, m) for m in served)),
    )
    return ModelsResponse(
        triton=TritonInfo(live=server.live, version=server.version),
        models=[
            ModelInfo(
                name=status.name,
                task=model.task,
                ready=status.ready,
                versions=status.versions,
                platform=status.platform,
                accepts=_ACCEPTS[model.task],
                composing_models=[
                    ComposingModel(name=step.name, ready=step.ready, versions=step.versions)
                    for step in status.composing
                ],
                labels=label_set,
            )
            for model, status, label_set in zip(served, statuses, labels, strict=True)
        ],
    )
