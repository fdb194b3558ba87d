"""Admission control: a cap on inference requests in flight, and the drain at shutdown.

Past the cap a request waits a short time for a slot, then gets 503 ``overloaded`` with
Retry-After: under overload clients hear "no" in milliseconds instead of queueing into
the Triton deadline. While draining (SIGTERM), new inference requests get 503
``shutting-down`` and ``/readyz`` is 503, so the load balancer moves on, while the
requests already admitted finish.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AbstractContextManager, asynccontextmanager, nullcontext
from typing import Any

from gateway.errors import OverloadedError, ShuttingDownError


class Admission:
    """Slots for inference requests; built by the app factory, shared with the server."""

    def __init__(self, limit: int, queue_seconds: float, retry_after: int) -> None:
        self.limit = limit
        self._queue_seconds = queue_seconds
        self._retry_after = retry_after
        self._slots = asyncio.Semaphore(limit)
        self.in_flight = 0
        self.leaving = False  # /readyz says 503; requests are still admitted
        self.draining = False
        self._idle = asyncio.Event()
        self._idle.set()

    def _check_open(self) -> None:
        if self.draining:
            raise ShuttingDownError(
                "the gateway is shutting down; retry on another replica",
                retry_after=self._retry_after,
                headers={"Connection": "close"},
            )

    async def acquire(self) -> None:
        """Take one in-flight slot for a request, or raise a 503 error (then do not release)."""
        self._check_open()
        if not self._slots.locked():
            await self._slots.acquire()  # free: returns at once
        else:
            try:
                await asyncio.wait_for(self._slots.acquire(), self._queue_seconds)
            except TimeoutError:
                raise OverloadedError(
                    f"over {self.limit} requests are in flight; retry shortly", retry_after=self._retry_after
                ) from None
        self.in_flight += 1
        self._idle.clear()
        if self.draining:  # it started draining while this one queued
            self.release()
            self._check_open()

    def release(self) -> None:
        """Give back the slot taken by :meth:`acquire`."""
        self.in_flight -= 1
        self._slots.release()
        if self.in_flight == 0:
            self._idle.set()

    @asynccontextmanager
    async def slot(self, waiting: AbstractContextManager[Any] | None = None) -> AsyncIterator[None]:
        """Hold one in-flight slot for the duration of the block; ``waiting`` (say, a
        tracing span) is entered only while the slot is being acquired."""
        with waiting or nullcontext():
            await self.acquire()
        try:
            yield
        finally:
            self.release()

    def start_leaving(self) -> None:
        """From now on /readyz says not ready, so load balancers stop sending; requests
        that still come are served (the drain delay before :meth:`start_draining`)."""
        self.leaving = True

    def start_draining(self) -> None:
        """From now on, refuse new requests (and /readyz says not ready)."""
        self.leaving = True
        self.draining = True

    async def wait_idle(self) -> None:
        """Return once no admitted request is in flight (bound it with asyncio.timeout)."""
        await self._idle.wait()
