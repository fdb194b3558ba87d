"""Model control for operators: Triton's repository API behind admin keys (``/admin``).

Off unless ``GATEWAY_ADMIN__KEYS_FILE`` is set (the routes do not exist: 404). Admin keys
are a keys file of their own; a client key never opens these routes, and an admin key
opens nothing else. With ``GATEWAY_ADMIN__PORT`` the routes are served on that listener
only (see gateway.server). Every operation is logged with the admin key's id.

Triton must run with ``--model-control-mode=explicit``; its repository API should be
restricted to a key only the gateway holds (``GATEWAY_TRITON__REPOSITORY_KEY``).
"""

from __future__ import annotations

import logging
import time
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request

from gateway.auth import identify, missing_key_error
from gateway.backend import InferenceBackend, RepositoryModel
from gateway.catalog import Catalog
from gateway.dependencies import BackendDep, CatalogDep
from gateway.errors import ConflictError, NotFoundError
from gateway.routes.problems import problem_responses
from gateway.schemas import (
    ModelControlResult,
    PinRequest,
    RepositoryEntry,
    RepositoryIndex,
    ServedVersion,
)

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
