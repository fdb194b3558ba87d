"""A circuit breaker for Triton: fail fast while it is known to be down, recover by itself.

States (exported as ``gateway_triton_circuit_state``)::

    closed ──probe fails──▶ open ──probe succeeds──▶ half_open ──trial succeeds──▶ closed
      ▲                      ▲                          │  └──or, with no trial, the next probe succeeds──▶ closed
      └──────────────────────┴────trial fails───────────┘

A background probe (Triton's liveness, every ``probe_interval``) feeds it, and so do
calls: a call failing as *unavailable* or *timed out* wakes the probe at once rather than
opening the circuit by itself, because Triton also answers UNAVAILABLE for a full queue
(a healthy server under load must not trip it). While open, requests fail at once with
503; when the probe sees Triton live again, one trial request goes through, and its
success closes the circuit. With no traffic there is no trial: the next successful probe
closes it then (two live probes in a row), so the state is true at rest too. This module holds only the state machine (no I/O); whoever
exports the state passes ``on_change``, called on transitions only (not per request).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from enum import StrEnum


class CircuitState(StrEnum):
    """Where the breaker stands."""

    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class CircuitBreaker:
    """The state machine; ``wake`` is set whenever the probe should run now."""

    def __init__(self, on_change: Callable[[CircuitState], None] = lambda state: None) -> None:
        self._state = CircuitState.CLOSED
        self._on_change = on_change
        self._trial_in_flight = False
        self.wake = asyncio.Event()
        on_change(self._state)

    @property
    def state(self) -> CircuitState:
        return self._state

    @state.setter
    def state(self, state: CircuitState) -> None:
        if state is not self._state:
            self._state = state
            self._on_change(state)

    def allow(self) -> bool:
        """May a request go to Triton now? In half-open, only the one trial may."""
        if self.state is CircuitState.CLOSED:
            return True
        if self.state is CircuitState.HALF_OPEN and not self._trial_in_flight:
            self._trial_in_flight = True
            return True
        return False

    def on_probe(self, ready: bool) -> None:
        if not ready:
            self.state = CircuitState.OPEN
            self._trial_in_flight = False
        elif self.state is CircuitState.OPEN:
            self.state = CircuitState.HALF_OPEN
        elif self.state is CircuitState.HALF_OPEN and not self._trial_in_flight:
            # live twice in a row and no request to try it with: at rest, the probe is the trial
            self.state = CircuitState.CLOSED

    def on_success(self) -> None:
        self._trial_in_flight = False
        self.state = CircuitState.CLOSED

    def on_unreachable(self) -> None:
        """A call failed as unavailable or timed out: a failed trial reopens; else probe now."""
        if self.state is CircuitState.HALF_OPEN:
            self.state = CircuitState.OPEN
            self._trial_in_flight = False
        self.wake.set()

    def on_other_outcome(self) -> None:
        """A call ended in a way that says nothing about Triton's health (e.g. bad input)."""
        if self.state is CircuitState.HALF_OPEN:
            self._trial_in_flight = False
            self.state = CircuitState.CLOSED
