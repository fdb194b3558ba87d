"""Triton behind a circuit breaker, its probe and a signature cache: what the serving side
adds to any transport (:class:`gateway.triton.backend.InferenceBackend`).

- The breaker (:mod:`gateway.serving.breaker`) is fed by a probe of Triton's liveness every
  ``probe_interval_seconds`` (at once when a call failed as unavailable or timed out) and
  by the outcome of each request's calls (:meth:`GuardedBackend.circuit`). While it is
  open, every call fails at once (503 with Retry-After), and status calls answer "not
  live" / "not ready" without waiting on Triton. Metadata calls never take the half-open
  trial: only an inference, whose outcome the breaker hears, may.
- Model signatures (what /v2 checks requests against) are kept ``SIGNATURE_TTL_SECONDS``,
  forgotten when a call to the model fails and on every load or unload.

The transport stays a transport: inference, metadata, the index, control and status.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from gateway.errors import InvalidInputError, TritonTimeoutError, TritonUnavailableError
from gateway.observe.metrics import GatewayMetrics
from gateway.periodic import Periodic
from gateway.serving.breaker import CircuitBreaker, CircuitState
from gateway.settings import TritonSettings
from gateway.triton.backend import (
    InferenceBackend,
    InferResult,
    ModelConfig,
    ModelSignature,
    ModelStatus,
    RepositoryModel,
    ServerStatus,
)
from gateway.triton.tensors import Tensor

# The logger keeps the name operators filter on.
logger = logging.getLogger("gateway.triton")
SIGNATURE_TTL_SECONDS = 30.0


class GuardedBackend:
    """``transport`` behind the breaker, its probe and the signature cache; built in the
    app's lifespan (the probe is a task on its loop) and closed there."""

    def __init__(
        self, transport: InferenceBackend, settings: TritonSettings, metrics: GatewayMetrics
    ) -> None:
        self.transport = transport
        self._settings = settings
        self._metrics = metrics
        self._signatures: dict[tuple[str, str], tuple[float, ModelSignature]] = {}
        self._breaker = CircuitBreaker(on_change=lambda state: metrics.circuit.state(state.value))
        self._probing = Periodic(
            "probing Triton", settings.probe_interval_seconds, self._probe, logger,
            immediately=True, wake=self._breaker.wake,
        )  # fmt: skip
        self._probing.start()

    async def _probe(self) -> None:
        self._breaker.on_probe(await self.transport.is_live(self._settings.probe_timeout_seconds))

    # -- the breaker -------------------------------------------------------------------
    def _unavailable(self, model: str) -> TritonUnavailableError:
        self._metrics.triton_failures.labels(model=model, code="CIRCUIT_OPEN").inc()
        return TritonUnavailableError("Triton is unavailable", retry_after=self._settings.retry_after_seconds)

    def _refuse_when_open(self, model: str) -> None:
        """Metadata calls fail fast while the circuit is open, but never take the
        half-open trial (a catalog refresh that took it left the circuit half-open)."""
        if self._breaker.state is CircuitState.OPEN:
            raise self._unavailable(model)

    def circuit(self, model: str) -> _Circuit:
        """Around one request's Triton calls: refused at once while the circuit is open;
        its outcome (whatever it is, cancellation included) is reported to the breaker, so
        a half-open trial always concludes."""
        if not self._breaker.allow():
            raise self._unavailable(model)
        return _Circuit(self._breaker)

    # -- the transport's calls, guarded ------------------------------------------------
    async def infer(
        self,
        model: str,
        version: str,
        inputs: Sequence[Tensor],
        request_id: str,
        outputs: Sequence[str] = (),
        invalid: InvalidInputError | None = None,
        priority: int = 0,
        classes: Mapping[str, int] | None = None,
    ) -> InferResult:
        try:
            return await self.transport.infer(
                model, version, inputs, request_id, outputs, invalid, priority, classes
            )
        except Exception:
            self._signatures.pop((model, version), None)  # the model may have changed
            raise

    async def model_signature(self, model: str, version: str) -> ModelSignature:
        key = (model, version)
        now = asyncio.get_running_loop().time()
        cached = self._signatures.get(key)
        if cached is not None and cached[0] > now:
            return cached[1]
        self._refuse_when_open(model)
        signature = await self.transport.model_signature(model, version)
        self._signatures[key] = (now + SIGNATURE_TTL_SECONDS, signature)
        return signature

    async def model_config(self, model: str) -> ModelConfig:
        self._refuse_when_open(model)
        return await self.transport.model_config(model)

    async def model_config_document(self, model: str, version: str) -> dict[str, Any]:
        self._refuse_when_open(model)
        return await self.transport.model_config_document(model, version)

    async def statistics(self, model: str, version: str) -> dict[str, Any]:
        self._refuse_when_open(model)
        return await self.transport.statistics(model, version)

    async def repository_index(self) -> list[RepositoryModel]:
        self._refuse_when_open("")
        return await self.transport.repository_index()

    async def load_model(self, model: str) -> None:
        try:
            await self.transport.load_model(model)
        finally:
            self._signatures.clear()  # what a model accepts may have changed

    async def unload_model(self, model: str, *, dependents: bool) -> None:
        try:
            await self.transport.unload_model(model, dependents=dependents)
        finally:
            self._signatures.clear()

    async def is_live(self, within: float) -> bool:
        if self._breaker.state is CircuitState.OPEN:
            return False
        return await self.transport.is_live(within)

    async def server_status(self) -> ServerStatus:
        if self._breaker.state is CircuitState.OPEN:
            return ServerStatus(live=False)  # known down: /readyz answers at once
        return await self.transport.server_status()

    async def model_status(self, model: str, version: str) -> ModelStatus:
        if self._breaker.state is CircuitState.OPEN:
            return ModelStatus(name=model, ready=False)
        return await self.transport.model_status(model, version)

    async def close(self) -> None:
        await self._probing.stop()
        await self.transport.close()


class _Circuit:
    """A request's calls as the breaker hears them (a class, not a generator: it is around
    every request)."""

    __slots__ = ("_breaker",)

    def __init__(self, breaker: CircuitBreaker) -> None:
        self._breaker = breaker

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: object) -> None:
        if kind is None:
            self._breaker.on_success()
        elif issubclass(kind, (TritonUnavailableError, TritonTimeoutError)):
            self._breaker.on_unreachable()
        else:
            self._breaker.on_other_outcome()
