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
  reserves room for the largest message gRPC may hand over (its bytes, once) before it
  reads (:meth:`BodyBudget.acquire`, which waits a bounded time for room in the order
  calls asked), then grows or shrinks that to what its message turned out to need
  (:meth:`Reservation.grow`, :meth:`Reservation.settle`).
- No caller holds more than its share: a known caller (its ``holder``, the caller's id)
  may hold at most :data:`HOLDER_SHARE` of the budget at once, so a key that opens calls
  and sends nothing, or stalls its uploads, leaves the rest to the others (its own
  further requests wait, or are refused, as over the budget). Callers that are not
  known (authentication off) are one crowd, with no share of their own.
"""

from __future__ import annotations

import asyncio
from collections import deque

from gateway.errors import BodyBudgetError

# The part of the budget one known caller may hold before its bytes arrive: a caller that
# stalls leaves the others half, room for a message being read and converted (grown past
# the share once read: Reservation.grow), and a caller reads one large message at a time.
HOLDER_SHARE = 0.5


class BodyBudget:
    """The process's body bytes in flight, against ``limit``, and each known caller's
    against its share. Used from one event loop."""

    def __init__(self, limit: int, retry_after: int) -> None:
        self.limit = limit
        self.share = int(limit * HOLDER_SHARE)
        self.used = 0
        self.retry_after = retry_after
        self._held: dict[str, int] = {}  # by holder, only while it holds something
        # (bytes, holder, holder whose share applies, grant)
        self._waiters: deque[tuple[int, str | None, str | None, asyncio.Future[None]]] = deque()

    def _refusal(self) -> BodyBudgetError:
        return BodyBudgetError(
            f"the gateway holds its limit of {self.limit} body bytes in flight; retry shortly",
            retry_after=self.retry_after,
            headers={"Connection": "close"},
        )

    def fits(self, count: int, holder: str | None = None) -> bool:
        """Whether ``count`` more bytes fit the budget, and ``holder``'s share."""
        return self.used + count <= self.limit and self._within_share(count, holder)

    def _within_share(self, count: int, holder: str | None) -> bool:
        return holder is None or self._held.get(holder, 0) + count <= self.share

    def _hold(self, count: int, holder: str | None) -> None:
        self.used += count
        if holder is not None:
            held = self._held.get(holder, 0) + count
            if held:
                self._held[holder] = held
            else:
                del self._held[holder]

    def take(self, count: int, holder: str | None = None) -> None:
        """``count`` bytes now, or the refusal. It may pass gRPC calls waiting for the room
        of a whole message (the largest they may send): their wait is bounded, and an HTTP
        request must not wait on them."""
        if not self.fits(count, holder):
            raise self._refusal()
        self._hold(count, holder)

    async def acquire(self, count: int, wait: float, holder: str | None = None, capped: bool = True) -> None:
        """``count`` bytes, waiting up to ``wait`` seconds behind those who asked first
        (a holder past its share waits for its own bytes, not blocking others; with
        ``capped`` False, for what a message already read needs, its share is not asked:
        only what a caller holds before its bytes arrive is)."""
        share_holder = holder if capped else None
        if count > self.limit or (share_holder is not None and count > self.share):
            raise self._refusal()
        if not self._waiters and self.fits(count, share_holder):
            self._hold(count, holder)
            return
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (count, holder, share_holder, granted)
        self._waiters.append(entry)
        self._wake()  # those ahead may wait for their own share only
        if granted.done():
            return
        try:
            async with asyncio.timeout(wait):
                await granted
        except BaseException as exc:
            if granted.done() and not granted.cancelled():
                self.give(count, holder)  # granted as the wait ended: handed on
            else:
                granted.cancel()
                if entry in self._waiters:  # else _wake dropped it already
                    self._waiters.remove(entry)
                self._wake()  # one that asked for more may have blocked smaller ones behind
            if isinstance(exc, TimeoutError):
                raise self._refusal() from None
            raise

    def give(self, count: int, holder: str | None = None) -> None:
        self._hold(-count, holder)
        self._wake()

    def _wake(self) -> None:
        """Grant waiters in the order they asked; one whose holder is at its share is
        passed over (it waits for its own bytes), one the budget cannot fit stops the
        rest (the larger would starve behind the smaller)."""
        for entry in list(self._waiters):
            count, holder, share_holder, granted = entry
            if granted.done():
                self._waiters.remove(entry)
                continue
            if not self._within_share(count, share_holder):
                continue
            if self.used + count > self.limit:
                return
            self._waiters.remove(entry)
            self._hold(count, holder)
            granted.set_result(None)

    def holding(self, holder: str) -> int:
        """What ``holder`` holds now."""
        return self._held.get(holder, 0)

    @property
    def waiting(self) -> int:
        return len(self._waiters)


class Reservation:
    """One request's share of the budget (none: unlimited, for a body read outside the
    app), held in the name of its caller (``holder``, set once the caller is known)."""

    def __init__(self, budget: BodyBudget | None, holder: str | None = None) -> None:
        self._budget = budget
        self.holder = holder
        self.held = 0  # taken from the budget
        self.charged = 0  # bytes actually read

    def admit(self, declared: int | None) -> None:
        """Before the first byte: the declared length is taken at once (a body that cannot
        fit is refused unread); without one, the budget must not be spent already."""
        if self._budget is None:
            return
        self._budget.take(declared or 1, self.holder)
        self.held += declared or 1

    async def reserve(self, most: int, wait: float) -> None:
        """Before a message of unknown length (up to ``most`` bytes) is read: all of it,
        waiting up to ``wait`` seconds for room."""
        if self._budget is None:
            return
        await self._budget.acquire(most, wait, self.holder)
        self.held += most

    async def grow(self, count: int, wait: float) -> None:
        """The message read needs ``count`` bytes in all (its conversions too): what is
        held already counts, the rest is waited for as :meth:`reserve` waits."""
        if self._budget is None or count <= self.held:
            return
        await self._budget.acquire(count - self.held, wait, self.holder, capped=False)
        self.held = count

    def settle(self, count: int) -> None:
        """The message is read and needs ``count`` bytes (at most what is held: see
        :meth:`grow`): the rest of the reservation is given back."""
        self.charged = count
        if self._budget is not None and count < self.held:
            self._budget.give(self.held - count, self.holder)
            self.held = count

    def charge(self, count: int) -> None:
        """``count`` more bytes read; past what is held, taken from the budget."""
        self.charged += count
        if self._budget is not None and self.charged > self.held:
            extra = self.charged - self.held
            self._budget.take(extra, self.holder)
            self.held += extra

    def release(self) -> None:
        if self._budget is not None and self.held:
            self._budget.give(self.held, self.holder)
        self.held = 0
