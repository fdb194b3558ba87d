"""One answer shared by every caller for a moment: single flight with a short memory.

A readiness probe costs Triton a few dozen gRPC calls (server, each default model and its
steps, the repository index). Probes carry no key, so anyone can send them: unshared, a
flood of ``/readyz`` is a flood of calls to Triton. Callers that arrive while an answer
is being worked out wait for that one; callers within ``ttl`` seconds of it reuse it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from time import monotonic
from typing import Generic, TypeVar

T = TypeVar("T")


class SharedResult(Generic[T]):
    """The latest result of ``make`` (or its error), recomputed at most every ``ttl`` s."""

    def __init__(self, ttl: float) -> None:
        self._ttl = ttl
        self._task: asyncio.Future[T] | None = None
        self._started = 0.0
        self._generation = 0

    async def get(self, make: Callable[[], Awaitable[T]], generation: int = 0) -> T:
        """The shared answer; a new ``generation`` (say, the catalog was read again after
        a model was loaded or unloaded) makes it stale at once."""
        now = monotonic()
        stale = self._task is None or generation != self._generation
        if stale or (self._task is not None and self._task.done() and now - self._started >= self._ttl):
            self._task = asyncio.ensure_future(make())
            self._started = now
            self._generation = generation
        assert self._task is not None
        # shielded: a caller that goes away does not cancel the others' answer
        return await asyncio.shield(self._task)
