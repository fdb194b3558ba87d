"""What serves a request, decided once for every route.

The routes read a body and render an answer; everything between is here: which model
(the one named, or the default of the input's kind), which version (the one named, else
the pin), which rollout arm (canary or primary) and its version, how many predictions
(top-k), the model the metrics name, the shadow after the answer, and the inference
plane that runs it (admission, checks, breaker, fan-out). MLServer's
``DataPlane.infer``, resolving the model inside the plane, is the model.

The Open Inference Protocol routes (``/v2``) go through :meth:`Dispatcher.oip_target`:
a pin applies to an unversioned call there exactly as on ``/models/{model}/classify``;
rollouts do not (a ``/v2`` client addresses one model's tensors by name, and its answer
names the model and the version that produced it, so a canary of another model would
answer for a model it was not asked). A version named in the path overrides the pin,
on every route.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from time import perf_counter
from typing import Any

from gateway.errors import (
    BadVersionError,
    GatewayError,
    NotFoundError,
    ServiceUnavailableError,
    UnknownModelError,
    WrongInputKindError,
)
from gateway.names import is_version
from gateway.observe.drift import DriftMonitor
from gateway.serving.admission import ANONYMOUS, Tenant
from gateway.serving.caller import Caller, CallerGate
from gateway.serving.catalog import Catalog, CatalogEntry
from gateway.serving.kinds import Kind, kind_of
from gateway.serving.kinds.base import SCORES
from gateway.serving.kinds.text import CANDIDATE_LABELS
from gateway.serving.oip import InferRequest, bytes_checks, caps_for, check_top_k, parse_infer_request
from gateway.serving.payload import ClassifyInput
from gateway.serving.plane import InferencePlane
from gateway.serving.predictions import LogEntry
from gateway.serving.rollout import RolloutRunner
from gateway.serving.validation import resolve_threshold, resolve_top_k
from gateway.settings import PredictionSettings, Settings
from gateway.shared.routing import Rollout
from gateway.triton.backend import Classification, InferResult, ModelSignature
from gateway.triton.tensors import Tensor


@dataclass
class Call:
    """One request as the serving side sees it. ``model`` is set by the dispatcher as soon
    as it is known (catalogued or allow-listed names only, set before the inference so a
    failure is labelled too) and written through to ``labels``, the request's state, where
    the telemetry layer reads the metrics' model label: no route writes it back."""

    request_id: str
    started: float
    client: str | None = None  # who a canary assignment sticks to (key id, X-Rollout-Key)
    tenant: Tenant = ANONYMOUS  # the API key and its tier: whose share of the limit it takes
    labels: Any = None  # the request's state (GatewayState): only its "model" is written
    caller: Caller | None = None  # who called (its image quotas are charged here)
    logged: LogEntry | None = None  # what the prediction log is told (when it is on)
    _model: str | None = field(default=None, init=False, repr=False)

    @property
    def model(self) -> str | None:
        return self._model

    @model.setter
    def model(self, name: str | None) -> None:
        self._model = name
        if self.labels is not None and name is not None:
            self.labels["model"] = name


@dataclass(frozen=True)
class Answer:
    """The classifications, in input order, and the model that produced them."""

    model: str
    classifications: list[Classification]


@dataclass(frozen=True)
class OipTarget:
    """What an Open Inference Protocol call goes to: a catalogued classifier (its checks
    apply) or a model of ``GATEWAY_V2_MODELS`` (``entry`` None), and the version ("":
    Triton's latest) after the pin."""

    name: str
    version: str
    entry: CatalogEntry | None
    named_version: bool = False  # the client named it (never rerouted by a rollout)


def at_least(answers: list[Classification], threshold: float | None) -> list[Classification]:
    """Each input's predictions scoring at least ``threshold`` (all of them: None)."""
    if threshold is None:
        return answers
    return [
        replace(answer, predictions=[p for p in answer.predictions if p.score >= threshold])
        for answer in answers
    ]


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


