"""The body budget every door draws on: HTTP takes at once or is refused; gRPC reserves
the largest message, waits a bounded time in the order calls asked, then keeps what its
message needs."""

from __future__ import annotations

import asyncio

import pytest

from gateway.errors import BodyBudgetError, OverloadedError
from gateway.serving.budget import BodyBudget, Reservation


def test_take_refuses_what_does_not_fit_as_an_overload() -> None:
    budget = BodyBudget(100, retry_after=1)
    budget.take(60)
    with pytest.raises(OverloadedError) as refused:
        budget.take(41)
    assert isinstance(refused.value, BodyBudgetError)
    assert refused.value.headers["Retry-After"] == "1"
    budget.give(60)
    budget.take(100)
    assert budget.used == 100


def test_a_reservation_waits_for_room_and_keeps_what_its_message_needs() -> None:
    async def scenario() -> list[int]:
        budget = BodyBudget(100, retry_after=1)
        first, second = Reservation(budget), Reservation(budget)
        await first.reserve(80, wait=1)
        waiting = asyncio.create_task(second.reserve(80, wait=1))
        await asyncio.sleep(0.01)
        seen = [budget.used, budget.waiting]
        first.settle(10)  # the first message was small: 70 given back
        await asyncio.sleep(0.01)
        seen += [budget.used, int(waiting.done())]
        first.release()
        await waiting
        seen += [budget.used]
        second.release()
        return [*seen, budget.used]

    assert asyncio.run(scenario()) == [80, 1, 90, 1, 80, 0]


def test_a_wait_that_runs_out_is_refused_and_leaves_nothing_held() -> None:
    async def scenario() -> tuple[int, int]:
        budget = BodyBudget(100, retry_after=1)
        await budget.acquire(100, wait=1)
        with pytest.raises(BodyBudgetError):
            await budget.acquire(50, wait=0.05)
        return budget.used, budget.waiting

    assert asyncio.run(scenario()) == (100, 0)


def test_waiters_are_served_in_order() -> None:
    async def scenario() -> list[str]:
        budget = BodyBudget(100, retry_after=1)
        order: list[str] = []
        await budget.acquire(100, wait=1)

        async def wait(name: str, count: int) -> None:
            await budget.acquire(count, wait=1)
            order.append(name)

        tasks = [asyncio.create_task(wait("a", 60)), asyncio.create_task(wait("b", 30))]
        await asyncio.sleep(0.01)
        budget.give(100)
        await asyncio.gather(*tasks)
        return [*order, str(budget.used)]

    assert asyncio.run(scenario()) == ["a", "b", "90"]


def test_a_cancelled_waiter_lets_the_ones_behind_it_through() -> None:
    async def scenario() -> int:
        budget = BodyBudget(100, retry_after=1)
        await budget.acquire(50, wait=1)
        big = asyncio.create_task(budget.acquire(80, wait=5))
        small = asyncio.create_task(budget.acquire(40, wait=5))
        await asyncio.sleep(0.01)
        assert not small.done()  # behind the big one
        big.cancel()
        await asyncio.sleep(0.01)
        assert small.done()
        return budget.used

    assert asyncio.run(scenario()) == 90


def test_more_than_the_whole_budget_is_refused_at_once() -> None:
    async def scenario() -> None:
        await BodyBudget(100, retry_after=1).acquire(101, wait=10)

    with pytest.raises(BodyBudgetError):
        asyncio.run(scenario())


def test_no_holder_holds_more_than_its_share_and_others_pass_it() -> None:
    """A known caller holds at most half the budget before its bytes arrive; past it, its
    own requests wait (or are refused) while another caller's are granted at once."""

    async def scenario() -> None:
        budget = BodyBudget(100, retry_after=1)
        await budget.acquire(30, wait=1, holder="idle")
        await budget.acquire(20, wait=1, holder="idle")  # 50: its share
        with pytest.raises(BodyBudgetError):
            budget.take(1, "idle")
        blocked = asyncio.create_task(budget.acquire(10, wait=5, holder="idle"))
        await asyncio.sleep(0.01)
        # the holder waiting at its share blocks nobody behind it
        await asyncio.wait_for(budget.acquire(20, wait=5, holder="other"), 0.5)
        assert not blocked.done()
        assert budget.holding("idle") == 50
        budget.give(30, "idle")
        await asyncio.wait_for(blocked, 0.5)
        assert budget.holding("idle") == 30
        with pytest.raises(BodyBudgetError):
            await budget.acquire(51, wait=1, holder="other")  # more than a share: never
        await budget.acquire(10, wait=1)  # the unknown crowd has no share of its own
        assert budget.used == 60

    asyncio.run(scenario())


def test_a_reservation_grows_to_what_its_message_needs() -> None:
    async def scenario() -> None:
        budget = BodyBudget(100, retry_after=1)
        reservation = Reservation(budget, holder="a")
        await reservation.reserve(10, wait=1)
        await reservation.grow(80, wait=1)  # what a message read needs: past the share
        assert (reservation.held, budget.holding("a"), budget.used) == (80, 80, 80)
        with pytest.raises(BodyBudgetError):
            await Reservation(budget, holder="a").reserve(1, wait=0.05)  # but nothing more before a read
        reservation.settle(25)
        assert (reservation.held, budget.used) == (25, 25)
        reservation.release()
        assert (budget.used, budget.holding("a")) == (0, 0)

    asyncio.run(scenario())
