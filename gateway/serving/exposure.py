"""What the doors show of Triton: the catalog's classifiers and the one allow-list of
non-classifier models (``GATEWAY_V2_MODELS`` and the embedding models). Any other model
does not exist for a client: 404 with Triton's own text, as if Triton had no such model.

- :meth:`Exposure.target`: the model and version an Open Inference Protocol call goes to
  (a pin applies to an unversioned call, as on ``/models/{model}/classify``; a version
  named overrides it);
- readiness, metadata, configuration (less what stays private: an ensemble's steps and
  their wiring, file names, parameters naming files or other models) and statistics of
  the exposed models only, for ``/v2`` and the gRPC door alike.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gateway.errors import BadVersionError, UnknownModelError
from gateway.names import is_version
from gateway.serving.call import Call
from gateway.serving.caller import Caller, may_use
from gateway.serving.catalog import Catalog, CatalogEntry
from gateway.triton.backend import InferenceBackend, ModelSignature


@dataclass(frozen=True)
class OipTarget:
    """What an Open Inference Protocol call goes to: a catalogued classifier (its checks
    apply) or a model of ``GATEWAY_V2_MODELS`` (``entry`` None), and the version ("":
    Triton's latest) after the pin."""

    name: str
    version: str
    entry: CatalogEntry | None
    named_version: bool = False  # the client named it (never rerouted by a rollout)


# Fields of Triton's model configuration a /v2 client never sees.
PRIVATE_FIELDS = frozenset({"ensemble_scheduling", "default_model_filename", "cc_model_filenames",
                            "model_warmup", "model_repository_agents", "metric_tags"})  # fmt: skip
_PRIVATE_PARAMETER_SUFFIXES = ("_file", "_filename", "_path", "_dir", "_model", "_models")


def public_configuration(document: dict[str, Any]) -> dict[str, Any]:
    """``document`` without :data:`PRIVATE_FIELDS` and without parameters that name files
    or models (by their key, or a value that is a path). An ensemble keeps an empty
    ``ensemble_scheduling``: its platform says ensemble, and clients that read one
    (perf_analyzer crashes without it) then see no steps to reach."""
    public = {key: value for key, value in document.items() if key not in PRIVATE_FIELDS}
    if "ensemble_scheduling" in document:
        public["ensemble_scheduling"] = {"step": []}
    parameters = public.get("parameters")
    if isinstance(parameters, dict):
        public["parameters"] = {
            key: value
            for key, value in parameters.items()
            if not key.endswith(_PRIVATE_PARAMETER_SUFFIXES)
            and "/" not in str(value.get("string_value", "") if isinstance(value, dict) else value)
        }
    return public


class Exposure:
    """Built once by the runtime; read by every door."""

    def __init__(self, catalog: Catalog, backend: InferenceBackend, allow_listed: Iterable[str]) -> None:
        self.catalog = catalog
        self.backend = backend
        self.allow_listed = frozenset(allow_listed)

    def target(
        self, name: str, version: str = "", call: Call | None = None, caller: Caller | None = None
    ) -> OipTarget:
        """The model and version an OIP call goes to; 404, exactly as an unknown model,
        for a model neither catalogued nor allow-listed, one the caller (``caller``, or
        ``call``'s) may not use, or a version that is not one. With ``call``, the model
        becomes its label (a known name only)."""
        entry = self.catalog.find(name)
        if entry is None and name not in self.allow_listed:
            raise UnknownModelError(name)
        if not may_use(caller if call is None else call.caller, name):
            raise UnknownModelError(name)  # nothing says the model exists
        if call is not None:
            call.model = name  # an exposed name, whatever becomes of its version
        if version and not is_version(version):
            raise BadVersionError(version)
        if entry is not None and version and version not in entry.versions:
            raise UnknownModelError(name, version)
        return OipTarget(name, version or self.catalog.version(name), entry, bool(version))

    async def model_ready(self, name: str, version: str = "", caller: Caller | None = None) -> bool:
        """An exposed model's readiness (unversioned: the pinned version's); an unknown
        model or version is 404, not "not ready"."""
        target = self.target(name, version, caller=caller)
        if target.version:
            await self.backend.model_signature(name, target.version)
        return (await self.backend.model_status(name, target.version)).ready

    def non_classifier(self, name: str) -> bool:
        """``name`` is one of the non-classifier models the gateway serves (the one
        allow-list: ``GATEWAY_V2_MODELS`` and the embedding models)."""
        return name in self.allow_listed

    def exposed(self, caller: Caller | None = None) -> set[str]:
        """The models /v2 shows: the catalog's classifiers and GATEWAY_V2_MODELS (those
        ``caller`` may use)."""
        names = {entry.name for entry in self.catalog.entries()} | set(self.allow_listed)
        return {name for name in names if may_use(caller, name)}

    async def configuration(self, name: str, version: str, caller: Caller | None = None) -> dict[str, Any]:
        """A model's configuration as Triton's JSON, less what stays private: an ensemble's
        steps and their wiring, file names, and parameters naming files or other models
        (an ensemble then looks like one model, which is what its clients call)."""
        self.target(name, version, caller=caller)
        document = await self.backend.model_config_document(name, version)
        return public_configuration(document)

    async def statistics(
        self, name: str | None, version: str = "", caller: Caller | None = None
    ) -> dict[str, Any]:
        """Triton's inference statistics of one exposed model (all its versions unless one
        is named), or of every exposed model ``caller`` may use (``name`` None); hidden
        steps never appear."""
        if name is not None:
            self.target(name, version, caller=caller)
        document = await self.backend.statistics(name or "", version)
        shown = self.exposed(caller)
        return {"model_stats": [s for s in document.get("model_stats", []) if s.get("name") in shown]}

    async def signature(self, target: OipTarget) -> ModelSignature:
        return await self.backend.model_signature(target.name, target.version)
