"""GET /livez, /readyz and /models."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from gateway.backend import InferenceBackend, ModelStatus
from gateway.bodies import RAW_IMAGE_TYPES
from gateway.dependencies import AdmissionDep, BackendDep, RequestIdDep, ServedDep, SettingsDep
from gateway.errors import PROBLEM_MEDIA_TYPE, TYPE_PREFIX, GatewayError
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


async def unloaded_models(backend: InferenceBackend, statuses: list[ModelStatus]) -> set[str]:
    """Which of the models that are not ready Triton says were unloaded on purpose (asked
    only when one is not ready; an index Triton will not give means none)."""
    if all(status.ready for status in statuses):
        return set()
    try:
        index = await backend.repository_index()
    except GatewayError:
        return set()
    down = {status.name for status in statuses if not status.ready}
    ready = {m.name for m in index if m.state == "READY"}
    return {m.name for m in index if m.unloaded and m.name in down and m.name not in ready}


@router.get(
    "/readyz",
    summary="Triton is live and every served model (but those unloaded on purpose) is ready",
    description="A served model unloaded through model control is listed in `unloaded` and the "
    "status is `degraded`: the others are still served, so the replica stays in rotation. "
    "503 when Triton is down, a served model fails, every served model is unloaded, or the "
    "gateway is draining.",
    response_model=Readiness,
    responses=problem_responses(503),
)
async def readyz(
    settings: SettingsDep,
    served: ServedDep,
    backend: BackendDep,
    admission: AdmissionDep,
    request_id: RequestIdDep,
) -> JSONResponse:
    unloaded: set[str] = set()
    if admission.leaving:
        checks = {"accepting": False}
    else:
        server, statuses = await asyncio.gather(
            backend.server_status(), model_statuses(backend, served.all())
        )
        # only a live Triton unloads a model on purpose (and a dead one is not asked twice)
        unloaded = await unloaded_models(backend, statuses) if server.live else set()
        checks = {"accepting": True, "triton_live": server.live}
        for status in statuses:
            checks[f"model:{status.name}"] = status.ready
            checks.update({f"model:{step.name}": step.ready for step in status.composing})
        if len(unloaded) == len(statuses):
            unloaded = set()  # nothing left to serve: not ready
    failing = [name for name, ok in checks.items() if not ok and name.removeprefix("model:") not in unloaded]
    if not failing:
        body = Readiness(status="degraded" if unloaded else "ready", checks=checks, unloaded=sorted(unloaded))
        return JSONResponse(body.model_dump())
    problem = {
        "type": TYPE_PREFIX + "not-ready",
        "title": "Not ready",
        "status": 503,
        "detail": f"not ready: {', '.join(failing)}",
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
async def models(settings: SettingsDep, served_models: ServedDep, backend: BackendDep) -> ModelsResponse:
    served = served_models.all()
    server, statuses, labels = await asyncio.gather(
        backend.server_status(),
        model_statuses(backend, served),
        asyncio.gather(*(_labels(settings, backend, m) for m in served)),
    )
    unloaded = await unloaded_models(backend, statuses) if server.live else set()
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
                pinned_version=model.version,
                state="ready" if status.ready else "unloaded" if status.name in unloaded else "unavailable",
            )
            for model, status, label_set in zip(served, statuses, labels, strict=True)
        ],
    )
