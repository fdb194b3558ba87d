"""A refusal to a connection refused moments ago waits, twice as long each time, up to the
longest (the gateway's Retry-After); the first refusal on a connection, and one after a Retry-After's pause, at once."""

from __future__ import annotations

import pytest

from gateway.serving import retries
from gateway.serving.retries import RetryDamper


def test_retries_at_once_wait_longer_each_time_up_to_the_longest() -> None:
    damper = RetryDamper(first_seconds=0.01, longest_seconds=0.1, forget_seconds=1.0)
    now, held = 0.0, []
    for _ in range(7):
        hold = damper.hold(("10.0.0.1", 50000), now)
        held.append(hold)
        now += hold + 0.001  # the client sends again as soon as it is answered
    assert held == pytest.approx([0.0, 0.01, 0.02, 0.04, 0.08, 0.1, 0.1])


def test_a_client_that_waits_its_retry_after_is_answered_at_once() -> None:
    damper = RetryDamper(forget_seconds=1.0)
    assert damper.hold("a", 0.0) == 0.0
    assert damper.hold("a", 0.1) > 0.0
    assert damper.hold("a", 1.2) == 0.0  # a second after its last refusal


def test_connections_are_held_apart_and_an_unknown_one_never() -> None:
    damper = RetryDamper()
    assert damper.hold("a", 0.0) == 0.0
    assert damper.hold("a", 0.0) > 0.0
    assert damper.hold("b", 0.0) == 0.0
    assert damper.hold(None, 0.0) == 0.0
    assert damper.hold(None, 0.0) == 0.0


def test_memory_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retries, "REMEMBERED", 100)
    damper = RetryDamper()
    for port in range(1000):
        damper.hold(("10.0.0.1", port), 0.0)
    assert len(damper._seen) == 100
    assert damper.hold(("10.0.0.1", 0), 0.0) == 0.0  # forgotten: the oldest went first
    assert damper.hold(("10.0.0.1", 999), 0.0) > 0.0


def test_a_client_held_the_longest_that_retries_at_once_is_held_as_long_again() -> None:
    """The streak runs from when the refusal went out: held the whole Retry-After (1 s)
    and back at once is not a client that waited 1 s (one refusal a second, not a cycle
    restarting at once every nine)."""
    damper = RetryDamper(first_seconds=0.01, longest_seconds=1.0, forget_seconds=1.0)
    now, held = 0.0, []
    for _ in range(14):
        hold = damper.hold("a", now)
        held.append(hold)
        now += hold + 0.001
    assert held[-4:] == [1.0, 1.0, 1.0, 1.0]
    assert held.count(0.0) == 1


def test_a_connection_refused_without_end_is_held_the_longest_for_ever() -> None:
    """A retry storm on one kept-alive connection for minutes: the thousandth hold is the
    longest, as the tenth (2.0 ** 1024 overflowed: the refusal was a 500)."""
    damper = RetryDamper(first_seconds=0.01, longest_seconds=0.1, forget_seconds=1.0)
    now = 0.0
    holds = []
    for _ in range(5000):
        holds.append(damper.hold(("127.0.0.1", 5555), now))
        now += holds[-1]
    assert holds[:6] == [0.0, 0.01, 0.02, 0.04, 0.08, 0.1]
    assert set(holds[5:]) == {0.1}
