"""The one way the gateway runs background work every so often (the catalog refresh, the
routing read-back, the key-file watch, Triton's probe): a task that runs ``work`` each
period until stopped, logs a failure and carries on (a loop that died would leave its
health signal stale), and can be woken early. Standard library only."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable


class Periodic:
    """``work`` every ``interval`` seconds in a task of its own, from :meth:`start` to
    :meth:`stop`; ``immediately`` runs it once at start too; :meth:`wake` (or setting the
    ``wake`` event given) runs it now."""

    def __init__(
        self,
        name: str,
        interval: float,
        work: Callable[[], Awaitable[object]],
        logger: logging.Logger,
        *,
        immediately: bool = False,
        wake: asyncio.Event | None = None,
    ) -> None:
        self.name = name
        self.interval = interval
        self._work = work
        self._logger = logger
        self._immediately = immediately
        self._wake = wake or asyncio.Event()  # set by whoever wants the work run now
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=self.name)

    def wake(self) -> None:
        """Run the work now rather than at the end of the period."""
        self._wake.set()

    async def _run(self) -> None:
        if not self._immediately:
            await self._pause()
        while True:
            try:
                await self._work()
            except Exception:  # never let the loop die: the next period tries again
                self._logger.exception("%s failed", self.name)
            await self._pause()

    async def _pause(self) -> None:
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.interval):
                await self._wake.wait()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
