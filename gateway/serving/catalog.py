"""The model catalog: every classifier Triton serves, read from Triton itself.

A model is a classifier when its configuration says so: ``parameters { key:
"gateway_task" value: { string_value: "image-classification" } }`` (or
``text-classification``, or any task in :data:`gateway.serving.kinds.KINDS`); so is a default
model named in the settings (``GATEWAY_IMAGE_MODEL``, ``GATEWAY_TEXT_MODEL``), whose task
is then the one it is the default for. Everything else
the gateway needs (caps, formats, top-k, label list) is read from that configuration
and its ensemble steps' (see :mod:`gateway.serving.kinds`). The operator chooses what is
exposed (``GATEWAY_EXPOSE`` / ``GATEWAY_HIDE``, name patterns); an ensemble's steps are
never exposed on their own.

Kept current: at start, after every model-control call made through the gateway, and
every ``GATEWAY_CATALOG_REFRESH_SECONDS`` (so a Triton in ``poll`` mode, or changed by
someone else, is followed). A refresh that fails (Triton down) keeps the last known
catalog: the circuit breaker answers for Triton meanwhile. Version pins (run time, from
``/admin``) live here too, per process.
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from gateway.errors import (
    ConfigurationError,
    GatewayError,
    InvalidInputError,
    NotFoundError,
    TritonUnavailableError,
    WrongInputKindError,
)
from gateway.names import REFERENCE_PARAMETER
from gateway.periodic import Periodic
from gateway.serving.kinds import KINDS, Caps, Kind
from gateway.serving.kinds.base import merged_parameters
from gateway.settings import Settings
from gateway.shared.routing import Routing
from gateway.triton.backend import InferenceBackend, ModelConfig, RepositoryModel
from gateway.triton.tensors import strings

logger = logging.getLogger("gateway.catalog")

TASK_PARAMETER = "gateway_task"
# Triton's states (its repository index), as the catalog reports them.
_STATES = {"READY": "ready", "LOADING": "loading", "UNLOADING": "unloading", "UNAVAILABLE": "unavailable"}


@dataclass(frozen=True)
class StepState:
    """One ensemble step and whether Triton has it ready."""

    name: str
    ready: bool
    versions: tuple[str, ...] = ()


@dataclass(frozen=True)
class CatalogEntry:
    """One exposed classifier as last read from Triton."""

    name: str
    kind: Kind
    caps: Caps
    state: str  # ready, loading, unloading, unloaded, unavailable
    versions: tuple[str, ...] = ()
    platform: str = ""
    steps: tuple[StepState, ...] = ()
    reference: str = ""  # its configuration's gateway_reference (empty: none)

    @property
    def task(self) -> str:
        return self.kind.task

    @property
    def ready(self) -> bool:
        return self.state == "ready"


@dataclass
class _Index:
    """Triton's repository index, by model name."""

    models: dict[str, list[RepositoryModel]] = field(default_factory=dict)

    @classmethod
    def of(cls, entries: Iterable[RepositoryModel]) -> _Index:
        models: dict[str, list[RepositoryModel]] = defaultdict(list)
        for entry in entries:
            models[entry.name].append(entry)
        return cls(dict(models))

    def ready_versions(self, name: str) -> tuple[str, ...]:
        versions = (m.version for m in self.models.get(name, []) if m.state == "READY" and m.version)
        return tuple(sorted(versions, key=_order))

    def state(self, name: str) -> str:
        entries = self.models.get(name, [])
        if any(m.state == "READY" for m in entries):
            return "ready"
        if entries and all(m.unloaded for m in entries):
            return "unloaded"
        states = [_STATES.get(m.state, "unavailable") for m in entries]
        return next((s for s in ("loading", "unloading") if s in states), "unavailable")


def _order(version: str) -> tuple[int, str]:
    return (int(version), "") if version.isdigit() else (0, version)


def _matches(name: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)


