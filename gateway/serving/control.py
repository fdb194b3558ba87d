"""Operators' changes to what is served: model control (load, reload, unload) and
run-time routing (pins, rollouts, promotions), with the rules each obeys.

The ``/admin`` routes read a body, call one of these and render the answer; the rules
(what must be ready first, what a promotion changes, which helper models go along) live
here, beside the dispatcher that applies the routing they set. Every change is logged
with the admin key's id (logger ``gateway.admin``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from gateway.errors import ConflictError, InvalidInputError, NotFoundError
from gateway.serving.catalog import Catalog, CatalogEntry, StepState
from gateway.serving.rollout import RolloutRunner, RolloutStats
from gateway.shared.routing import Rollout, Target
from gateway.triton.backend import InferenceBackend, RepositoryModel

logger = logging.getLogger("gateway.admin")


@dataclass(frozen=True)
class ControlResult:
    """What a load, reload or unload did: how long it took and the repository after it."""

    model: str
    action: str
    seconds: float
    models: list[RepositoryModel]


@dataclass(frozen=True)
class Served:
    """A classifier of the catalog, the version it is pinned to ("": Triton's latest) and
    its ensemble's steps."""

    name: str
    task: str
    version: str
    steps: tuple[StepState, ...] = ()


@dataclass(frozen=True)
class RolloutView:
    """A model's rollout and this replica's statistics of it."""

    model: str
    rollout: Rollout
    stats: RolloutStats


@dataclass(frozen=True)
class Promotion:
    model: str
    promoted: str
    change: str  # "pinned" or "default"


class ModelControl:
    """Triton's repository API, with the catalog kept current after every change."""

    def __init__(self, backend: InferenceBackend, catalog: Catalog, *, settle_seconds: float = 300.0) -> None:
        self.backend = backend
        self.catalog = catalog
        self.settle_seconds = settle_seconds  # how long an unload may stay UNLOADING in Triton

    async def repository(self, name: str | None = None) -> list[RepositoryModel]:
        return [m for m in await self.backend.repository_index() if name is None or m.name == name]

    async def _known(self, name: str) -> list[RepositoryModel]:
        """The model's repository entries; 404 for a name the repository does not hold."""
        entries = await self.repository(name)
        if not entries:
            raise NotFoundError(f"Triton's repository holds no model {name!r}")
        return entries

    def _labels_model(self, name: str) -> str:
        """The model listing ``name``'s labels (its config's labels_model), if it has one."""
        entry = self.catalog.find(name)
        return str(entry.caps.extra.get("labels_model") or "") if entry is not None else ""

    async def _after(self, name: str, action: str, started: float, admin: str) -> ControlResult:
        took = time.monotonic() - started
        logger.info("admin %s: %s %s (%.2f s)", admin, action, name, took)
        models = await self.repository(None if name == "*" else name)
        return ControlResult(name, action, round(took, 3), models)

    async def load(self, name: str, admin: str, *, reload: bool = False) -> ControlResult:
        """Load ``name`` (or reload it: 409 when it is not loaded); the loaded one serves
        until the new one is ready."""
        entries = await self._known(name)
        if reload and not any(m.state == "READY" for m in entries):
            raise ConflictError(f"{name} is not loaded: load it instead")
        started = time.monotonic()
        try:
            await self.backend.load_model(name)
        finally:
            await self.catalog.refresh()  # a failed reload may still have changed what is loaded
        helper = self._labels_model(name)
        if helper and not any(m.name == helper and m.state == "READY" for m in await self.repository()):
            # the model that lists its labels is no ensemble step: Triton does not load it along
            await self.backend.load_model(helper)
        return await self._after(name, "reload" if reload else "load", started, admin)

    async def unload(self, name: str, admin: str, *, dependents: bool) -> ControlResult:
        await self._known(name)
        started = time.monotonic()
        try:
            helper = self._labels_model(name)
            await self.backend.unload_model(name, dependents=dependents)
            if dependents and helper:
                await self.backend.unload_model(helper, dependents=False)
            await self._unloaded(name, started)
        finally:
            await self.catalog.refresh()
        return await self._after(name, "unload", started, admin)

    async def _unloaded(self, name: str, started: float) -> None:
        """Wait until Triton has finished unloading ``name``: its unload can return while a
        Python-backend stub is still stopping (state UNLOADING), and the answer promises
        that /readyz and /models say unloaded."""
        pause = 0.02
        while any(m.state == "UNLOADING" for m in await self.repository(name)):
            if time.monotonic() - started > self.settle_seconds:
                raise ConflictError(f"{name} is still unloading after {self.settle_seconds:.0f} s")
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.5)

    async def reload_changed(self, admin: str) -> ControlResult:
        """Load every loaded model again: Triton reloads those whose files changed."""
        started = time.monotonic()
        loaded = dict.fromkeys(m.name for m in await self.repository() if m.state == "READY")
        try:
            for name in loaded:
                await self.backend.load_model(name)
        finally:
            await self.catalog.refresh()
        return await self._after("*", "reload-changed", started, admin)


