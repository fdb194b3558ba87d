"""Admission shares slots fairly between keys: a freed slot goes to the waiting key of the
highest priority holding the fewest slots for its share; idle slots are borrowed freely."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from gateway.errors import OverloadedError
from gateway.serving.admission import Admission, Tenant, Ticket
from gateway.serving.queuegate import GateSettings, QueueGate
from gateway.serving.refusal import Refusals

FLOOD = Tenant("flood")
QUIET = Tenant("quiet")
GOLD = Tenant("gold", tier="gold", share=4, priority=1)


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> Callable[[], None]:
    """Runs an async test on a fresh event loop (the suite has no async plugin)."""

    @functools.wraps(test)
    def sync() -> None:
        asyncio.run(test())

    return sync


@run
async def test_idle_slots_are_borrowed_and_a_freed_slot_goes_to_the_other_key() -> None:
    admission = Admission(4, queue_seconds=5, retry_after=1)
    held = [await admission.acquire(FLOOD) for _ in range(4)]  # the flood borrows everything
    assert admission.held == {"flood": 4}
    flooding = [asyncio.create_task(admission.acquire(FLOOD)) for _ in range(20)]
    await asyncio.sleep(0)
    quiet = asyncio.create_task(admission.acquire(QUIET))
    await asyncio.sleep(0)
    admission.release(held.pop())
    # the slot went to the quiet key although 20 of the flood queued before it
    assert admission.held == {"flood": 3, "quiet": 1}
    assert (await quiet).tenant == QUIET
    admission.release(held.pop())
    assert admission.held == {"flood": 3, "quiet": 1}  # then to the flood again
    for task in flooding:
        task.cancel()
    await asyncio.gather(*flooding, return_exceptions=True)


@run
async def test_shares_weight_the_slots_while_keys_contend() -> None:
    admission = Admission(10, queue_seconds=5, retry_after=1)
    big, small = Tenant("big", share=4), Tenant("small", share=1)
    tickets: list[Ticket] = [await admission.acquire(Tenant("other")) for _ in range(10)]
    waiting = [asyncio.create_task(admission.acquire(t)) for t in [big] * 20 + [small] * 20]
    await asyncio.sleep(0)
    for ticket in tickets:
        admission.release(ticket)
    await asyncio.sleep(0)
    assert admission.held == {"big": 8, "small": 2}
    for task in waiting:
        task.cancel()
    await asyncio.gather(*waiting, return_exceptions=True)


@run
async def test_a_higher_priority_is_admitted_first() -> None:
    admission = Admission(1, queue_seconds=5, retry_after=1)
    ticket = await admission.acquire(QUIET)
    standard = asyncio.create_task(admission.acquire(FLOOD))
    await asyncio.sleep(0)
    gold = asyncio.create_task(admission.acquire(GOLD))
    await asyncio.sleep(0)
    admission.release(ticket)
    assert admission.held == {"gold": 1}  # although the standard key waited longer
    admission.release(await gold)
    assert (await standard).tenant == FLOOD


@run
async def test_a_waiter_that_times_out_gets_503_and_leaves_no_trace() -> None:
    admission = Admission(1, queue_seconds=0.01, retry_after=3)
    ticket = await admission.acquire(FLOOD)
    with pytest.raises(OverloadedError) as refused:
        await admission.acquire(FLOOD)  # over its share: the queue wait, then 503
    assert refused.value.headers["Retry-After"] == "3"
    assert admission.waiting == 0
    admission.release(ticket)
    assert admission.in_flight == 0
    assert admission.held == {}
    assert (await admission.acquire(QUIET)).tenant == QUIET


@run
async def test_a_cancelled_waiter_returns_a_slot_granted_to_it() -> None:
    admission = Admission(1, queue_seconds=5, retry_after=1)
    ticket = await admission.acquire(FLOOD)
    waiter = asyncio.create_task(admission.acquire(QUIET))
    await asyncio.sleep(0)
    admission.release(ticket)  # granted: the future is set, the task not yet resumed
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert admission.in_flight == 0
    assert admission.held == {}


@run
async def test_a_key_below_its_share_is_admitted_at_once_while_the_limit_falls() -> None:
    gate = QueueGate(GateSettings(ceiling=10))
    admission = Admission(10, queue_seconds=5, retry_after=1, gate=gate)
    held = [await admission.acquire(FLOOD, "m") for _ in range(8)]
    gate.gates["m"].limit = 2  # the model's batches measured dearer: 8 in flight, 2 allowed
    flooding = asyncio.create_task(admission.acquire(FLOOD, "m"))
    await asyncio.sleep(0)
    assert not flooding.done()  # over its share: it waits for the limit
    quiet = await asyncio.wait_for(admission.acquire(QUIET, "m"), 1)  # below its share (1 of 2): at once
    assert admission.held == {"flood": 8, "quiet": 1}
    with pytest.raises(TimeoutError):  # its share is 1: a second one waits like anyone
        await asyncio.wait_for(asyncio.shield(asyncio.ensure_future(admission.acquire(QUIET, "m"))), 0.05)
    admission.release(quiet)
    for ticket in held:
        admission.release(ticket)
    flooding.cancel()
    await asyncio.gather(flooding, return_exceptions=True)


@run
async def test_at_the_ceiling_a_slot_the_flood_gives_back_goes_to_the_other_key() -> None:
    gate = QueueGate(GateSettings(ceiling=4))
    admission = Admission(4, queue_seconds=5, retry_after=1, gate=gate)
    held = [await admission.acquire(FLOOD, "m") for _ in range(4)]  # the flood holds the ceiling
    gate.gates["m"].limit = 1  # then Triton slows down: 4 in flight, 1 allowed
    flooding = asyncio.create_task(admission.acquire(FLOOD, "m"))
    quiet = asyncio.create_task(admission.acquire(QUIET, "m"))
    await asyncio.sleep(0)
    assert not quiet.done()  # no slot under the ceiling
    admission.release(held.pop())  # still 3 in flight over a limit of 1: handed over
    assert (await asyncio.wait_for(quiet, 1)).tenant == QUIET
    assert admission.held == {"flood": 3, "quiet": 1}
    admission.release(held.pop())  # only the flood waits: its own slot is not handed back
    await asyncio.sleep(0)
    assert not flooding.done()
    assert admission.in_flight == 3
    flooding.cancel()
    await asyncio.gather(flooding, return_exceptions=True)


@run
async def test_a_key_over_its_share_leaves_the_reserve_for_the_others() -> None:
    admission = Admission(64, queue_seconds=0.01, retry_after=1)
    assert admission.reserve == 4
    held = [await admission.acquire(FLOOD) for _ in range(60)]
    with pytest.raises(OverloadedError):  # the last 4 of the ceiling are not the flood's
        await admission.acquire(FLOOD)
    quiet = await asyncio.wait_for(admission.acquire(QUIET), 1)  # at once, from the reserve
    assert quiet.favoured  # ahead of the flood in Triton
    assert not held[-1].favoured
    assert admission.in_flight == 61
    for ticket in [*held, quiet]:
        admission.release(ticket)
    anonymous = [await admission.acquire() for _ in range(64)]  # without keys: no reserve
    assert admission.in_flight == 64
    for ticket in anonymous:
        admission.release(ticket)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@run
async def test_a_standing_queue_serves_the_newest_first() -> None:
    """A queue not empty for queue_seconds is overload, not a burst: a freed slot goes to
    the newest waiter, so the admitted do not pay the whole wait (the oldest still get
    their whole queue_seconds before a 503, no sooner)."""
    clock = Clock()
    admission = Admission(1, queue_seconds=2.0, retry_after=1, clock=clock)
    ticket = await admission.acquire(FLOOD)
    oldest = asyncio.create_task(admission.acquire(FLOOD))
    await asyncio.sleep(0)
    clock.now = 1.0
    middle = asyncio.create_task(admission.acquire(FLOOD))
    await asyncio.sleep(0)
    assert not admission.standing(clock.now)  # queued for 1 s of 2: a burst, first come first served
    admission.release(ticket)
    ticket = await oldest
    clock.now = 2.5
    newest = asyncio.create_task(admission.acquire(FLOOD))
    await asyncio.sleep(0)
    assert admission.standing(clock.now)  # the queue has not been empty since 1.0
    admission.release(ticket)
    ticket = await asyncio.wait_for(newest, 1)
    assert not middle.done()  # it keeps waiting its own queue_seconds
    admission.release(ticket)
    admission.release(await middle)
    assert not admission.standing(clock.now)  # empty again
    assert admission.waiting == 0


@run
async def test_without_keys_the_limit_is_the_only_rule() -> None:
    admission = Admission(1, queue_seconds=0.01, retry_after=1)
    ticket = await admission.acquire()
    with pytest.raises(OverloadedError):
        await admission.acquire()
    admission.release(ticket)


@run
async def test_under_a_small_static_limit_a_quiet_key_is_next_in_line_not_refused() -> None:
    """A static limit under 16 keeps no reserve: a flood holds every slot. A key under its
    share is then neither refused from its headers nor timed out after the queue wait:
    the next slot freed is its, ahead of the flood's earlier waiters (before, a quiet key
    beside a flood on max_in_flight 8 had 10 of 12 requests refused)."""
    admission = Admission(2, queue_seconds=0.01, retry_after=1)
    refusals = Refusals(admission)
    held = [await admission.acquire(FLOOD) for _ in range(2)]
    flooding = [asyncio.create_task(admission.acquire(FLOOD)) for _ in range(4)]
    await asyncio.sleep(0)
    assert not refusals.refuses(QUIET)
    quiet = asyncio.create_task(admission.acquire(QUIET))
    await asyncio.sleep(0.05)  # past the queue wait: the flood's waiters are 503 by now
    assert not quiet.done()
    admission.release(held.pop())
    ticket = await asyncio.wait_for(quiet, 1)
    assert ticket.tenant == QUIET
    admission.release(ticket)
    admission.release(held.pop())
    outcomes = await asyncio.gather(*flooding, return_exceptions=True)
    assert all(isinstance(o, OverloadedError) for o in outcomes)


@run
async def test_only_a_keys_requests_within_its_share_wait_long_for_a_slot() -> None:
    """A key under its share waits for the next slot up to retry_after_max, not the queue
    wait; but only as many of its requests as its share: the rest of a burst it sends at
    once wait the queue wait, so no key holds more long waits (and bodies read) than its
    share."""
    admission = Admission(2, queue_seconds=0.01, retry_after=1, retry_after_max=5)
    held = [await admission.acquire(FLOOD) for _ in range(2)]
    quiet = [asyncio.create_task(admission.acquire(QUIET)) for _ in range(3)]
    await asyncio.sleep(1.2)  # past retry_after: the first is still waiting, the rest refused
    assert [task.done() for task in quiet] == [False, True, True]
    assert all(isinstance(task.exception(), OverloadedError) for task in quiet[1:])
    admission.release(held.pop())
    ticket = await asyncio.wait_for(quiet[0], 1)
    assert ticket.tenant == QUIET
    admission.release(ticket)
    admission.release(held.pop())
    assert admission.in_flight == 0
    assert admission.waiting == 0
