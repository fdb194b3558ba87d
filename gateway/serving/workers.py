"""A bounded pool for the CPU-heavy checks of large bodies.

Parsing a 40 MiB JSON body, decoding base64 or walking image headers takes tens of
milliseconds; done on the event loop it would stall every other request, ``/livez``
included. Bodies above :data:`INLINE_BYTES` are checked in a few worker threads instead
(anyio's thread pool with its own capacity limiter); small ones inline, where a thread
hop would cost more than the work.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar, TypeVarTuple, Unpack

import anyio
import anyio.to_thread

T = TypeVar("T")
Args = TypeVarTuple("Args")

INLINE_BYTES = 64 * 1024


class CheckWorkers:
    """Runs a check inline or in one of ``threads`` workers, by the size of its input."""

    def __init__(self, threads: int) -> None:
        self._limiter = anyio.CapacityLimiter(threads)

    async def run(self, size: int, check: Callable[[Unpack[Args]], T], *args: *Args) -> T:
        if size <= INLINE_BYTES:
            return check(*args)
        return await anyio.to_thread.run_sync(check, *args, limiter=self._limiter)
