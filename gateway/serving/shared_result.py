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

    async def get(self, make: Callable[[], Awaitable[T]]) -> T:
        now = monotonic()
        if self._task is None or (self._task.done() and now - self._started >= self._ttl):
            self._task = asyncio.ensure_future(make())
            self._started = now
        # shielded: a caller that goes away does not cancel the others' answer
        return await asyncio.shield(self._task)
