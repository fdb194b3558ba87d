"""GET /livez, /readyz and /models."""

from __future__ import annotations

import asyncio
from typing import Annotated

from fastapi import APIRouter, Path, Request
from fastapi.responses import JSONResponse, Response

from gateway.errors import NotFoundError, NotReadyError
from gateway.http.dependencies import (
    BackendDep,
    CallerDep,
    CatalogDep,
    DriftDep,
    ReadinessDep,
    SettingsDep,
)
from gateway.http.drift import drift_state
from gateway.http.problems import problem_response, problem_responses
from gateway.http.schemas import (
    Liveness,
    ModelInfo,
    ModelsResponse,
    Readiness,
    TritonInfo,
)
from gateway.observe.drift import DriftMonitor
from gateway.serving.caller import may_use
from gateway.serving.catalog import Catalog, CatalogEntry

router = APIRouter(tags=["health"])


@router.get("/livez", summary="The process is up (never calls Triton)")
async def livez() -> Liveness:
    return Liveness(status="ok")


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
    request: Request, settings: SettingsDep, catalog: CatalogDep, readiness: ReadinessDep
) -> Response:
    checks, unloaded = await readiness.checks()
    failing = [name for name, ok in checks.items() if not ok and name.removeprefix("model:") not in unloaded]
    # callers must identify themselves and this one did not (a probe): the verdict alone,
    # no model named (the middleware checked a key it may carry)
    state = request.scope.get("state", {})
    # the middleware's verdict on a key it may carry (absent: callers need not identify)
    key = state.get("probe_key")
    named = "probe_key" not in state or key is not None

    def shown(name: str) -> bool:
        return named and (key is None or key.may_use(name.removeprefix("model:")))

    told = {n: ok for n, ok in checks.items() if not n.startswith("model:") or shown(n)} if named else {}
    if not failing:
        body = Readiness(
            status="degraded" if unloaded else "ready",
            checks=told if named else {"ready": True},
            unloaded=sorted(n for n in unloaded if shown(n)),
            models={entry.name: entry.state for entry in catalog.entries() if shown(entry.name)},
        )
        return JSONResponse(body.model_dump())
    named_failing = [name for name in failing if name in told]
    error = NotReadyError(
        f"not ready: {', '.join(named_failing)}" if named_failing else "not ready",
        retry_after=settings.triton.retry_after_seconds,
        extensions={"checks": told} if named else None,
    )
    return problem_response(error, request)


async def _info(
    catalog: Catalog, drift: DriftMonitor, entry: CatalogEntry, defaults: set[str], live: bool
) -> ModelInfo:
    # the catalog as last read, but nothing is ready while Triton does not answer, nor
    # while a step is not (its steps are named to operators only: /admin/served)
    ready = entry.ready and live and all(step.ready for step in entry.steps)
    return ModelInfo(
        name=entry.name,
        task=entry.task,
        default=entry.name in defaults,
        ready=ready,
        versions=list(entry.versions),
        platform=entry.platform,
        accepts=list(entry.kind.accepts),
        caps=entry.caps.as_json(),
        labels=await catalog.labels(entry) if ready else None,
        pinned_version=catalog.version(entry.name),
        state=entry.state if live else "unavailable",
        drift=await drift_state(drift, entry),
    )


@router.get("/models", summary="The catalog: every classifier the gateway exposes, as Triton reports it")
async def models(
    catalog: CatalogDep, backend: BackendDep, drift: DriftDep, caller: CallerDep
) -> ModelsResponse:
    defaults = set(catalog.defaults().values())
    server = await backend.server_status()
    shown = [entry for entry in catalog.entries() if may_use(caller, entry.name)]  # the key's models
    infos = await asyncio.gather(*(_info(catalog, drift, entry, defaults, server.live) for entry in shown))
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
    caller: CallerDep,
) -> ModelInfo:
    entry = catalog.get(model)  # 404 when the catalog has no such classifier
    if not may_use(caller, entry.name):
        raise NotFoundError("there is no such model")  # as if the catalog had none
    server = await backend.server_status()
    return await _info(catalog, drift, entry, set(catalog.defaults().values()), server.live)
