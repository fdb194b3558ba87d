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
import time
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request

from gateway.errors import ConflictError, InvalidInputError, NotFoundError
from gateway.http.auth import identify, missing_key_error
from gateway.http.dependencies import BackendDep, CatalogDep, RolloutsDep
from gateway.http.problems import problem_responses
from gateway.http.schemas import (
    CanarySpec,
    ModelControlResult,
    PinRequest,
    PromotionResult,
    RepositoryEntry,
    RepositoryIndex,
    RolloutRequest,
    RolloutState,
    ServedVersion,
    ShadowSpec,
)
from gateway.serving.catalog import Catalog, CatalogEntry
from gateway.serving.rollout import RolloutRunner
from gateway.shared.routing import Rollout, Target
from gateway.triton.backend import InferenceBackend, RepositoryModel

logger = logging.getLogger("gateway.admin")


async def require_admin(request: Request) -> str:
    """The admin key's id, or 401."""
    key = identify(request.app.state.admin_keys.keys, request.scope)
    if key is None:
        raise missing_key_error()
    request.state.client = key.id
    return key.id


AdminDep = Annotated[str, Depends(require_admin)]
ModelName = Annotated[
    str, Path(pattern=r"^[A-Za-z0-9_.\-]{1,128}$", description="A model in Triton's repository.")
]

router = APIRouter(prefix="/admin", tags=["admin"], responses=problem_responses(401, 503))


def _entries(models: list[RepositoryModel], name: str | None = None) -> list[RepositoryEntry]:
    return [
        RepositoryEntry(name=m.name, version=m.version, state=m.state, reason=m.reason)
        for m in models
        if name is None or m.name == name
    ]


async def _known(backend: InferenceBackend, name: str) -> list[RepositoryModel]:
    """The model's repository entries; 404 for a name the repository does not hold."""
    entries = [m for m in await backend.repository_index() if m.name == name]
    if not entries:
        raise NotFoundError(f"Triton's repository holds no model {name!r}")
    return entries


async def _load(
    backend: InferenceBackend, catalog: Catalog, name: str, action: str, admin: str
) -> ModelControlResult:
    started = time.monotonic()
    try:
        await backend.load_model(name)
    finally:
        await catalog.refresh()  # a failed reload may still have changed what is loaded
    helper = _labels_model(catalog, name)
    if helper and not any(m.name == helper and m.state == "READY" for m in await backend.repository_index()):
        # the model that lists its labels is no ensemble step: Triton does not load it along
        await backend.load_model(helper)
    return await _after(backend, name, action, started, admin)


def _labels_model(catalog: Catalog, name: str) -> str:
    """The model listing ``name``'s labels (its config's labels_model), if it has one."""
    entry = catalog.find(name)
    return str(entry.caps.extra.get("labels_model") or "") if entry is not None else ""


async def _after(
    backend: InferenceBackend, name: str, action: str, started: float, admin: str
) -> ModelControlResult:
    """The answer of a model-control call (the catalog was refreshed after it)."""
    took = time.monotonic() - started
    logger.info("admin %s: %s %s (%.2f s)", admin, action, name, took)
    return ModelControlResult(
        model=name,
        action=action,
        seconds=round(took, 3),
        models=_entries(await backend.repository_index(), None if name == "*" else name),
    )


@router.get("/repository", summary="Every model in Triton's repository and its state")
async def repository(admin: AdminDep, backend: BackendDep) -> RepositoryIndex:
    return RepositoryIndex(models=_entries(await backend.repository_index()))


@router.post(
    "/models/{name}/load",
    summary="Load a model, or reload it if loaded (the loaded one serves until the new one is ready)",
    responses=problem_responses(404, 409),
)
async def load(
    name: ModelName, admin: AdminDep, backend: BackendDep, catalog: CatalogDep
) -> ModelControlResult:
    await _known(backend, name)
    return await _load(backend, catalog, name, "load", admin)


