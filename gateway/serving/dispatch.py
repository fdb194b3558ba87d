"""What serves a request, decided once for every route.

The routes read a body and render an answer; everything between is here: which model
(the one named, or the default of the input's kind), which version (the one named, else
the pin), which rollout arm (canary or primary) and its version, how many predictions
(top-k), the model the metrics name, the shadow after the answer, and the inference
plane that runs it (admission, checks, breaker, fan-out). MLServer's
``DataPlane.infer``, resolving the model inside the plane, is the model.

The Open Inference Protocol's calls (``/v2`` and the gRPC door) go to the target
gateway.serving.exposure gives: a pin applies to an unversioned call there exactly as on
``/models/{model}/classify``; rollouts do not (a ``/v2`` client addresses one model's tensors by name, and its answer
names the model and the version that produced it, so a canary of another model would
answer for a model it was not asked). A version named in the path overrides the pin,
on every route.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from time import perf_counter
from typing import Any

from gateway.errors import (
    GatewayError,
    InvalidInputError,
    NotFoundError,
    WrongInputKindError,
)
from gateway.names import is_version
from gateway.serving.call import Answer, Call
from gateway.serving.caller import Caller, CallerGate, may_use
from gateway.serving.catalog import Catalog, CatalogEntry
from gateway.serving.exposure import Exposure, OipTarget
from gateway.serving.kinds import Kind, kind_of
from gateway.serving.kinds.base import SCORES
from gateway.serving.kinds.text import CANDIDATE_LABELS
from gateway.serving.observed import PredictionObserver
from gateway.serving.oip import InferRequest, bytes_checks, caps_for, check_top_k, parse_infer_request
from gateway.serving.payload import ClassifyInput
from gateway.serving.plane import InferencePlane
from gateway.serving.refusal import Refusals, UnreadBody, Upload
from gateway.serving.rollout import RolloutRunner
from gateway.serving.validation import resolve_threshold, resolve_top_k
from gateway.settings import Settings
from gateway.shared.routing import Rollout
from gateway.triton.backend import Classification, InferResult
from gateway.triton.tensors import Tensor


def at_least(answers: list[Classification], threshold: float | None) -> list[Classification]:
    """Each input's predictions scoring at least ``threshold`` (all of them: None)."""
    if threshold is None:
        return answers
    return [
        answer._replace(predictions=[p for p in answer.predictions if p.score >= threshold])
        for answer in answers
    ]


class Dispatcher:
    """Built once by the runtime; every door's inference calls it."""

    def __init__(
        self,
        catalog: Catalog,
        plane: InferencePlane,
        rollouts: RolloutRunner,
        exposure: Exposure,
        observer: PredictionObserver,
        refusals: Refusals,
        gate: CallerGate | None = None,
    ) -> None:
        self.gate = gate
        self.refusals = refusals
        self.exposure = exposure
        self.observer = observer
        self.catalog = catalog
        self.plane = plane
        self.rollouts = rollouts

    # -- refusal before the body -------------------------------------------------------
    def before_body(self, call: Call, unread: UnreadBody) -> AbstractAsyncContextManager[Upload]:
        """Every inference route enters this before it reads a body: refused from its
        headers when the gateway would shed it (gateway.serving.refusal, the one rule
        every door asks)."""
        return self.refusals.before_body(call.tenant, unread)

    # -- /classify and /models/{model}[/versions/{v}]/classify ------------------------
    def check_model(
        self, model: str | None, version: str | None = None, caller: Caller | None = None
    ) -> None:
        """Refuse an unknown model or version before its body is read (404): a version is
        one Triton has ready for that model, as the catalog last read it, so no invented
        version reaches Triton (or becomes a metric label). A model ``caller`` may not use
        is refused as one that does not exist."""
        if version is not None and not is_version(version):
            raise NotFoundError("there is no such model version")
        if model is not None:
            entry = self.catalog.get(model)
            if not may_use(caller, model):
                raise NotFoundError("there is no such model")
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
        if not may_use(call.caller, entry.name):  # as if the gateway had no such model
            if model is None:
                raise InvalidInputError(f"this gateway serves no {kind.noun} model")
            raise NotFoundError("there is no such model")
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
            self.observer.classified(entry, answers, cut, payload.candidate_labels is not None)
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
            # a canary of another model serves only callers who may use that model
            if (
                candidate is not None
                and candidate.kind is entry.kind
                and may_use(call.caller, candidate.name)
            ):
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
        self.observer.classified(served, answers, threshold, payload.candidate_labels is not None)
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
        if target is None or target.kind is not entry.kind or not may_use(call.caller, target.name):
            return  # nor is a caller's input sent to a model it may not use
        version = shadow.version or self.catalog.version(target.name)
        k = min(top_k, target.caps.max_top_k)

        def run() -> Awaitable[list[Classification]]:
            # outside admission: the shadow has its own cap (the rollout runner's)
            return self._run(target, version, payload, k, Call(call.request_id, perf_counter()), False)

        self.rollouts.shadow(entry.name, len(answers), run, answers, shadow)

    # -- /v2 --------------------------------------------------------------------------
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

    async def infer_request(
        self,
        target: OipTarget,
        header: dict[str, Any],
        binary: bytes | memoryview,
        size: int,
        call: Call,
        settings: Settings,
    ) -> tuple[InferRequest, InferResult, OipTarget]:
        """An OIP request as both doors hand it over (a JSON-shaped header and the binary
        tensors, ``size`` bytes in all): routed (a rollout's canary share), checked against
        the model's signature and the gateway's caps and input checks (off the loop when
        large), then inferred; with the target that answered."""
        served, arm = self._oip_arm(target, call)
        signature = await self.exposure.signature(served)
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
        if served.entry is not None and served.entry.kind.noun == "image":
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
        if target.entry is not None and scores is not None:
            # a classifier's answer on /v2 is recorded as on /classify (its SCORES, best first)
            own_labels = any(t.name == CANDIDATE_LABELS for t in inputs)
            self.observer.scored(target.entry, answer.model_version, scores, own_labels)
        return answer
