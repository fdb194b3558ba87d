"""Model control for operators: Triton's repository API behind admin keys (``/admin``).

Off unless ``GATEWAY_ADMIN__KEYS_FILE`` is set (the routes do not exist: 404). Admin keys
are a keys file of their own; a client key never opens these routes, and an admin key
opens nothing else. With ``GATEWAY_ADMIN__PORT`` the routes are served on that listener
only (see gateway.http.server). Every operation is logged with the admin key's id.

Triton must run with ``--model-control-mode=explicit``; its repository API should be
restricted to a key only the gateway holds (``GATEWAY_TRITON__REPOSITORY_KEY``).
"""

from __future__ import annotations

import logging
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request

from gateway.errors import NotFoundError
from gateway.http.auth import identify
from gateway.http.dependencies import (
    AdmissionDep,
    CatalogDep,
    DriftDep,
    KeyRingDep,
    ModelControlDep,
    QuotasDep,
    RoutingControlDep,
    SettingsDep,
)
from gateway.http.drift import drift_state
from gateway.http.problems import problem_responses
from gateway.http.schemas import (
    CanarySpec,
    ComposingModel,
    DriftReference,
    DriftState,
    KeyStanding,
    ModelControlResult,
    PinRequest,
    PromotionResult,
    QuotaStanding,
    RepositoryEntry,
    RepositoryIndex,
    RolloutRequest,
    RolloutState,
    ServedVersion,
    ShadowSpec,
)
from gateway.names import MODEL_NAME, VERSION
from gateway.serving.caller import missing_key_error
from gateway.serving.control import ControlResult, RolloutView, Served
from gateway.triton.backend import RepositoryModel


async def require_admin(request: Request) -> str:
    """The admin key's id, or 401."""
    key = identify(request.app.state.admin_keys.keys, request.scope)
    if key is None:
        raise missing_key_error()
    request.state.client = key.id
    return key.id


logger = logging.getLogger("gateway.admin")

AdminDep = Annotated[str, Depends(require_admin)]
ModelName = Annotated[str, Path(pattern=rf"^{MODEL_NAME}$", description="A model in Triton's repository.")]

router = APIRouter(prefix="/admin", tags=["admin"], responses=problem_responses(401, 503))


def _entries(models: list[RepositoryModel]) -> list[RepositoryEntry]:
    return [RepositoryEntry(name=m.name, version=m.version, state=m.state, reason=m.reason) for m in models]


def _result(result: ControlResult) -> ModelControlResult:
    return ModelControlResult(
        model=result.model,
        action=result.action,
        seconds=result.seconds,
        models=_entries(result.models),
    )


def _served(served: Served) -> ServedVersion:
    steps = [ComposingModel(name=s.name, ready=s.ready, versions=list(s.versions)) for s in served.steps]
    return ServedVersion(name=served.name, task=served.task, version=served.version, composing_models=steps)


def _rollout_state(view: RolloutView) -> RolloutState:
    rollout = view.rollout
    return RolloutState(
        model=view.model,
        canary=CanarySpec(target=str(rollout.canary), weight=rollout.weight) if rollout.canary else None,
        shadow=ShadowSpec(target=str(rollout.shadow), sample=rollout.sample) if rollout.shadow else None,
        statistics=view.stats.as_json(),
    )


@router.get("/repository", summary="Every model in Triton's repository and its state")
async def repository(admin: AdminDep, control: ModelControlDep) -> RepositoryIndex:
    return RepositoryIndex(models=_entries(await control.repository()))


@router.post(
    "/models/{name}/load",
    summary="Load a model, or reload it if loaded (the loaded one serves until the new one is ready)",
    responses=problem_responses(404, 409),
)
async def load(name: ModelName, admin: AdminDep, control: ModelControlDep) -> ModelControlResult:
    return _result(await control.load(name, admin))


@router.post(
    "/models/{name}/reload",
    summary="Reload a loaded model from the repository (409 if it is not loaded)",
    responses=problem_responses(404, 409),
)
async def reload(name: ModelName, admin: AdminDep, control: ModelControlDep) -> ModelControlResult:
    return _result(await control.load(name, admin, reload=True))


@router.post(
    "/models/{name}/unload",
    summary="Unload a model; /readyz and /models then say it is unloaded (409: still unloading "
    "past the load timeout)",
    responses=problem_responses(404, 409),
)
async def unload(
    name: ModelName,
    admin: AdminDep,
    control: ModelControlDep,
    dependents: Annotated[
        bool,
        Query(
            description="Also unload the models it loaded with it (an ensemble's steps, and the "
            "model listing its labels)."
        ),
    ] = False,
) -> ModelControlResult:
    return _result(await control.unload(name, admin, dependents=dependents))


@router.post(
    "/repository/reload",
    summary="Load every loaded model again: Triton reloads those whose files changed",
    responses=problem_responses(409),
)
async def reload_changed(admin: AdminDep, control: ModelControlDep) -> ModelControlResult:
    return _result(await control.reload_changed(admin))


@router.get("/served", summary="Every classifier of the catalog and its pinned version")
async def served_versions(admin: AdminDep, control: RoutingControlDep) -> list[ServedVersion]:
    return [_served(served) for served in control.served()]