@router.post(
    "/models/{name}/reload",
    summary="Reload a loaded model from the repository (409 if it is not loaded)",
    responses=problem_responses(404, 409),
)
async def reload(
    name: ModelName, admin: AdminDep, backend: BackendDep, catalog: CatalogDep
) -> ModelControlResult:
    if not any(m.state == "READY" for m in await _known(backend, name)):
        raise ConflictError(f"{name} is not loaded: load it instead")
    return await _load(backend, catalog, name, "reload", admin)


@router.post(
    "/models/{name}/unload",
    summary="Unload a model; /readyz and /models then say it is unloaded",
    responses=problem_responses(404),
)
async def unload(
    name: ModelName,
    admin: AdminDep,
    backend: BackendDep,
    catalog: CatalogDep,
    dependents: Annotated[
        bool,
        Query(
            description="Also unload the models it loaded with it (an ensemble's steps, and the "
            "model listing its labels)."
        ),
    ] = False,
) -> ModelControlResult:
    await _known(backend, name)
    started = time.monotonic()
    try:
        helper = _labels_model(catalog, name)
        await backend.unload_model(name, dependents=dependents)
        if dependents and helper:
            await backend.unload_model(helper, dependents=False)
    finally:
        await catalog.refresh()
    return await _after(backend, name, "unload", started, admin)


@router.post(
    "/repository/reload",
    summary="Load every loaded model again: Triton reloads those whose files changed",
    responses=problem_responses(409),
)
async def reload_changed(admin: AdminDep, backend: BackendDep, catalog: CatalogDep) -> ModelControlResult:
    started = time.monotonic()
    loaded = dict.fromkeys(m.name for m in await backend.repository_index() if m.state == "READY")
    try:
        for name in loaded:
            await backend.load_model(name)
    finally:
        await catalog.refresh()
    return await _after(backend, "*", "reload-changed", started, admin)


@router.get("/served", summary="Every classifier of the catalog and its pinned version")
async def served_versions(admin: AdminDep, catalog: CatalogDep) -> list[ServedVersion]:
    return [
        ServedVersion(name=entry.name, task=entry.task, version=catalog.version(entry.name))
        for entry in catalog.entries()
    ]


@router.put(
    "/served/{name}",
    summary="Pin a classifier of the catalog to a version Triton has ready (empty: Triton's latest)",
    responses=problem_responses(404, 409),
)
async def pin(
    name: ModelName, body: PinRequest, admin: AdminDep, backend: BackendDep, catalog: CatalogDep
) -> ServedVersion:
    entry = catalog.find(name)
    if entry is None:
        raise NotFoundError(f"{name} is not a classifier of the catalog")
    status = await backend.model_status(name, body.version)
    if not status.ready:
        raise ConflictError(f"{name} version {body.version or '(latest)'} is not ready in Triton")
    await catalog.pin(name, body.version)
    logger.info("admin %s: pinned %s to version %s", admin, name, body.version or "(latest)")
    return ServedVersion(name=name, task=entry.task, version=body.version)


# --- rollouts -----------------------------------------------------------------------


def _rollout_state(name: str, rollout: Rollout, runner: RolloutRunner) -> RolloutState:
    return RolloutState(
        model=name,
        canary=CanarySpec(target=str(rollout.canary), weight=rollout.weight) if rollout.canary else None,
        shadow=ShadowSpec(target=str(rollout.shadow), sample=rollout.sample) if rollout.shadow else None,
        statistics=runner.stats(name).as_json(),
    )


async def _checked_target(
    text: str, entry: CatalogEntry, backend: InferenceBackend, catalog: Catalog
) -> Target:
    target = Target.parse(text)
    found = catalog.find(target.model)
    if found is None:
        raise ConflictError(f"{target.model} is not a classifier of the catalog")
    if found.task != entry.task:
        raise ConflictError(f"{target.model} is a {found.task} model, {entry.name} a {entry.task} one")
    if target.model == entry.name and target.version in ("", catalog.version(entry.name)):
        raise ConflictError(f"{target} is what {entry.name} serves already")
    status = await backend.model_status(target.model, target.version)
    if not status.ready:
        raise ConflictError(f"{target} is not ready in Triton")
    return target