class RoutingControl:
    """Pins, rollouts and promotions: checked against Triton, then set on every replica."""

    def __init__(self, backend: InferenceBackend, catalog: Catalog, runner: RolloutRunner) -> None:
        self.backend = backend
        self.catalog = catalog
        self.runner = runner
        self.routing = catalog.routing

    def served(self) -> list[Served]:
        return [Served(e.name, e.task, self.catalog.version(e.name), e.steps) for e in self.catalog.entries()]

    def _classifier(self, name: str) -> CatalogEntry:
        entry = self.catalog.find(name)
        if entry is None:
            raise NotFoundError(f"{name} is not a classifier of the catalog")
        return entry

    async def _ready(self, target: Target) -> None:
        if not (await self.backend.model_status(target.model, target.version)).ready:
            raise ConflictError(f"{target} is not ready in Triton")

    async def pin(self, name: str, version: str, admin: str) -> Served:
        entry = self._classifier(name)
        status = await self.backend.model_status(name, version)
        if not status.ready:
            raise ConflictError(f"{name} version {version or '(latest)'} is not ready in Triton")
        await self.catalog.pin(name, version)
        logger.info("admin %s: pinned %s to version %s", admin, name, version or "(latest)")
        return Served(name, entry.task, version, entry.steps)

    async def _target(self, text: str, entry: CatalogEntry) -> Target:
        target = Target.parse(text)
        found = self.catalog.find(target.model)
        if found is None:
            raise ConflictError(f"{target.model} is not a classifier of the catalog")
        if found.task != entry.task:
            raise ConflictError(f"{target.model} is a {found.task} model, {entry.name} a {entry.task} one")
        if target.model == entry.name and target.version in ("", self.catalog.version(entry.name)):
            raise ConflictError(f"{target} is what {entry.name} serves already")
        await self._ready(target)
        return target

    def _view(self, name: str, rollout: Rollout) -> RolloutView:
        return RolloutView(name, rollout, self.runner.stats(name))

    async def set_rollout(
        self, name: str, canary: tuple[str, float] | None, shadow: tuple[str, float] | None, admin: str
    ) -> RolloutView:
        """Start or change ``name``'s rollout: ``canary`` (target, weight) and ``shadow``
        (target, sample); each target a catalogued model of the same task, ready."""
        entry = self._classifier(name)
        if canary is None and shadow is None:
            raise InvalidInputError("a rollout needs a canary, a shadow or both (DELETE ends one)")
        rollout = Rollout(
            canary=await self._target(canary[0], entry) if canary else None,
            weight=canary[1] if canary else 0.0,
            shadow=await self._target(shadow[0], entry) if shadow else None,
            sample=shadow[1] if shadow else 0.0,
        )
        await self.routing.set_rollout(name, rollout)
        logger.info("admin %s: rollout of %s: %s", admin, name, rollout.to_json())
        return self._view(name, rollout)

    def rollout(self, name: str) -> RolloutView:
        rollout = self.routing.rollout(name)
        if rollout is None:
            raise NotFoundError(f"{name} has no rollout")
        return self._view(name, rollout)

    async def roll_back(self, name: str, admin: str) -> RolloutView:
        """End the rollout: every request served by the model again."""
        view = self.rollout(name)
        await self.routing.set_rollout(name, None)
        logger.info("admin %s: rollout of %s ended (rolled back)", admin, name)
        return view

    async def promote(self, name: str, admin: str) -> Promotion:
        """The rollout's target (the canary's, else the shadow's) becomes what serves: a
        version of the same model its pin, another model the default of the task; the
        rollout ends."""
        entry = self.catalog.find(name)
        rollout = self.routing.rollout(name)
        if entry is None or rollout is None:
            raise NotFoundError(f"{name} has no rollout")
        target = rollout.canary or rollout.shadow
        assert target is not None
        await self._ready(target)
        if target.model == name:
            await self.routing.pin(name, target.version)
            change = "pinned"
        else:
            if self.catalog.defaults().get(entry.task) != name:
                raise ConflictError(
                    f"{name} is not the default {entry.task} model: promote a version of it, or point "
                    f"clients at /models/{target.model}/classify"
                )
            if target.version:
                await self.routing.pin(target.model, target.version)
            await self.routing.set_default_model(entry.task, target.model)
            change = "default"
        await self.routing.set_rollout(name, None)
        logger.info("admin %s: promoted %s over %s (%s)", admin, target, name, change)
        return Promotion(name, str(target), change)