@router.put(
    "/served/{name}",
    summary="Pin a classifier of the catalog to a version Triton has ready (empty: Triton's latest)",
    responses=problem_responses(404, 409),
)
async def pin(
    name: ModelName, body: PinRequest, admin: AdminDep, control: RoutingControlDep
) -> ServedVersion:
    return _served(await control.pin(name, body.version, admin))


# --- rollouts -----------------------------------------------------------------------


@router.put(
    "/models/{name}/rollout",
    summary="Start or change a model's rollout: a canary share answered by another model or version, "
    "and a shadow share also sent to it and compared",
    responses=problem_responses(404, 409, 422, 503),
)
async def set_rollout(
    name: ModelName, body: RolloutRequest, admin: AdminDep, control: RoutingControlDep
) -> RolloutState:
    canary = (body.canary.target, body.canary.weight) if body.canary else None
    shadow = (body.shadow.target, body.shadow.sample) if body.shadow else None
    return _rollout_state(await control.set_rollout(name, canary, shadow, admin))


@router.get(
    "/models/{name}/rollout",
    summary="A model's rollout and its live statistics",
    responses=problem_responses(404),
)
async def get_rollout(name: ModelName, admin: AdminDep, control: RoutingControlDep) -> RolloutState:
    return _rollout_state(control.rollout(name))


@router.delete(
    "/models/{name}/rollout",
    summary="End a model's rollout (roll back: every request served by the model again)",
    responses=problem_responses(404, 503),
)
@router.post(
    "/models/{name}/rollout/rollback",
    summary="Roll back: end the rollout (as DELETE)",
    responses=problem_responses(404, 503),
)
async def rollback(name: ModelName, admin: AdminDep, control: RoutingControlDep) -> RolloutState:
    return _rollout_state(await control.roll_back(name, admin))


@router.post(
    "/models/{name}/rollout/promote",
    summary="Promote the rollout's target (the canary's, else the shadow's): a version of the same "
    "model becomes its pin; another model becomes the default of the task; the rollout ends",
    responses=problem_responses(404, 409, 503),
)
async def promote(name: ModelName, admin: AdminDep, control: RoutingControlDep) -> PromotionResult:
    promotion = await control.promote(name, admin)
    return PromotionResult(model=promotion.model, promoted=promotion.promoted, change=promotion.change)


# --- drift reference ----------------------------------------------------------------


@router.post(
    "/models/{name}/reference",
    summary="Freeze a classifier's live window of answers as its drift reference (every replica's, "
    "with Redis); 409 while the window holds fewer than GATEWAY_DRIFT__MIN_INPUTS inputs",
    responses=problem_responses(404, 409),
)
async def capture_reference(
    name: ModelName,
    admin: AdminDep,
    catalog: CatalogDep,
    drift: DriftDep,
    version: Annotated[
        str | None,
        Query(
            pattern=rf"^{VERSION}$",
            description="Only this version's window (default: every ready version's, merged).",
        ),
    ] = None,
) -> DriftReference:
    entry = catalog.get(name)
    if version is not None and version not in entry.versions:
        raise NotFoundError("there is no such model version")
    versions = [version] if version is not None else list(entry.versions)
    reference = await drift.capture(name, versions)
    logger.info(
        "admin %s captured the drift reference of %s (%d inputs)", admin, name, reference.distribution.inputs
    )
    return DriftReference(**reference.summary())


@router.get(
    "/models/{name}/reference",
    summary="A classifier's drift reference, counts included (404 when it has none)",
    responses=problem_responses(404),
)
async def get_reference(
    name: ModelName, admin: AdminDep, catalog: CatalogDep, drift: DriftDep
) -> dict[str, Any]:
    entry = catalog.get(name)
    reference = await drift.reference(name, entry.reference)
    if reference is None:
        raise NotFoundError(f"{name} has no drift reference")
    return reference.as_json()


@router.delete(
    "/models/{name}/reference",
    summary="Drop a classifier's captured reference (the one its configuration carries, if any, applies again)",
    responses=problem_responses(404),
)
async def delete_reference(
    name: ModelName, admin: AdminDep, catalog: CatalogDep, drift: DriftDep
) -> DriftState:
    entry = catalog.get(name)
    if not await drift.forget(name):
        raise NotFoundError(f"{name} has no captured reference")
    logger.info("admin %s dropped the drift reference of %s", admin, name)
    state = await drift_state(drift, entry)
    assert state is not None
    return state


@router.get(
    "/keys/{key_id}",
    summary="An API key's tier, limits and quota use this period (never its hash)",
    responses=problem_responses(404),
)
async def key_standing(
    key_id: str,
    admin: AdminDep,
    keys: KeyRingDep,
    quotas: QuotasDep,
    admission: AdmissionDep,
    settings: SettingsDep,
) -> KeyStanding:
    key = next((k for k in keys.keys if k.id == key_id), None) if keys is not None else None
    if key is None:
        raise NotFoundError("there is no such API key")
    tier = settings.tiers.get(key.tier)
    standing = await quotas.usage(key)
    return KeyStanding(
        id=key.id,
        tier=key.tier,
        share=tier.share if tier else 1.0,
        priority=tier.priority if tier else 0,
        rate=key.rate,
        burst=key.burst,
        in_flight=admission.held.get(key.id, 0),
        quotas=[
            QuotaStanding(
                unit=u.quota.unit,
                period=u.quota.period,
                limit=u.quota.limit,
                used=u.used,
                remaining=u.remaining,
                reset_seconds=u.reset_seconds,
            )
            for u in standing
        ],
    )