@router.put(
    "/models/{name}/rollout",
    summary="Start or change a model's rollout: a canary share answered by another model or version, "
    "and a shadow share also sent to it and compared",
    responses=problem_responses(404, 409, 422, 503),
)
async def set_rollout(
    name: ModelName,
    body: RolloutRequest,
    admin: AdminDep,
    backend: BackendDep,
    catalog: CatalogDep,
    runner: RolloutsDep,
) -> RolloutState:
    entry = catalog.find(name)
    if entry is None:
        raise NotFoundError(f"{name} is not a classifier of the catalog")
    if body.canary is None and body.shadow is None:
        raise InvalidInputError("a rollout needs a canary, a shadow or both (DELETE ends one)")
    canary = await _checked_target(body.canary.target, entry, backend, catalog) if body.canary else None
    shadow = await _checked_target(body.shadow.target, entry, backend, catalog) if body.shadow else None
    rollout = Rollout(
        canary=canary,
        weight=body.canary.weight if body.canary else 0.0,
        shadow=shadow,
        sample=body.shadow.sample if body.shadow else 0.0,
    )
    await catalog.routing.set_rollout(name, rollout)
    logger.info("admin %s: rollout of %s: %s", admin, name, rollout.to_json())
    return _rollout_state(name, rollout, runner)


@router.get(
    "/models/{name}/rollout",
    summary="A model's rollout and its live statistics",
    responses=problem_responses(404),
)
async def get_rollout(
    name: ModelName, admin: AdminDep, catalog: CatalogDep, runner: RolloutsDep
) -> RolloutState:
    rollout = catalog.routing.rollout(name)
    if rollout is None:
        raise NotFoundError(f"{name} has no rollout")
    return _rollout_state(name, rollout, runner)


async def _end(name: str, admin: str, catalog: Catalog, why: str) -> Rollout:
    rollout = catalog.routing.rollout(name)
    if rollout is None:
        raise NotFoundError(f"{name} has no rollout")
    await catalog.routing.set_rollout(name, None)
    logger.info("admin %s: rollout of %s ended (%s)", admin, name, why)
    return rollout


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
async def rollback(
    name: ModelName, admin: AdminDep, catalog: CatalogDep, runner: RolloutsDep
) -> RolloutState:
    rollout = await _end(name, admin, catalog, "rolled back")
    return _rollout_state(name, rollout, runner)


@router.post(
    "/models/{name}/rollout/promote",
    summary="Promote the rollout's target (the canary's, else the shadow's): a version of the same "
    "model becomes its pin; another model becomes the default of the task; the rollout ends",
    responses=problem_responses(404, 409, 503),
)
async def promote(
    name: ModelName, admin: AdminDep, backend: BackendDep, catalog: CatalogDep
) -> PromotionResult:
    entry = catalog.find(name)
    rollout = catalog.routing.rollout(name)
    if entry is None or rollout is None:
        raise NotFoundError(f"{name} has no rollout")
    target = rollout.canary or rollout.shadow
    assert target is not None
    if not (await backend.model_status(target.model, target.version)).ready:
        raise ConflictError(f"{target} is not ready in Triton")
    if target.model == name:
        await catalog.routing.pin(name, target.version)
        change = "pinned"
    else:
        if catalog.defaults().get(entry.task) != name:
            raise ConflictError(
                f"{name} is not the default {entry.task} model: promote a version of it, or point "
                f"clients at /models/{target.model}/classify"
            )
        if target.version:
            await catalog.routing.pin(target.model, target.version)
        await catalog.routing.set_default_model(entry.task, target.model)
        change = "default"
    await catalog.routing.set_rollout(name, None)
    logger.info("admin %s: promoted %s over %s (%s)", admin, target, name, change)
    return PromotionResult(model=name, promoted=str(target), change=change)
