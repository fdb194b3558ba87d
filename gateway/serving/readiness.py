"""Whether the gateway should be sent work: one answer that ``/readyz``, ``/v2/health/ready``
and the gRPC health service (and ``ServerReady``) all read, draining included.

- :meth:`Readiness.checks` (``/readyz``): Triton live and every default model ready, but
  those unloaded on purpose through model control (``degraded``: the others are still
  served); ``accepting`` false while the gateway drains.
- :meth:`Readiness.ready` (the Open Inference Protocol's readiness, on both doors): not
  draining, and every default and allow-listed model ready at the version requests go to.
- :meth:`Readiness.live`: Triton's liveness.

Unauthenticated probes share Triton's answers for ``probe_seconds`` (a probe storm asks
Triton once), and a catalog change asks again at once.
"""

from __future__ import annotations

import asyncio

from gateway.errors import GatewayError
from gateway.serving.admission import Admission
from gateway.serving.catalog import Catalog
from gateway.serving.shared_result import SharedResult
from gateway.triton.backend import InferenceBackend, ModelStatus, ServerStatus

Checks = tuple[dict[str, bool], set[str]]


class Readiness:
    """Built once by the runtime; read by every door's probes."""

    def __init__(
        self,
        catalog: Catalog,
        backend: InferenceBackend,
        admission: Admission,
        allow_listed: frozenset[str],
        probe_seconds: float = 0.5,
    ) -> None:
        self.catalog = catalog
        self.backend = backend
        self.admission = admission
        self.allow_listed = allow_listed
        self._checks: SharedResult[Checks] = SharedResult(probe_seconds)
        self._served: SharedResult[list[ModelStatus]] = SharedResult(probe_seconds)
        self._live: SharedResult[ServerStatus] = SharedResult(probe_seconds)

    @property
    def draining(self) -> bool:
        return self.admission.leaving

    async def served_statuses(self, *, allow_listed: bool = False) -> list[ModelStatus]:
        """The default models (and with ``allow_listed`` the allow-listed ones) as Triton
        sees them now, at the versions requests go to (their pins)."""
        names = list(self.catalog.defaults().values())
        if allow_listed:
            names.extend(sorted(self.allow_listed))
        unique = dict.fromkeys(names)
        return list(
            await asyncio.gather(*(self.backend.model_status(n, self.catalog.version(n)) for n in unique))
        )

    async def live(self) -> bool:
        """Triton's liveness, shared by the probes of a moment."""
        return (await self._live.get(self.backend.server_status)).live

    async def ready(self) -> bool:
        """Not draining, and every default and allow-listed model ready."""
        if self.draining:
            return False
        statuses = await self._served.get(
            lambda: self.served_statuses(allow_listed=True), self.catalog.generation
        )
        return all(s.ready for s in statuses)

    async def checks(self) -> Checks:
        """``/readyz``'s checks and the default models unloaded on purpose."""
        if self.draining:
            return {"accepting": False}, set()
        return await self._checks.get(self._triton_checks, self.catalog.generation)

    async def _triton_checks(self) -> Checks:
        server, statuses = await asyncio.gather(self.backend.server_status(), self.served_statuses())
        # only a live Triton unloads a model on purpose (and a dead one is not asked twice)
        unloaded = await self._unloaded(statuses) if server.live else set()
        checks = {"accepting": True, "triton_live": server.live}
        for status in statuses:
            # an ensemble is ready with all its steps (which stay unnamed: /admin/served names them)
            checks[f"model:{status.name}"] = status.ready and all(step.ready for step in status.composing)
        if statuses and len(unloaded) == len(statuses):
            unloaded = set()  # nothing left to serve: not ready
        return checks, unloaded

    async def _unloaded(self, statuses: list[ModelStatus]) -> set[str]:
        """Which of the models that are not ready Triton says were unloaded on purpose
        (asked only when one is not ready; an index Triton will not give means none)."""
        if all(status.ready for status in statuses):
            return set()
        try:
            index = await self.backend.repository_index()
        except GatewayError:
            return set()
        down = {status.name for status in statuses if not status.ready}
        ready = {m.name for m in index if m.state == "READY"}
        return {m.name for m in index if m.unloaded and m.name in down and m.name not in ready}
