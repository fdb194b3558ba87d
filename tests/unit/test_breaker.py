"""The circuit breaker's state machine."""

from __future__ import annotations

from gateway.serving.breaker import CircuitBreaker, CircuitState


def state_of(breaker: CircuitBreaker) -> CircuitState:
    """The state now (a call, so a check after a transition is not narrowed away)."""
    return breaker.state


def test_probe_failure_opens_and_refuses() -> None:
    breaker = CircuitBreaker()
    assert breaker.allow()
    breaker.on_probe(ready=False)
    assert state_of(breaker) is CircuitState.OPEN
    assert not breaker.allow()


def test_recovery_goes_through_one_trial() -> None:
    breaker = CircuitBreaker()
    breaker.on_probe(ready=False)
    breaker.on_probe(ready=True)
    assert state_of(breaker) is CircuitState.HALF_OPEN
    assert breaker.allow()  # the trial
    assert not breaker.allow()  # everyone else waits for it
    breaker.on_success()
    assert state_of(breaker) is CircuitState.CLOSED
    assert breaker.allow()


def test_failed_trial_reopens_and_wakes_the_probe() -> None:
    breaker = CircuitBreaker()
    breaker.on_probe(ready=False)
    breaker.on_probe(ready=True)
    assert breaker.allow()
    breaker.on_unreachable()
    assert state_of(breaker) is CircuitState.OPEN
    assert breaker.wake.is_set()


def test_unavailable_call_alone_does_not_open() -> None:
    # Triton says UNAVAILABLE for a full queue too: only the probe decides.
    breaker = CircuitBreaker()
    breaker.on_unreachable()
    assert state_of(breaker) is CircuitState.CLOSED
    assert breaker.wake.is_set()
    breaker.on_probe(ready=True)
    assert state_of(breaker) is CircuitState.CLOSED


def test_on_change_hears_transitions_only() -> None:
    heard: list[CircuitState] = []
    breaker = CircuitBreaker(on_change=heard.append)
    for _ in range(3):
        breaker.on_success()  # the request path: no transition, nothing exported
    breaker.on_probe(ready=False)
    breaker.on_probe(ready=False)
    breaker.on_probe(ready=True)
    assert breaker.allow()
    breaker.on_success()
    assert heard == [CircuitState.CLOSED, CircuitState.OPEN, CircuitState.HALF_OPEN, CircuitState.CLOSED]


def test_with_no_traffic_the_next_live_probe_closes_it() -> None:
    """At rest there is no trial request: half-open must not last until traffic comes."""
    breaker = CircuitBreaker()
    breaker.on_probe(ready=False)
    breaker.on_probe(ready=True)
    assert state_of(breaker) is CircuitState.HALF_OPEN
    breaker.on_probe(ready=True)
    assert state_of(breaker) is CircuitState.CLOSED


def test_a_trial_in_flight_is_not_overtaken_by_the_probe() -> None:
    breaker = CircuitBreaker()
    breaker.on_probe(ready=False)
    breaker.on_probe(ready=True)
    assert breaker.allow()  # the trial goes
    breaker.on_probe(ready=True)
    assert state_of(breaker) is CircuitState.HALF_OPEN  # its outcome decides
    breaker.on_unreachable()
    assert state_of(breaker) is CircuitState.OPEN
