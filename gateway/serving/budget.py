"""A budget of body bytes in flight: what the gateway holds for request bodies and
messages being read, one budget for every door.

The in-flight cap bounds requests being worked on, and each body has a cap; neither
bounds the bodies being uploaded at once, which a crowd of clients can make as large as
``max_connections`` times the body cap (100 raw 7 MiB uploads: +694 MiB of RSS; 64 gRPC
calls of 40 MiB: +5.9 GiB). Every byte a door takes in (after decompression: what is
held) is charged here, and a request's bytes are given back when its answer is sent.

- HTTP knows a body's length from its headers (or charges as it reads): a request that
  does not fit, or that arrives while the budget is spent, is refused before its body is
  read (:meth:`BodyBudget.take`).
- gRPC reads a whole message at once and its length is not known before, so a call
  reserves the largest message it may send before it reads (:meth:`BodyBudget.acquire`,
  which waits a bounded time for room in the order calls asked), then keeps what its
  message turned out to need (:meth:`Reservation.settle`).
"""

from __future__ import annotations

import asyncio
from collections import deque

from gateway.errors import BodyBudgetError


class BodyBudget:
    """The process's body bytes in flight, against ``limit``. Used from one event loop."""

    def __init__(self, limit: int, retry_after: int) -> None:
        self.limit = limit
        self.used = 0
        self.retry_after = retry_after
        self._waiters: deque[tuple[int, asyncio.Future[None]]] = deque()

    def _refusal(self) -> BodyBudgetError:
        return BodyBudgetError(
            f"the gateway holds its limit of {self.limit} body bytes in flight; retry shortly",
            retry_after=self.retry_after,
            headers={"Connection": "close"},
        )

    def fits(self, count: int) -> bool:
        return self.used + count <= self.limit

    def take(self, count: int) -> None:
        """``count`` bytes now, or the refusal. It may pass gRPC calls waiting for the room
        of a whole message (the largest they may send): their wait is bounded, and an HTTP
        request must not wait on them."""
        if not self.fits(count):
            raise self._refusal()
        self.used += count

    async def acquire(self, count: int, wait: float) -> None:
        """``count`` bytes, waiting up to ``wait`` seconds behind those who asked first."""
        if count > self.limit:
            raise self._refusal()
        if not self._waiters and self.fits(count):
            self.used += count
            return
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (count, granted)
        self._waiters.append(entry)
        try:
            async with asyncio.timeout(wait):
                await granted
        except BaseException as exc:
            if granted.done() and not granted.cancelled():
                self.give(count)  # granted as the wait ended: handed on
            else:
                granted.cancel()
                if entry in self._waiters:  # else _wake dropped it already
                    self._waiters.remove(entry)
                self._wake()  # one that asked for more may have blocked smaller ones behind
            if isinstance(exc, TimeoutError):
                raise self._refusal() from None
            raise

    def give(self, count: int) -> None:
        self.used -= count
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self.fits(self._waiters[0][0]):
            count, granted = self._waiters.popleft()
            if granted.done():
                continue
            self.used += count
            granted.set_result(None)

    @property
    def waiting(self) -> int:
        return len(self._waiters)


class Reservation:
    """One request's share of the budget (none: unlimited, for a body read outside the app)."""

    def __init__(self, budget: BodyBudget | None) -> None:
        self._budget = budget
        self.held = 0  # taken from the budget
        self.charged = 0  # bytes actually read

    def admit(self, declared: int | None) -> None:
        """Before the first byte: the declared length is taken at once (a body that cannot
        fit is refused unread); without one, the budget must not be spent already."""
        if self._budget is None:
            return
        self._budget.take(declared or 1)
        self.held += declared or 1

    async def reserve(self, most: int, wait: float) -> None:
        """Before a message of unknown length (up to ``most`` bytes) is read: all of it,
        waiting up to ``wait`` seconds for room."""
        if self._budget is None:
            return
        await self._budget.acquire(most, wait)
        self.held += most

    def settle(self, count: int) -> None:
        """The message is read and needs ``count`` bytes: the rest of the reservation is
        given back (a message larger than reserved cannot happen: gRPC caps it)."""
        self.charged = count
        if self._budget is not None and count < self.held:
            self._budget.give(self.held - count)
            self.held = count

    def charge(self, count: int) -> None:
        """``count`` more bytes read; past what is held, taken from the budget."""
        self.charged += count
        if self._budget is not None and self.charged > self.held:
            extra = self.charged - self.held
            self._budget.take(extra)
            self.held += extra

    def release(self) -> None:
        if self._budget is not None and self.held:
            self._budget.give(self.held)
        self.held = 0