class Dispatcher:
    """Built once by the runtime; every door's inference calls it."""

    def __init__(
        self,
        catalog: Catalog,
        plane: InferencePlane,
        rollouts: RolloutRunner,
        v2_models: Sequence[str],
        predictions: PredictionSettings | None = None,
        drift: DriftMonitor | None = None,
        gate: CallerGate | None = None,
    ) -> None:
        self.gate = gate
        self.predictions = predictions or PredictionSettings()
        self.drift = drift
        self.catalog = catalog
        self.plane = plane
        self.rollouts = rollouts
        self.v2_models = frozenset(v2_models)

    # -- admission before the body ------------------------------------------------------
    @asynccontextmanager
    async def admission_before_body(self, call: Call, expects_continue: bool) -> AsyncIterator[None]:
        """A request that declared ``Expect: 100-continue`` is refused before its body when
        the gateway could not admit it now (no slot within the queue wait, or draining):
        the 503 goes out before the body is sent (the server sends ``100 Continue`` only
        when the body is first read), with ``Connection: close``, as HTTP/1.1 asks of a
        server that leaves a body unread. It does not keep the slot while it uploads: a
        client that asks politely and then sends nothing would hold it for the whole body
        timeout (max_in_flight such clients starved everyone). Like any other request, it
        takes its slot once its body is in."""
        if expects_continue:
            admission = self.plane.admission
            try:
                ticket = await admission.acquire(call.tenant)
            except ServiceUnavailableError as exc:
                exc.headers = {**exc.headers, "Connection": "close"}
                raise
            admission.release(ticket)
        yield

    # -- /classify and /models/{model}[/versions/{v}]/classify ------------------------
    def check_model(self, model: str | None, version: str | None = None) -> None:
        """Refuse an unknown model or version before its body is read (404): a version is
        one Triton has ready for that model, as the catalog last read it, so no invented
        version reaches Triton (or becomes a metric label)."""
        if version is not None and not is_version(version):
            raise NotFoundError("there is no such model version")
        if model is not None:
            entry = self.catalog.get(model)
            if version is not None and version not in entry.versions:
                raise NotFoundError("there is no such model version")

    async def classify(
        self,
        payload: ClassifyInput,
        call: Call,
        *,
        model: str | None = None,
        version: str | None = None,
        top_k: int | None = None,
        threshold: float | None = None,
    ) -> Answer:
        """Classify ``payload`` with ``model`` (None: the default of its kind), ``version``
        (None: the pin, or the rollout's arm); ``top_k`` and ``threshold`` are the query's
        (the body may carry them too, never with other values)."""
        # the route called check_model before reading the body: not again here
        kind = kind_of(payload)
        if call.logged is not None:
            call.logged.payload = payload
        entry = self.catalog.default(kind) if model is None else self.catalog.get(model)
        if entry.kind is not kind:
            raise WrongInputKindError(
                f"{entry.name} takes {entry.kind.noun}s ({entry.task}), not {kind.noun}s"
            )
        await self._charge_images(kind, kind.count(payload), call)
        cut = resolve_threshold(threshold, payload.threshold)
        rollout = self.catalog.routing.rollout(entry.name)
        if rollout is None or version is not None:  # a version named explicitly is never rerouted
            call.model = entry.name
            chosen = self.catalog.version(entry.name) if version is None else version
            k = self._top_k(entry, payload, top_k, cut)
            answers = await self._run(entry, chosen, payload, k, call)
            self._record(entry, answers, cut, payload.candidate_labels is not None)
            return self._answered(call, Answer(entry.name, at_least(answers, cut)))
        return await self._in_rollout(entry, rollout, payload, top_k, cut, call)

    async def _charge_images(self, kind: Kind, count: int, call: Call) -> None:
        """Count an image request's images against its key's image quotas (429 when spent),
        on every door; the standing joins the answer's RateLimit headers."""
        if self.gate is not None and kind.noun == "image":
            await self.gate.charge_images(call.caller, count)

    @staticmethod
    def _top_k(
        entry: CatalogEntry, payload: ClassifyInput, top_k: int | None, threshold: float | None
    ) -> int:
        """The predictions to ask for: top_k as asked; with a threshold and no top_k, as
        many as the model answers (the threshold then decides)."""
        caps = entry.caps
        default = caps.max_top_k if threshold is not None else caps.default_top_k
        return resolve_top_k(top_k, payload.top_k, default, caps.max_top_k)

    async def _run(
        self,
        entry: CatalogEntry,
        version: str,
        payload: ClassifyInput,
        top_k: int,
        call: Call,
        admitted: bool = True,
    ) -> list[Classification]:
        return await self.plane.classify(
            entry,
            version,
            payload,
            top_k,
            call.request_id,
            call.started,
            admitted=admitted,
            tenant=call.tenant,
        )

    async def _in_rollout(
        self,
        entry: CatalogEntry,
        rollout: Rollout,
        payload: ClassifyInput,
        top_k: int | None,
        threshold: float | None,
        call: Call,
    ) -> Answer:
        served, arm, version = entry, "primary", ""
        canary = rollout.canary
        if canary is not None and rollout.canary_for(entry.name, call.client):
            candidate = self.catalog.find(canary.model)
            if candidate is not None and candidate.kind is entry.kind:
                served, arm, version = candidate, "canary", canary.version
        call.model = served.name
        k = self._top_k(served, payload, top_k, threshold)  # once per request, for the arm that serves it
        began = perf_counter()
        try:
            answers = await self._run(served, version or self.catalog.version(served.name), payload, k, call)
        except GatewayError:
            self.rollouts.record(entry.name, arm, perf_counter() - began, failed=True)
            raise
        self.rollouts.record(entry.name, arm, perf_counter() - began, failed=False)
        self._record(served, answers, threshold, payload.candidate_labels is not None)
        self._shadow(entry, rollout, payload, k, call, answers)  # compared before any threshold
        return self._answered(call, Answer(served.name, at_least(answers, threshold)))

    @staticmethod
    def _answered(call: Call, answer: Answer) -> Answer:
        if call.logged is not None:
            results = answer.classifications
            call.logged.model = answer.model
            call.logged.version = results[0].model_version if results else ""
            call.logged.classifications = results
        return answer

    def _shadow(
        self,
        entry: CatalogEntry,
        rollout: Rollout,
        payload: ClassifyInput,
        top_k: int,
        call: Call,
        answers: list[Classification],
    ) -> None:
        shadow = rollout.shadow
        if shadow is None or not rollout.shadowed():
            return
        target = self.catalog.find(shadow.model)
        if target is None or target.kind is not entry.kind:
            return
        version = shadow.version or self.catalog.version(target.name)
        k = min(top_k, target.caps.max_top_k)

        def run() -> Awaitable[list[Classification]]:
            # outside admission: the shadow has its own cap (the rollout runner's)
            return self._run(target, version, payload, k, Call(call.request_id, perf_counter()), False)

        self.rollouts.shadow(entry.name, len(answers), run, answers, shadow)

    # -- /v2 --------------------------------------------------------------------------
    def oip_target(self, name: str, version: str = "", call: Call | None = None) -> OipTarget:
        """The model and version an OIP call goes to; 404, exactly as an unknown model,
        for a model neither catalogued nor allow-listed or a version that is not one.
        With ``call``, the model becomes its label (a known name only)."""
        entry = self.catalog.find(name)
        if entry is None and name not in self.v2_models:
            raise UnknownModelError(name)
        if call is not None:
            call.model = name  # an exposed name, whatever becomes of its version
        if version and not is_version(version):
            raise BadVersionError(version)
        if entry is not None and version and version not in entry.versions:
            raise UnknownModelError(name, version)
        return OipTarget(name, version or self.catalog.version(name), entry, bool(version))

    def _oip_arm(self, target: OipTarget, call: Call) -> tuple[OipTarget, str]:
        """A rollout's canary share, as on /classify, when the canary is another version of
        the same model: an unversioned call may go to it (sticky per key). A canary of
        another model does not apply: an OIP client addresses one model's tensors by name,
        and another model would answer for one it did not ask for. Shadows compare
        classifications: /classify only."""
        entry = target.entry
        if entry is None or target.named_version:
            return target, "primary"
        rollout = self.catalog.routing.rollout(entry.name)
        canary = None if rollout is None else rollout.canary
        if rollout is None or canary is None or canary.model != entry.name or not canary.version:
            return target, "primary"
        if canary.version not in entry.versions or not rollout.canary_for(entry.name, call.client):
            return target, "primary"
        return OipTarget(entry.name, canary.version, entry, True), "canary"

    async def model_ready(self, name: str, version: str = "") -> bool:
        """An exposed model's readiness (unversioned: the pinned version's); an unknown
        model or version is 404, not "not ready"."""
        target = self.oip_target(name, version)
        if target.version:
            await self.plane.backend.model_signature(name, target.version)
        return (await self.plane.backend.model_status(name, target.version)).ready

    def non_classifier(self, name: str) -> bool:
        """``name`` is one of the non-classifier models the gateway serves (the one
        allow-list: ``GATEWAY_V2_MODELS`` and the embedding models)."""
        return name in self.v2_models

    def exposed(self) -> set[str]:
        """The models /v2 shows: the catalog's classifiers and GATEWAY_V2_MODELS."""
        return {entry.name for entry in self.catalog.entries()} | set(self.v2_models)

    async def configuration(self, name: str, version: str) -> dict[str, Any]:
        """A model's configuration as Triton's JSON, less what stays private: an ensemble's
        steps and their wiring, file names, and parameters naming files or other models
        (an ensemble then looks like one model, which is what its clients call)."""
        self.oip_target(name, version)
        document = await self.plane.backend.model_config_document(name, version)
        return public_configuration(document)

    async def statistics(self, name: str | None, version: str = "") -> dict[str, Any]:
        """Triton's inference statistics of one exposed model (all its versions unless one
        is named), or of every exposed model (``name`` None); hidden steps never appear."""
        if name is not None:
            self.oip_target(name, version)
        document = await self.plane.backend.statistics(name or "", version)
        shown = self.exposed()
        return {"model_stats": [s for s in document.get("model_stats", []) if s.get("name") in shown]}

    async def signature(self, target: OipTarget) -> ModelSignature:
        return await self.plane.backend.model_signature(target.name, target.version)

    async def infer_request(
        self,
        target: OipTarget,
        header: dict[str, Any],
        binary: bytes,
        size: int,
        call: Call,
        settings: Settings,
    ) -> tuple[InferRequest, InferResult, OipTarget]:
        """An OIP request as both doors hand it over (a JSON-shaped header and the binary
        tensors, ``size`` bytes in all): routed (a rollout's canary share), checked against
        the model's signature and the gateway's caps and input checks (off the loop when
        large), then inferred; with the target that answered."""
        served, arm = self._oip_arm(target, call)
        signature = await self.signature(served)
        with self.plane.tracing.span("validate tensors"):
            parsed = await self.plane.workers.run(
                size + len(binary),
                parse_infer_request,
                header,
                binary,
                signature,
                caps_for(settings, served.entry),
                bytes_checks(served.entry),
            )
            check_top_k(served.entry, parsed.inputs)
        if call.logged is not None:
            call.logged.tensors = parsed.inputs
        if served.entry is not None:
            kind = served.entry.kind
            count = sum(t.array.size for t in parsed.inputs if t.name in kind.oip_inputs)
            await self._charge_images(kind, count, call)
        if target.entry is None or self.catalog.routing.rollout(target.entry.name) is None:
            return (
                parsed,
                await self.infer(served, parsed.inputs, parsed.outputs, call, parsed.classes),
                served,
            )
        began = perf_counter()
        try:
            answer = await self.infer(served, parsed.inputs, parsed.outputs, call, parsed.classes)
        except GatewayError:
            self.rollouts.record(target.entry.name, arm, perf_counter() - began, failed=True)
            raise
        self.rollouts.record(target.entry.name, arm, perf_counter() - began, failed=False)
        return parsed, answer, served

    async def infer(
        self,
        target: OipTarget,
        inputs: Sequence[Tensor],
        outputs: Sequence[str],
        call: Call,
        classes: Mapping[str, int] | None = None,
    ) -> InferResult:
        call.model = target.name
        answer = await self.plane.infer(
            target.name, target.version, inputs, outputs, call.request_id, call.tenant, classes
        )
        if call.logged is not None:
            call.logged.model, call.logged.version = target.name, answer.model_version
            call.logged.outputs = dict(answer.outputs)
        scores = answer.outputs.get(SCORES)
        # (not its classes, when the client asked Triton's classification extension for them)
        if (
            target.entry is not None
            and scores is not None
            and scores.array.ndim == 2
            and scores.datatype != "BYTES"
        ):
            # a classifier's answer on /v2 is recorded as on /classify (its SCORES, best first)
            rows = scores.array.tolist()
            self._observe(target.entry, answer.model_version, rows, None)
            # scores only (the labels are the client's to ask for on /v2); none over labels it chose
            if self.drift is not None and not any(t.name == CANDIDATE_LABELS for t in inputs):
                for row in rows:
                    if row:
                        self.drift.observe(target.entry.name, answer.model_version, None, row[0])
        return answer

    def _observe(
        self, entry: CatalogEntry, version: str, rows: Iterable[Sequence[float]], threshold: float | None
    ) -> None:
        self.plane.metrics.predictions(
            entry.name,
            version,
            rows,
            self.predictions.floor(entry.name),
            entry.caps.extra.get("activation") == "sigmoid",
            0.5 if threshold is None else threshold,
        )

    def _record(
        self, entry: CatalogEntry, answers: list[Classification], threshold: float | None, own_labels: bool
    ) -> None:
        """The answers (before any threshold) in the prediction metrics and the drift
        windows (not answers over labels the client chose: ``own_labels``)."""
        if not answers:
            return
        version = answers[0].model_version
        rows = ([p.score for p in answer.predictions] for answer in answers)
        self._observe(entry, version, rows, threshold)
        if self.drift is not None and not own_labels:
            for answer in answers:
                if answer.predictions:
                    best = answer.predictions[0]
                    self.drift.observe(entry.name, version, best.label, best.score)