class Catalog:
    """The exposed classifiers, their defaults per task, and their version pins."""

    def __init__(
        self,
        settings: Settings,
        backend: InferenceBackend,
        routing: Routing | None = None,
        on_refresh: Callable[[], None] | None = None,
    ) -> None:
        self._settings = settings
        self._backend = backend
        self._entries: dict[str, CatalogEntry] = {}
        self.generation = 0  # how many times the catalog was read (stale answers go with it)
        self._label_counts: dict[tuple[str, int], int] = {}
        self._defaults = settings.default_models()  # task -> model name
        self._tasks_of_defaults = {name: task for task, name in self._defaults.items()}
        # Version pins: this process's, or every replica's through the shared state.
        self.routing = routing or Routing(settings.default_pins())
        self._lock = asyncio.Lock()
        self._refreshing = Periodic("catalog refresh", settings.catalog_refresh_seconds, self.refresh, logger)
        self._noted: set[str] = set()
        self._on_refresh = on_refresh or (lambda: None)  # a read that reached Triton

    # -- reading ---------------------------------------------------------------------
    def entries(self) -> list[CatalogEntry]:
        return sorted(self._entries.values(), key=lambda entry: entry.name)

    def defaults(self) -> dict[str, str]:
        """Task -> the model ``POST /classify`` uses for it (a promotion's, else the settings')."""
        return {task: self.routing.default_model(task) or name for task, name in self._defaults.items()}

    def exposed(self, name: str) -> bool:
        """The default models always; others when a pattern of ``expose`` and none of
        ``hide`` matches."""
        settings = self._settings
        if name in self._tasks_of_defaults:
            return True
        return _matches(name, settings.expose) and not _matches(name, settings.hide)

    def find(self, name: str) -> CatalogEntry | None:
        return self._entries.get(name)

    def get(self, name: str) -> CatalogEntry:
        """An exposed classifier; 404 when there is no such (exposed) classifier.

        Whether it is ready is Triton's to answer (503 with Retry-After through the status
        mapping), not the catalog's: a catalog read a second ago must not refuse a model
        Triton has just loaded again (a restarted Triton recovers as fast as the breaker
        lets it)."""
        entry = self._entries.get(name)
        if entry is None:
            raise NotFoundError("there is no such model")
        return entry

    def default(self, kind: Kind) -> CatalogEntry:
        """The model ``POST /classify`` sends inputs of this kind to."""
        name = self._defaults.get(kind.task, "")
        name = (self.routing.default_model(kind.task) or name) if name else ""
        if not name:
            raise InvalidInputError(f"this gateway serves no {kind.noun} model")
        entry = self._entries.get(name)
        if entry is None:
            raise self._unavailable(f"{name} is not available")
        if entry.kind is not kind:
            raise WrongInputKindError(f"{name} takes {entry.kind.noun}s ({entry.task}), not {kind.noun}s")
        return entry

    def _unavailable(self, detail: str) -> TritonUnavailableError:
        return TritonUnavailableError(detail, retry_after=self._settings.triton.retry_after_seconds)

    def version(self, name: str) -> str:
        """The version requests to ``name`` go to ("" for Triton's latest)."""
        return self.routing.version(name)

    async def pin(self, name: str, version: str) -> None:
        """Move a model's pin (on every replica when the state is shared); the caller
        checked that Triton has that version ready."""
        await self.routing.pin(name, version)

    # -- keeping current -------------------------------------------------------------
    async def refresh(self) -> None:
        """Read the catalog again from Triton; on failure the last one stays."""
        async with self._lock:
            configs: dict[str, ModelConfig | None] = {}
            try:
                index = _Index.of(await self._backend.repository_index())
            except GatewayError:
                # Triton is down, or refuses its index to the gateway (its repository API is
                # restricted and GATEWAY_TRITON__REPOSITORY_KEY is not the key; Triton says
                # UNAVAILABLE for both): the catalog then holds what it can read without the
                # index, the default models and those it knew.
                index = await self._index_from_configs(configs)
                if not index.models:
                    return  # nothing answers: Triton is down; the breaker answers for it
                self._note(
                    "index",
                    "Triton refuses its repository index to the gateway (is GATEWAY_TRITON__REPOSITORY_KEY "
                    "its key?): the catalog holds the default models and those it knew only",
                )
            self._entries = await self._read(index, configs)
            self.generation += 1  # what was worked out from the previous catalog is stale
            self._on_refresh()

    async def _index_from_configs(self, configs: dict[str, ModelConfig | None]) -> _Index:
        """An index of the default (and already known) models and their steps, each READY
        when its configuration can be read (Triton gives it only for a loaded model)."""
        names = {*self._defaults.values(), *self._entries}
        await asyncio.gather(*(self._config(name, configs) for name in names))
        steps = {step for config in configs.values() if config is not None for step in config.steps}
        await asyncio.gather(*(self._config(step, configs) for step in steps))
        return _Index.of(RepositoryModel(name, "", "READY") for name, config in configs.items() if config)

    async def _config(self, name: str, cache: dict[str, ModelConfig | None]) -> ModelConfig | None:
        if name not in cache:
            try:
                cache[name] = await self._backend.model_config(name)
            except GatewayError:
                cache[name] = None  # gone between the index and now: not ready
        return cache[name]

    async def _read(self, index: _Index, configs: dict[str, ModelConfig | None]) -> dict[str, CatalogEntry]:
        candidates = [name for name in index.models if self.exposed(name)]
        ready = [name for name in candidates if index.state(name) == "ready"]
        await asyncio.gather(*(self._config(name, configs) for name in ready))
        classifiers = {
            name: config
            for name, config in configs.items()
            if config is not None
            and self.exposed(name)
            and (config.parameters.get(TASK_PARAMETER) or name in self._tasks_of_defaults)
        }
        steps = {step for config in classifiers.values() for step in config.steps}
        await asyncio.gather(*(self._config(step, configs) for step in steps if index.state(step) == "ready"))
        entries: dict[str, CatalogEntry] = {}
        for name, config in classifiers.items():
            if name in steps:
                continue  # a composing step is never exposed on its own
            entry = self._entry(name, config, index, configs)
            if entry is not None:
                entries[name] = entry
        # Known before and not ready now (unloaded, loading, failed): still listed, 503.
        # Gone from the repository: gone from the catalog (404).
        for name, previous in self._entries.items():
            if name not in entries and name in index.models and self.exposed(name):
                state = index.state(name)
                entries[name] = replace(
                    previous,
                    state="unavailable" if state == "ready" else state,
                    versions=index.ready_versions(name),
                )
        return entries

    def _entry(
        self, name: str, config: ModelConfig, index: _Index, configs: dict[str, ModelConfig | None]
    ) -> CatalogEntry | None:
        # A default model named in the settings is a classifier of its task even where its
        # configuration does not say so (a Triton set up before the catalog).
        task = config.parameters.get(TASK_PARAMETER) or self._tasks_of_defaults[name]
        kind = KINDS.get(task)
        if kind is None:
            self._note(name, f"{name}: gateway_task {task!r} is none of {sorted(KINDS)}; not exposed")
            return None
        step_configs = [configs.get(step) for step in config.steps]
        parameters = merged_parameters(config, [c for c in step_configs if c is not None])
        try:
            caps = kind.caps(config, parameters, self._settings)
        except ConfigurationError as exc:
            self._note(name, f"{exc.detail}; not exposed")
            return None
        for note in caps.notes:
            self._note(f"{name}:{note}", note)
        steps = tuple(
            StepState(step, index.state(step) == "ready", index.ready_versions(step)) for step in config.steps
        )
        ready = index.state(name) == "ready" and all(step.ready for step in steps)
        return CatalogEntry(
            name=name,
            kind=kind,
            caps=caps,
            state="ready" if ready else "unavailable",
            versions=index.ready_versions(name),
            platform=config.platform,
            steps=steps,
            reference=config.parameters.get(REFERENCE_PARAMETER, ""),
        )

    def _note(self, key: str, message: str) -> None:
        """Log a configuration problem once (the catalog is read every few seconds)."""
        if key not in self._noted:
            self._noted.add(key)
            logger.error("%s", message)

    async def label_count(self, entry: CatalogEntry) -> int | None:
        """How many classes the model has (None: it lists none), asked of Triton once per
        catalog read, not once per request."""
        key = (entry.name, self.generation)
        if key not in self._label_counts:
            labels = await self.labels(entry)
            if labels is None:
                return None  # not remembered: a failed read is asked again
            if len(self._label_counts) > 4 * len(self._entries) + 16:
                self._label_counts.clear()
            self._label_counts[key] = len(labels)
        return self._label_counts[key]

    async def labels(self, entry: CatalogEntry) -> list[str] | None:
        """The model's configured label list, where it has a model that lists it."""
        call = entry.kind.labels_call(entry.caps)
        if call is None:
            return None
        model, inputs = call
        try:
            answer = await self._backend.infer(model, "", inputs, "catalog")
        except GatewayError:
            return None
        return strings(list(answer.outputs["LABELS"].array.reshape(-1)))

    def start(self) -> None:
        """Refresh every ``catalog_refresh_seconds`` until :meth:`stop`."""
        self._refreshing.start()

    async def stop(self) -> None:
        await self._refreshing.stop()
