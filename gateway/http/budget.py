"""The HTTP door's side of the body budget (gateway.serving.budget): each request gets a
reservation before anything reads its body, and gives its bytes back once answered. A
request whose declared length does not fit, or which arrives while the budget is spent,
gets 503 ``overloaded`` with Retry-After before its body is read (and ``Connection:
close``: the body stays unread); one that overruns it while uploading gets the same, at once.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.serving.budget import BodyBudget, Reservation

_KEY = "body_reservation"


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
