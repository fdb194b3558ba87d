"""The in-flight limit at the knee: the fewest requests in flight that keep Triton's
delivery rate at its most.

On a batching server, the rate at which answers come back rises with the requests in
flight until the batches are full; past that point only the latency rises (Little's law:
in flight = rate x latency). A limit anchored to one request's latency sits below that
point and gives away throughput; a static cap sits far above it and queues seconds. This
controller measures the delivery rate itself and climbs to where it stops rising, the way
TCP BBR finds a path's bottleneck from its delivery rate and least delay together:

- **Delivered work.** Each completion counts as its cost class's least latency seen in the
  last ``memory_seconds`` (a model and a bucket of inputs: an 8-image request to a ResNet
  counts as what it costs, not as one), so the rate is in "requests' worth of Triton
  time a second": the in-flight count the server sustains at its least latency. A mix
  of models does not read as a change of speed.
- **Windows.** Only windows in which the limit bound (the gateway had more to admit) say
  anything about it. A window starts once the requests admitted under the previous limit
  have cleared (the first completion admitted under the current one), and lasts at least
  ``window_seconds`` and ``window_samples`` completions (and as many as the limit).
- **The climb.** A cycle measures the current limit (cruise), then one step up
  (``step`` times more): kept when the rate rose by at least ``gain`` of the step's
  rise (below the knee, more in flight is more delivered). Otherwise one step down:
  kept when the rate fell by less than ``gain`` of the step's fall (past the knee,
  fewer in flight lose nothing but queueing). At the knee the limit stays; a slower
  or faster Triton moves the knee and the next cycles follow it.
- **Draining a cold start.** The limit starts at the ceiling, as a static cap (a cold
  replica behind a load balancer must not shed a burst it can serve). The first time it
  binds, when that limit exceeds four times the delivered work (BBR's drain: requests
  queued in Triton), it drops to twice the delivered work at once instead of stepping
  down: within a window of a flood, not a dozen. Only then: later, a rate below the
  limit may as well be a slower Triton (the least latencies remembered are the fast
  ones), which the climb follows a step at a time.
- **A latency objective.** An operator who prefers latency sets ``objective_seconds``:
  a window whose p90 latency exceeds it takes the limit a step down, and no step up is
  tried above it. Without one, the knee.

The limit is bounded by ``[floor, ceiling]`` (``server.max_in_flight``); the excess waits
in the gateway's short queue, then gets a fast 503.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from enum import Enum
from time import monotonic

from gateway.serving.limit import LimitState, percentile

# the smallest latency a sample may claim (a clock that did not move is not a latency)
_TINY = 1e-5
# a cruise window with more in flight than DRAIN_OVER times its delivered work is
# queueing inside Triton: drain to DRAIN_GAIN times the delivered work at once
DRAIN_OVER = 4.0
DRAIN_GAIN = 2.0
# cruise windows between probes at the knee, at most (doubling from 1 while none pays)
MAX_REST = 8
# of a window's completions, at least this share admitted while the limit bound
SATURATED_SHARE = 0.75


@dataclass
class KneeSettings:
    """The controller's knobs (the gateway's come from ``AdaptiveSettings``)."""

    floor: int = 1
    ceiling: int = 64
    step: float = 1.25
    gain: float = 0.25
    window_seconds: float = 0.1
    window_samples: int = 20
    memory_seconds: float = 30.0
    objective_seconds: float | None = None


class _Phase(Enum):
    CRUISE = "cruise"
    UP = "up"
    DOWN = "down"


@dataclass
class _Least:
    """A cost class's least latency in the last ``memory`` seconds (two halves: the
    older is dropped when the newer is a memory old)."""

    current: float
    older: float
    since: float

    def add(self, seconds: float, now: float, memory: float) -> None:
        if now - self.since >= memory / 2:
            self.older, self.current, self.since = self.current, seconds, now
        else:
            self.current = min(self.current, seconds)

    @property
    def least(self) -> float:
        return min(self.current, self.older)


@dataclass
class KneeLimit:
    """The limit; fed a latency per completed request (``observe``); read through ``limit``."""

    settings: KneeSettings
    clock: Callable[[], float] = monotonic
    _limit: float = field(init=False)
    _least: dict[Hashable, _Least] = field(init=False, default_factory=dict)
    _phase: _Phase = field(init=False, default=_Phase.CRUISE)
    _phase_started: float = field(init=False)
    _window_started: float | None = field(init=False, default=None)
    _work: float = field(init=False, default=0.0)
    _latencies: list[float] = field(init=False, default_factory=list)
    _saturated: int = field(init=False, default=0)
    _cruise_rate: float = field(init=False, default=0.0)
    _last_at: float = field(init=False, default=0.0)
    _rest: int = field(init=False, default=0)
    _measured: bool = field(init=False, default=False)  # a cruise window has measured a limit
    _rest_after: int = field(init=False, default=0)
    _full: bool = field(init=False, default=False)
    sample_ratio: float = field(init=False, default=0.0)

    def __post_init__(self) -> None:
        s = self.settings
        if not 1 <= s.floor <= s.ceiling:
            raise ValueError("the floor must be between 1 and the ceiling")
        if s.step <= 1:
            raise ValueError("the step must be above 1")
        self._limit = float(s.ceiling)
        self._phase_started = self.clock()

    @property
    def limit(self) -> int:
        """Requests that may be in flight now (one step up or down while one is tried)."""
        value = self._limit
        if self._phase is _Phase.UP:
            value = max(value + 1, value * self.settings.step)
        elif self._phase is _Phase.DOWN:
            value = min(value - 1, value / self.settings.step)
        return max(self.settings.floor, min(self.settings.ceiling, round(value)))

    @property
    def probing(self) -> bool:
        """Whether a step away from the limit is being tried."""
        return self._phase is not _Phase.CRUISE

    @property
    def ceiling(self) -> int:
        return self.settings.ceiling

    def state(self) -> LimitState:
        return LimitState(
            self.limit, self.probing, self.sample_ratio, {c: l.least for c, l in self._least.items()}
        )

    def observe(
        self,
        cost: Hashable,
        seconds: float,
        admitted_at: float,
        in_flight: int = 0,
        saturated: bool | None = None,
    ) -> None:
        """One completed request of cost class ``cost`` took ``seconds`` in flight, from
        ``admitted_at`` (this clock), admitted with ``in_flight`` others in flight;
        ``saturated``: whether the limit bound when it was admitted (None: whether it
        took the last slot)."""
        now = self.clock()
        seconds = max(seconds, _TINY)
        s = self.settings
        least = self._least.get(cost)
        if least is None:
            least = self._least[cost] = _Least(seconds, seconds, now)
        else:
            least.add(seconds, now, s.memory_seconds)
        if self._window_started is None:
            # the requests admitted under the previous limit are still clearing
            if admitted_at >= self._phase_started:
                self._window_started = now
            return
        if now <= self._window_started:
            return  # the window's first instant (a batch's answers come together): not in it
        if self._full and now > self._last_at:
            # the window ends with the last instant it saw whole (never inside a batch)
            self._end_window(self._last_at)
            return
        bound = in_flight + 1 >= self.limit if saturated is None else saturated
        self._work += least.least
        self._latencies.append(seconds)
        self._saturated += bound
        self._last_at = now
        self._full = (
            len(self._latencies) >= max(s.window_samples, self.limit)
            and now - self._window_started >= s.window_seconds
        )

    def _end_window(self, now: float) -> None:
        assert self._window_started is not None
        s = self.settings
        elapsed = max(now - self._window_started, _TINY)
        rate = self._work / elapsed  # requests' worth of least latency a second: a parallelism
        p90 = percentile(self._latencies, 0.9)
        least = min(item.least for item in self._least.values())
        self.sample_ratio = p90 / least
        saturated = self._saturated >= SATURATED_SHARE * len(self._latencies)
        limit, phase = self._limit, self._phase
        over_objective = s.objective_seconds is not None and p90 > s.objective_seconds
        if not saturated:
            # the limit did not bind: nothing learnt about it; keep it, start over
            self._enter(_Phase.CRUISE, now)
            return
        if phase is _Phase.CRUISE:
            if over_objective:
                self._limit = max(float(s.floor), min(limit - 1, limit / s.step))
                self._enter(_Phase.CRUISE, now)
            elif limit > DRAIN_OVER * rate and not self._measured:
                # queued inside Triton: to twice what it delivers, at once
                self._limit = max(float(s.floor), DRAIN_GAIN * rate)
                self._enter(_Phase.CRUISE, now)
            elif self._rest:  # at the knee a while: probes further apart
                self._measured = True
                self._rest -= 1
                self._enter(_Phase.CRUISE, now)
            else:
                self._measured = True
                self._cruise_rate = rate
                up_allowed = s.objective_seconds is None or p90 * s.step <= s.objective_seconds
                if up_allowed and limit < s.ceiling:
                    self._enter(_Phase.UP, now)
                else:
                    self._enter(_Phase.DOWN if limit > s.floor else _Phase.CRUISE, now)
            return
        tried = self.limit
        if phase is _Phase.UP:
            if rate >= self._cruise_rate * (1 + s.gain * (tried / limit - 1)) and not over_objective:
                self._moved(tried, now)
            elif limit > s.floor:
                self._enter(_Phase.DOWN, now)
            else:
                self._stayed(now)
            return
        # DOWN
        if rate >= self._cruise_rate * (1 - s.gain * (1 - tried / limit)) or over_objective:
            self._moved(tried, now)
        else:
            self._stayed(now)

    def _moved(self, limit: int, now: float) -> None:
        self._limit = float(limit)
        self._rest = self._rest_after = 0
        self._enter(_Phase.CRUISE, now)

    def _stayed(self, now: float) -> None:
        # neither step paid: at the knee; the next probes come further apart (up to
        # MAX_REST cruise windows), so probing costs little latency and throughput
        self._rest = self._rest_after = min(MAX_REST, max(1, 2 * self._rest_after))
        self._enter(_Phase.CRUISE, now)

    def _enter(self, phase: _Phase, now: float) -> None:
        self._phase = phase
        self._phase_started = now
        self._window_started = None
        self._work = 0.0
        self._latencies = []
        self._saturated = 0
        self._full = False
