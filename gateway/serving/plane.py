"""The inference plane: the one path every inference route takes to Triton.

Routes read, pick a model, call the plane and render (MLServer's ``DataPlane.infer`` is
the model). Here, once: admission (an in-flight slot, or 503), the checks of the
model's kind in the check workers, the metrics, the circuit breaker around the
request's Triton calls, their fan-out and the collection of their answers (a bad input
fails only itself; the client hears the most actionable error).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
from time import perf_counter
from typing import cast

from gateway.errors import (
    GatewayError,
    InvalidInputError,
    TritonFailureError,
    TritonTimeoutError,
    TritonUnavailableError,
)
from gateway.observe.metrics import GatewayMetrics
from gateway.observe.tracing import Tracing
from gateway.serving.admission import ANONYMOUS, Admission, Tenant, Ticket
from gateway.serving.catalog import CatalogEntry
from gateway.serving.guard import GuardedBackend
from gateway.serving.payload import ClassifyInput
from gateway.serving.workers import CheckWorkers
from gateway.triton.backend import Classification, InferResult
from gateway.triton.tensors import Tensor

# When several inputs fail differently, the client hears the most actionable error.
_SEVERITY: dict[type[GatewayError], int] = {
    TritonUnavailableError: 3,
    TritonTimeoutError: 2,
    TritonFailureError: 1,
}


def most_actionable(failures: Sequence[tuple[int, GatewayError]]) -> GatewayError:
    """Of several inputs' errors (index, error), the one the client should hear: an
    upstream failure before the inputs' own errors, which are then listed together."""
    upstream = [(i, e) for i, e in failures if not isinstance(e, InvalidInputError)]
    if upstream:
        return max(upstream, key=lambda pair: _SEVERITY.get(type(pair[1]), 0))[1]
    index, error = failures[0]
    error.errors = [{"input_index": i, "detail": e.detail} for i, e in failures]
    return error.at(index)


def triton_priority(tenant: Tenant, ticket: Ticket | None = None) -> int:
    """Triton's priority for a request's calls: 1 (the highest level of a model that declares
    two; the shipped steps declare none) for a tier above the standard one, or for a request
    admitted while its key held less than its share and other keys contended (so it does
    not queue behind a flood the gateway admitted earlier); else 0 (the default level)."""
    return 1 if tenant.priority > 0 or (ticket is not None and ticket.favoured) else 0


def rows(inputs: Sequence[Tensor]) -> int:
    """The inputs one call carries (its tensors' first dimension)."""
    return int(inputs[0].array.shape[0]) if inputs else 0


@contextlib.asynccontextmanager
async def _no_slot() -> AsyncIterator[Ticket | None]:
    yield None


class InferencePlane:
    """Built once by the app's lifespan; shared by /classify, /models/... and /v2."""

    def __init__(
        self,
        backend: GuardedBackend,
        admission: Admission,
        tracing: Tracing,
        metrics: GatewayMetrics,
        workers: CheckWorkers,
    ) -> None:
        self.backend = backend
        self.admission = admission
        self.tracing = tracing
        self.metrics = metrics
        self.workers = workers

    async def classify(
        self,
        entry: CatalogEntry,
        version: str,
        payload: ClassifyInput,
        top_k: int,
        request_id: str,
        started: float,
        admitted: bool = True,
        tenant: Tenant = ANONYMOUS,
    ) -> list[Classification]:
        """One classification per input, in input order; raises GatewayError subclasses.
        ``admitted=False`` takes no slot: a rollout's shadow (bounded by its own cap), or
        a request whose slot is held already (taken before its body)."""
        kind, model, tracing = entry.kind, entry.name, self.tracing
        # the span covers the wait for an in-flight slot (the gateway's queue)
        count = kind.count(payload)
        slot = self.admission.slot(tracing.span("admission"), tenant, model) if admitted else _no_slot()
        async with slot as ticket:
            with tracing.span(f"validate {kind.noun}s", {"gateway.inputs": count}):
                await self.workers.run(kind.payload_bytes(payload), kind.check, payload, entry.caps)
            metrics = self.metrics
            metrics.validation_duration.labels(model).observe(perf_counter() - started)
            metrics.inputs.labels(model).observe(count)
            calls = kind.calls(payload, top_k, entry.caps)
            invalid = kind.invalid()
            priority = triton_priority(tenant, ticket)
            with self.backend.circuit(model):
                if len(calls) == 1 and not (kind.isolates_failures and rows(calls[0]) > 1):
                    answers = [
                        await self.backend.infer(
                            model, version, calls[0], request_id, invalid=invalid, priority=priority
                        )
                    ]
                else:
                    answers = await self._fan_out(
                        model, version, calls, request_id, invalid, kind.isolates_failures, priority
                    )
        return kind.results(answers)

    async def _fan_out(
        self,
        model: str,
        version: str,
        calls: Sequence[Sequence[Tensor]],
        request_id: str,
        invalid: InvalidInputError,
        isolate: bool,
        priority: int = 0,
    ) -> list[InferResult]:
        """Every call at once; with ``isolate``, a call of several inputs refused as invalid
        is retried an input at a time (only then: a good batch costs one call)."""

        def infer(inputs: Sequence[Tensor]) -> Awaitable[InferResult]:
            return self.backend.infer(model, version, inputs, request_id, invalid=invalid, priority=priority)

        outcomes = await asyncio.gather(*(infer(inputs) for inputs in calls), return_exceptions=True)
        answers: list[InferResult] = []
        failures: list[tuple[int, GatewayError]] = []
        start = 0
        for inputs, outcome in zip(calls, outcomes, strict=True):
            count = rows(inputs)
            found: Sequence[object] = [outcome]
            if isolate and count > 1 and isinstance(outcome, InvalidInputError):
                singles = [
                    [Tensor(t.name, t.datatype, t.array[i : i + 1]) for t in inputs] for i in range(count)
                ]
                found = await asyncio.gather(*(infer(one) for one in singles), return_exceptions=True)
            for offset, result in enumerate(found):
                if isinstance(result, GatewayError):
                    failures.append((start + offset, result))
                elif isinstance(result, BaseException):
                    raise result
                else:
                    answers.append(cast(InferResult, result))
            start += count
        if failures:
            raise most_actionable(failures)
        return answers

    async def infer(
        self,
        model: str,
        version: str,
        inputs: Sequence[Tensor],
        outputs: Sequence[str],
        request_id: str,
        tenant: Tenant = ANONYMOUS,
        classes: Mapping[str, int] | None = None,
    ) -> InferResult:
        """One inference on checked tensors (the Open Inference Protocol routes);
        ``classes``: Triton's classification extension, by output."""
        async with self.admission.slot(self.tracing.span("admission"), tenant, model) as ticket:
            with self.backend.circuit(model):
                return await self.backend.infer(
                    model,
                    version,
                    inputs,
                    request_id,
                    outputs,
                    invalid=InvalidInputError("the model rejected the input"),
                    priority=triton_priority(tenant, ticket),
                    classes=classes,
                )
