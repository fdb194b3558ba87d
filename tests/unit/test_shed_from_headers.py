"""The refusal before the body (gateway.serving.refusal) decides from the headers whether a request would be shed: a long queue that
the recent completion rate would not serve within the queue wait; never a cold replica's
burst, a short queue, or a key under its share."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Coroutine
from typing import Any

from gateway.errors import OverloadedError, ShuttingDownError
from gateway.serving.admission import ANONYMOUS, Admission, Tenant, Ticket
from gateway.serving.refusal import Refusals, UnreadBody

LIMIT = 4


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> Callable[[], None]:
    @functools.wraps(test)
    def sync() -> None:
        asyncio.run(test())

    return sync


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def _full(
    admission: Admission, queued: int, tenant: Tenant = ANONYMOUS
) -> tuple[list[Ticket], list[asyncio.Task[Ticket]]]:
    """Every slot held, ``queued`` more waiting."""
    held = [await admission.acquire(tenant) for _ in range(LIMIT)]
    waiting = [asyncio.create_task(admission.acquire(tenant)) for _ in range(queued)]
    await asyncio.sleep(0)
    assert admission.waiting == queued
    return held, waiting


async def _cancel(tasks: list[asyncio.Task[Ticket]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _complete(admission: Admission, clock: Clock, count: int, seconds: float) -> None:
    """``count`` requests served over ``seconds`` (slots taken and given back)."""
    for _ in range(count):
        clock.now += seconds / count
        admission.in_flight += 1
        admission.held[""] = admission.held.get("", 0) + 1
        admission.held_by_tier["standard"] = admission.held_by_tier.get("standard", 0) + 1
        admission._enter(Tenant())
        admission.release(Ticket(Tenant()))


@run
async def test_a_cold_replica_lets_a_burst_wait_for_its_slot() -> None:
    clock = Clock()
    admission = Admission(LIMIT, queue_seconds=0.5, retry_after=1, clock=clock)
    _held, waiting = await _full(admission, queued=3 * LIMIT)
    # nothing completed yet: how fast the queue moves is unknown
    assert not Refusals(admission).refuses()
    await _cancel(waiting)


@run
async def test_a_queue_the_recent_rate_cannot_serve_in_time_is_refused_unread() -> None:
    clock = Clock()
    admission = Admission(LIMIT, queue_seconds=0.5, retry_after=1, clock=clock)
    _complete(admission, clock, count=8, seconds=2.0)  # about 4 a second lately
    _held, waiting = await _full(admission, queued=LIMIT - 1)
    assert not Refusals(admission).refuses()  # a queue shorter than the limit: a burst
    more = [asyncio.create_task(admission.acquire()) for _ in range(2)]
    await asyncio.sleep(0)
    # 5 queued, about 2 served in the 0.5 s wait: this one would be shed
    assert Refusals(admission).refuses()
    refusal = Refusals(admission).refusal()
    assert isinstance(refusal, OverloadedError)
    assert refusal.headers.get("Connection") == "close"
    await _cancel(waiting + more)


@run
async def test_a_fast_queue_is_waited_in() -> None:
    clock = Clock()
    admission = Admission(LIMIT, queue_seconds=0.5, retry_after=1, clock=clock)
    _complete(admission, clock, count=400, seconds=2.0)  # about 200 a second: 100 in the wait
    _held, waiting = await _full(admission, queued=3 * LIMIT)
    assert not Refusals(admission).refuses()
    await _cancel(waiting)


@run
async def test_a_key_under_its_share_is_let_in_past_a_flood() -> None:
    clock = Clock()
    admission = Admission(LIMIT * 16, queue_seconds=0.5, retry_after=1, clock=clock)
    flood, quiet = Tenant("flood"), Tenant("quiet")
    _complete(admission, clock, count=400, seconds=2.0)  # about 130 a second: 65 in the wait
    held = [await admission.acquire(flood) for _ in range(admission.limit - admission.reserve)]
    waiting = [asyncio.create_task(admission.acquire(flood)) for _ in range(3 * admission.limit)]
    await asyncio.sleep(0)
    assert Refusals(admission).refuses(flood)
    assert not Refusals(admission).refuses(quiet)
    await _cancel(waiting)
    del held


@run
async def test_a_draining_gateway_refuses_every_request_unread() -> None:
    admission = Admission(LIMIT, queue_seconds=0.5, retry_after=1)
    admission.start_draining()
    assert Refusals(admission).refuses()
    assert isinstance(Refusals(admission).refusal(), ShuttingDownError)


@run
async def test_a_probe_of_a_slot_is_no_completion() -> None:
    clock = Clock()
    admission = Admission(LIMIT, queue_seconds=0.5, retry_after=1, clock=clock)
    for _ in range(10):
        admission.release(await admission.acquire(), served=False)
    assert admission.throughput.recent(clock()) == 0.0
    admission.release(await admission.acquire())
    assert admission.throughput.recent(clock()) == 1.0


@run
async def test_a_callers_own_uploads_beyond_what_the_wait_serves_are_refused_and_no_one_elses() -> None:
    """300 uploads at once from one key: the slots and what completes within the queue
    wait read their bodies; the rest are refused from their headers (before, each read its
    body and waited first: nothing waited yet when its head came; then a second limit's
    worth was let in besides, all of it refused after its upload). Another key's request
    is not refused for them, and an upload counts only until its body is in."""
    clock = Clock()
    admission = Admission(LIMIT, queue_seconds=0.5, retry_after=1, clock=clock)
    refusals = Refusals(admission)
    _complete(admission, clock, count=8, seconds=2.0)  # about 4 a second: 2 in the wait
    storm, other = Tenant("storm"), Tenant("other")
    uploads, refused = [], 0
    for _ in range(300):
        if refusals.refuses(storm):
            refused += 1
            continue
        upload = refusals.before_body(storm, UnreadBody())
        await upload.__aenter__()
        uploads.append(upload)
    assert len(uploads) == LIMIT + 1  # the limit, and the 1.3 that complete within the wait
    assert refused == 300 - (LIMIT + 1)
    assert refusals.armed()
    assert not refusals.refuses(other)
    for upload in uploads[:LIMIT]:  # bodies in: no longer uploading
        await upload.__aexit__(None, None, None)
    assert refusals.uploading == 1
    assert not refusals.refuses(storm)
    for upload in uploads[LIMIT:]:
        await upload.__aexit__(None, None, None)
    assert refusals.uploading == 0


@run
async def test_heads_arrived_before_their_routes_run_count_as_their_keys_uploads() -> None:
    """The HTTP protocol counts a head it lets through (``arrived``) until its route runs:
    heads parsed in one turn of the loop see those ahead of them. Each is named (its key
    found) only when the rule needs a key's count; a head whose caller has no name counts
    in all only; ending a count twice ends it once."""
    clock = Clock()
    admission = Admission(LIMIT, queue_seconds=0.5, retry_after=1, clock=clock)
    refusals = Refusals(admission)
    _complete(admission, clock, count=8, seconds=2.0)  # about 4 a second: 2 in the wait
    storm, other = Tenant("storm"), Tenant("other")
    named: list[str] = []

    def name(tenant_id: str) -> Callable[[], str | None]:
        def named_now() -> str | None:
            named.append(tenant_id)
            return tenant_id or None

        return named_now

    ends = [refusals.arrived(name("storm")) for _ in range(LIMIT + 1)]
    ends.append(refusals.arrived(name("")))  # no key
    assert named == []  # nothing asked yet
    assert refusals.uploading == LIMIT + 2
    assert refusals.armed()
    assert refusals.refuses(storm)  # the limit, and the 1.3 that complete in the wait, ahead
    assert sorted(named) == ["", *["storm"] * (LIMIT + 1)]  # each named once
    assert not refusals.refuses(other)
    ends[0]()  # its route runs: no longer counted as arrived
    ends[0]()
    assert refusals.uploading == LIMIT + 1
    assert not refusals.refuses(storm)
    for end in ends:
        end()
    assert refusals.uploading == 0
    assert len(named) == LIMIT + 2


@run
async def test_a_cold_replica_refuses_no_upload_of_its_own() -> None:
    admission = Admission(LIMIT, queue_seconds=0.5, retry_after=1, clock=Clock())
    refusals = Refusals(admission)
    storm = Tenant("storm")
    for _ in range(5 * LIMIT):
        assert not refusals.refuses(storm)
        await refusals.before_body(storm, UnreadBody()).__aenter__()
    assert refusals.uploading == 5 * LIMIT


@run
async def test_an_upload_that_asked_to_continue_is_not_counted_against_its_key() -> None:
    """A client that sends `Expect: 100-continue` waited for a slot before its upload; if it
    then sends nothing, its key's other requests are not refused for it
    (tests/integration/test_attacks.py: silent Expect clients starve nobody)."""
    clock = Clock()
    admission = Admission(LIMIT, queue_seconds=0.5, retry_after=1, clock=clock)
    refusals = Refusals(admission)
    _complete(admission, clock, count=8, seconds=2.0)
    key = Tenant("key")
    for _ in range(5 * LIMIT):
        await refusals.before_body(key, UnreadBody(expects_continue=True)).__aenter__()
    assert refusals.uploading == 0
    assert not refusals.refuses(key)


@run
async def test_retry_after_is_when_the_queue_drains_and_later_callers_are_told_later_seconds() -> None:
    """Issue 54 item 2: the Retry-After of a refusal is the queue's measured drain, not a
    fixed second. At 10 completions a second, 30 waiting: the first refused is told 4 s
    (31 / 10, whole seconds up), and the next 10 refused are spread over the seconds after
    it, a second's completions to each; the most is ``retry_after_max``."""
    clock = Clock()
    admission = Admission(LIMIT, queue_seconds=0.5, retry_after=1, clock=clock, retry_after_max=8)
    _complete(admission, clock, 100, 10.0)  # 10 a second (the throughput's 2 s, five times)
    _held, waiting = await _full(admission, queued=30)
    refusals = Refusals(admission)
    assert refusals.refuses()
    told = [int(refusals.refusal().headers["Retry-After"]) for _ in range(60)]
    assert told[0] == 4, told
    assert told == sorted(told), told
    assert 9 <= told.count(5) <= 11, told  # a second's completions each
    assert 9 <= told.count(6) <= 11, told
    assert told[-1] == 8, told  # capped
    await _cancel(waiting)


@run
async def test_retry_after_is_the_least_while_nothing_completes_and_the_fixed_one_without_a_most() -> None:
    clock = Clock()
    admission = Admission(LIMIT, queue_seconds=0.5, retry_after=2, clock=clock, retry_after_max=30)
    _held, waiting = await _full(admission, queued=30)
    # nothing completed: no rate to drain at, the least is told
    assert Refusals(admission).refusal().headers["Retry-After"] == "2"
    fixed = Admission(LIMIT, queue_seconds=0.5, retry_after=3, clock=clock)
    _complete(fixed, clock, 20, 2.0)
    assert Refusals(fixed).refusal().headers["Retry-After"] == "3"
    await _cancel(waiting)
