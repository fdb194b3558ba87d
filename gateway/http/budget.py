"""A budget of body bytes in flight: what the gateway holds for bodies being read.

The in-flight cap bounds requests being worked on, and each body has a cap; neither
bounds the bodies being uploaded at once, which a crowd of clients can make as large as
``max_connections`` times the body cap (100 raw 7 MiB uploads: +694 MiB of RSS). Every
byte a body reader takes in (after decompression: what is held) is charged here, and a
request's bytes are given back when its answer is sent. A request whose declared length
does not fit, or which arrives while the budget is spent, gets 503 ``overloaded`` with
Retry-After before its body is read (and ``Connection: close``: the body stays unread);
one that overruns it while uploading gets the same, at once.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.errors import OverloadedError

_KEY = "body_reservation"


class BodyBudget:
    """The process's body bytes in flight, against ``limit``."""

    def __init__(self, limit: int, retry_after: int) -> None:
        self.limit = limit
        self.used = 0
        self.retry_after = retry_after

    def take(self, count: int) -> None:
        if self.used + count > self.limit:
            raise OverloadedError(
                f"the gateway holds its limit of {self.limit} body bytes in flight; retry shortly",
                retry_after=self.retry_after,
                headers={"Connection": "close"},
            )
        self.used += count

    def give(self, count: int) -> None:
        self.used -= count


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

    def charge(self, count: int) -> None:
        """``count`` more bytes read; past what is held, taken from the budget."""
        self.charged += count
        if self._budget is not None and self.charged > self.held:
            extra = self.charged - self.held
            self._budget.take(extra)
            self.held += extra

    def release(self) -> None:
        if self._budget is not None:
            self._budget.give(self.held)
        self.held = 0


def reservation_of(scope: Scope) -> Reservation:
    """The request's reservation (set by :class:`BodyBudgetMiddleware`)."""
    state = scope.get("state")
    reservation = state.get(_KEY) if isinstance(state, dict) else None
    if isinstance(reservation, Reservation):
        return reservation
    return Reservation(None)


class BodyBudgetMiddleware:
    """Gives each HTTP request a reservation, and returns its bytes once it is answered."""

    def __init__(self, app: ASGIApp, budget: BodyBudget) -> None:
        self.app = app
        self.budget = budget

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        reservation = Reservation(self.budget)
        scope.setdefault("state", {})[_KEY] = reservation
        try:
            await self.app(scope, receive, send)
        finally:
            reservation.release()
