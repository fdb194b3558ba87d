"""GET /livez, /readyz and /models."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Path, Request
from fastapi.responses import JSONResponse, Response

from gateway.errors import GatewayError, NotReadyError
from gateway.http.dependencies import (
    AdmissionDep,
    BackendDep,
    CatalogDep,
    DispatcherDep,
    DriftDep,
    SettingsDep,
)
from gateway.http.problems import problem_response, problem_responses
from gateway.http.schemas import (
    ComposingModel,
    DriftReference,
    DriftState,
    DriftVersion,
    Liveness,
    ModelInfo,
    ModelsResponse,
    Readiness,
    TritonInfo,
)
from gateway.observe.drift import DriftMonitor
from gateway.serving.catalog import Catalog, CatalogEntry
from gateway.serving.dispatch import Dispatcher
from gateway.triton.backend import InferenceBackend, ModelStatus

router = APIRouter(tags=["health"])


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


async def _triton_checks(
    backend: InferenceBackend, dispatcher: Dispatcher
) -> tuple[dict[str, bool], set[str]]:
    """What Triton says of the default models (shared by the probes of a moment)."""
    server, statuses = await asyncio.gather(backend.server_status(), dispatcher.served_statuses())
    # only a live Triton unloads a model on purpose (and a dead one is not asked twice)
    unloaded = await unloaded_models(backend, statuses) if server.live else set()
    checks = {"accepting": True, "triton_live": server.live}
    for status in statuses:
        checks[f"model:{status.name}"] = status.ready
        checks.update({f"model:{step.name}": step.ready for step in status.composing})
    if statuses and len(unloaded) == len(statuses):
        unloaded = set()  # nothing left to serve: not ready
    return checks, unloaded


@router.get(
    "/readyz",
    summary="Triton is live and every default model (but those unloaded on purpose) is ready",
    description="Readiness follows the default models (those POST /classify uses); every other "
    "classifier of the catalog is reported in `models` without deciding it. A default model "
    "unloaded through model control is listed in `unloaded` and the status is `degraded`: the "
    "others are still served, so the replica stays in rotation. 503 when Triton is down, a "
    "default model fails, every default model is unloaded, or the gateway is draining.",
    response_model=Readiness,
    responses=problem_responses(503),
)
async def readyz(
    request: Request,
    settings: SettingsDep,
    catalog: CatalogDep,
    dispatcher: DispatcherDep,
    backend: BackendDep,
    admission: AdmissionDep,
) -> Response:
    unloaded: set[str] = set()
    if admission.leaving:
        checks = {"accepting": False}
    else:
        checks, unloaded = await dispatcher.readiness.get(
            lambda: _triton_checks(backend, dispatcher), catalog.generation
        )
    failing = [name for name, ok in checks.items() if not ok and name.removeprefix("model:") not in unloaded]
    if not failing:
        body = Readiness(
            status="degraded" if unloaded else "ready",
            checks=checks,
            unloaded=sorted(unloaded),
            models={entry.name: entry.state for entry in catalog.entries()},
        )
        return JSONResponse(body.model_dump())
    error = NotReadyError(
        f"not ready: {', '.join(failing)}",
        retry_after=settings.triton.retry_after_seconds,
        extensions={"checks": checks},
    )
    return problem_response(error, request)


async def drift_state(drift: DriftMonitor, entry: CatalogEntry) -> DriftState | None:
    """The model's reference and live windows (None while the store does not answer)."""
    try:
        # the reference the last evaluation read (every interval); the store only before one
        reference = drift.cached_reference(entry.name) or await drift.reference(entry.name, entry.reference)
    except GatewayError:
        return None
    return DriftState(
        reference=None if reference is None else DriftReference(**reference.summary()),
        versions={
            version: DriftVersion(**reading.as_json())
            for version, reading in sorted(drift.readings(entry.name).items())
        },
    )


async def _info(
    catalog: Catalog, drift: DriftMonitor, entry: CatalogEntry, defaults: set[str], live: bool
) -> ModelInfo:
    # the catalog as last read, but nothing is ready while Triton does not answer
    ready = entry.ready and live
    return ModelInfo(
        name=entry.name,
        task=entry.task,
        default=entry.name in defaults,
        ready=ready,
        versions=list(entry.versions),
        platform=entry.platform,
        accepts=list(entry.kind.accepts),
        composing_models=[
            ComposingModel(name=step.name, ready=step.ready, versions=list(step.versions))
            for step in entry.steps
        ],
        caps=entry.caps.as_json(),
        labels=await catalog.labels(entry) if ready else None,
        pinned_version=catalog.version(entry.name),
        state=entry.state if live else "unavailable",
        drift=await drift_state(drift, entry),
    )


@router.get("/models", summary="The catalog: every classifier the gateway exposes, as Triton reports it")
async def models(catalog: CatalogDep, backend: BackendDep, drift: DriftDep) -> ModelsResponse:
    defaults = set(catalog.defaults().values())
    server = await backend.server_status()
    infos = await asyncio.gather(
        *(_info(catalog, drift, entry, defaults, server.live) for entry in catalog.entries())
    )
    return ModelsResponse(triton=TritonInfo(live=server.live, version=server.version), models=list(infos))


@router.get(
    "/models/{model}",
    summary="One classifier of the catalog, with its drift window and reference",
    responses=problem_responses(404),
)
async def model(
    model: Annotated[str, Path(description="A classifier of the catalog (any other name: 404).")],
    catalog: CatalogDep,
    backend: BackendDep,
    drift: DriftDep,
) -> ModelInfo:
    entry = catalog.get(model)  # 404 when the catalog has no such classifier
    server = await backend.server_status()
    return await _info(catalog, drift, entry, set(catalog.defaults().values()), server.live)
