"""The in-flight limit at the knee: the fewest requests in flight that keep Triton's
delivery rate near its most.

On a batching server, the rate at which answers come back rises with the requests in
flight until the batches are full; past that point only the latency rises (Little's law:
in flight = rate x latency). A limit anchored to one request's latency sits below that
point and gives away throughput; a static cap sits far above it and queues seconds. This
controller measures the delivery rate itself, at a ladder of limits, and keeps the
smallest one whose rate is within ``tolerance`` of the best measured, the way TCP BBR
keeps a path's delivery rate at its most with the least in flight:

- **Delivery rate.** Answers a second. (Counting each answer as its cost class's least
  latency, so a mix of models would not read as a change of speed, was tried and backed
  out: the least latency seen keeps falling as a jittery server shows new minima, so rates
  measured a few seconds apart were in different units and the ceiling always looked
  best.)
- **Windows.** Only windows in which the limit bound (the gateway had more to admit) say
  anything about it. A window starts once the requests admitted under the previous limit
  have cleared (the first completion admitted under the current one), ends at a whole
  instant (a batch's answers come together), and lasts at least ``window_seconds`` and
  ``window_samples`` completions, and four times the limit (a window spans several of
  Triton's batches, whose answers come in bursts) unless ``LONGEST_WINDOW`` has passed.
- **The ladder.** Limits from the floor to the ceiling, each about ``step`` times the one
  below (1, 2, 3, 4, 6, 8, 11, 16, 23, 32, 45, 64). Each rung keeps an average of the
  rates measured there (the last ``memory_seconds``); the noise of one window (a shared
  machine, a batcher's rhythm) is averaged over visits, not acted on.
- **The climb.** A cycle measures the current rung (cruise), then one rung up: taken when
  its rate beats the current one's by more than ``gain`` of the step (below the knee,
  more in flight is more delivered: up to the whole step; a window's noise is not).
  Otherwise one rung down: taken when its rate is within ``tolerance`` (7.5 %) of the
  best fresh rung's (past the knee, fewer in flight lose nothing but queueing; judged
  against the best, not the current rung, so the flat past the knee, where windows
  differ by their noise alone, is run down to its start, and a run down never compounds
  below the tolerance). A probe that does not pay spaces the next ones out (up to
  ``MAX_REST`` cruise windows), so sitting at the knee costs little.
- **Runs down.** A step down that paid is followed at once by the next, without a
  cruise window between: a cold start at the ceiling reaches a knee four rungs down in
  four windows. Steps up are one at a time (a lucky window must not run to the ceiling).
- **Cold start.** The limit starts at the ceiling, as a static cap would (a cold replica
  behind a load balancer must not shed a burst it can serve), and runs down from there
  the first time it binds.
- **A latency objective.** An operator who prefers latency sets ``objective_seconds``:
  a window whose p90 latency exceeds it takes the limit a rung down, and no rung up is
  tried above it. Without one, the knee.
- **A light key beside a flood.** The knee is where throughput is kept, and latency is
  what it pays: on a server whose batches cost more the larger they are (a CPU), the
  knee's latency is several times one request's. A key that sends a few requests a
  second has no throughput to gain from it, only the queue inside Triton to wait in.
  While such a key's requests are completing (``protected``: the admission's judgement,
  a key below its share that nothing was refused to or queued lately), the limit keeps
  the window's p90 within ``1 + protect_tolerance`` of what a request costs alone (each
  class's median of the last ``QUIET_SAMPLES`` requests that ran alone; the least
  latency seen, for a class without them), as the baseline anchor does, and returns to
  the rung it left ``protect_seconds`` after the last one.

The limit is bounded by ``[floor, ceiling]`` (``server.max_in_flight``); the excess waits
in the gateway's short queue, then gets a fast 503.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from enum import Enum
from time import monotonic

from gateway.serving.limit import LimitState, percentile

# the smallest latency a sample may claim (a clock that did not move is not a latency)
_TINY = 1e-5
# cruise windows between probes at the knee, at most (doubling from 1 while none pays)
MAX_REST = 8
# of a window's completions, at least this share admitted while the limit bound
SATURATED_SHARE = 0.75
# a window lasts at most this long once it has window_samples completions (a slow model
# at a high limit would otherwise take seconds a window)
LONGEST_WINDOW = 0.25
# a rung's average: the weight of its newest window
NEWEST = 0.5
# requests that ran alone, kept a cost class: the median is what one costs with nothing queued
QUIET_SAMPLES = 20


@dataclass
class KneeSettings:
    """The controller's knobs (the gateway's come from ``AdaptiveSettings``)."""

    floor: int = 1
    ceiling: int = 64
    step: float = 2**0.5
    tolerance: float = 0.075
    gain: float = 0.25
    window_seconds: float = 0.1
    window_samples: int = 40
    memory_seconds: float = 10.0
    objective_seconds: float | None = None
    # a light key's requests completing: the p90 kept within 1 + this of a request alone
    protect_tolerance: float = 1.0
    protect_seconds: float = 2.0


def ladder(floor: int, ceiling: int, step: float) -> list[int]:
    """The limits tried: the floor times the powers of ``step`` (rounded: with the
    default, every power of two is a rung, as batch sizes often are), then the ceiling."""
    rungs = [floor]
    power = 1
    while rungs[-1] < ceiling:
        rung = min(ceiling, round(floor * step**power))
        power += 1
        if rung > rungs[-1]:
            rungs.append(rung)
    return rungs


class _Phase(Enum):
    CRUISE = 0
    UP = 1
    DOWN = -1


@dataclass
class _Least:
    """A cost class's least latency in the last ``memory`` seconds (two halves: the
    older is dropped when the newer is half a memory old)."""

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
class _Rung:
    rate: float = 0.0
    at: float = float("-inf")  # when last measured

    def add(self, rate: float, now: float, memory: float) -> None:
        fresh = now - self.at < memory
        self.rate = NEWEST * rate + (1 - NEWEST) * self.rate if fresh else rate
        self.at = now


@dataclass
class KneeLimit:
    """The limit; fed a latency per completed request (``observe``); read through ``limit``."""

    settings: KneeSettings
    clock: Callable[[], float] = monotonic
    _rungs: list[int] = field(init=False)
    _rates: list[_Rung] = field(init=False)
    _at: int = field(init=False)  # the current rung
    _least: dict[Hashable, _Least] = field(init=False, default_factory=dict)
    _lowest: dict[Hashable, float] = field(init=False, default_factory=dict)  # ever seen
    _alone: dict[Hashable, deque[float]] = field(init=False, default_factory=dict)
    _alone_median: dict[Hashable, float] = field(init=False, default_factory=dict)
    _protect_until: float = field(init=False, default=float("-inf"))
    _knee: int | None = field(init=False, default=None)  # the rung held before protecting
    _ratios: list[float] = field(init=False, default_factory=list)
    _phase: _Phase = field(init=False, default=_Phase.CRUISE)
    _phase_started: float = field(init=False)
    _window_started: float | None = field(init=False, default=None)
    _work: float = field(init=False, default=0.0)
    _latencies: list[float] = field(init=False, default_factory=list)
    _saturated: int = field(init=False, default=0)
    _last_at: float = field(init=False, default=0.0)
    _full: bool = field(init=False, default=False)
    _rest: int = field(init=False, default=0)
    _rest_after: int = field(init=False, default=0)
    sample_ratio: float = field(init=False, default=0.0)

    def __post_init__(self) -> None:
        s = self.settings
        if not 1 <= s.floor <= s.ceiling:
            raise ValueError("the floor must be between 1 and the ceiling")
        if s.step <= 1:
            raise ValueError("the step must be above 1")
        self._rungs = ladder(s.floor, s.ceiling, s.step)
        self._rates = [_Rung() for _ in self._rungs]
        self._at = len(self._rungs) - 1
        self._phase_started = self.clock()

    @property
    def limit(self) -> int:
        """Requests that may be in flight now (a rung up or down while one is tried)."""
        return self._rungs[self._at + self._phase.value]

    @property
    def probing(self) -> bool:
        """Whether a rung beside the current one is being tried."""
        return self._phase is not _Phase.CRUISE

    @property
    def ceiling(self) -> int:
        return self.settings.ceiling

    def state(self) -> LimitState:
        return LimitState(
            self.limit, self.probing, self.sample_ratio, {c: self.alone(c) for c in self._least}
        )

    def observe(
        self,
        cost: Hashable,
        seconds: float,
        admitted_at: float,
        in_flight: int = 0,
        saturated: bool | None = None,
        protected: bool = False,
    ) -> None:
        """One completed request of cost class ``cost`` took ``seconds`` in flight, from
        ``admitted_at`` (this clock), with ``in_flight`` others in flight beside it (at its
        admission and since); ``saturated``: whether the limit bound when it was admitted
        (None: whether it took the last slot); ``protected``: a light key's, whose latency
        the limit keeps near a request's alone while such requests come."""
        now = self.clock()
        seconds = max(seconds, _TINY)
        s = self.settings
        least = self._least.get(cost)
        if least is None:
            least = self._least[cost] = _Least(seconds, seconds, now)
        else:
            least.add(seconds, now, s.memory_seconds)
        self._lowest[cost] = min(seconds, self._lowest.get(cost, seconds))
        if in_flight == 0:
            alone = self._alone.get(cost)
            if alone is None:
                alone = self._alone[cost] = deque(maxlen=QUIET_SAMPLES)
            alone.append(seconds)
            self._alone_median[cost] = statistics.median(alone)  # (once a quiet sample, not a request)
        if protected:
            self._protect_until = now + s.protect_seconds
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
        self._work += 1.0
        self._latencies.append(seconds)
        self._ratios.append(seconds / self.alone(cost))
        self._saturated += bound
        self._last_at = now
        samples, elapsed = len(self._latencies), now - self._window_started
        self._full = samples >= s.window_samples and (
            (samples >= 4 * self.limit and elapsed >= s.window_seconds) or elapsed >= LONGEST_WINDOW
        )

    def alone(self, cost: Hashable) -> float:
        """What a request of ``cost`` costs with nothing queued: the median of the last
        requests that ran alone, else the least latency seen (a lucky one: strict)."""
        median = self._alone_median.get(cost)
        return median if median is not None else self._lowest.get(cost, _TINY)

    @property
    def protecting(self) -> bool:
        """Whether a light key's requests came lately (the latency bound applies)."""
        return self.clock() < self._protect_until

    def _best(self, now: float) -> float:
        memory = self.settings.memory_seconds
        return max((rung.rate for rung in self._rates if now - rung.at < memory), default=0.0)

    def _end_window(self, now: float) -> None:
        assert self._window_started is not None
        s = self.settings
        rate = self._work / max(now - self._window_started, _TINY)  # the work delivered a second
        p90 = percentile(self._latencies, 0.9)
        protecting = now < self._protect_until
        ratio = percentile(self._ratios, 0.9)  # over a request's latency alone, each its class's
        self.sample_ratio = ratio
        if self._saturated < SATURATED_SHARE * len(self._latencies):
            # the limit did not bind: nothing learnt about it; keep it, start over
            self._enter(_Phase.CRUISE, now)
            return
        phase, at = self._phase, self._at
        tried = at + phase.value
        self._rates[tried].add(rate, now, s.memory_seconds)
        over_objective = s.objective_seconds is not None and p90 > s.objective_seconds
        if protecting and self._knee is None:
            self._knee = at
        elif not protecting and self._knee is not None:
            # the light key gone: back to the knee it left (climbing back a probe at a
            # time would stop short: below the knee, a rung gains less than a step)
            knee, self._knee = self._knee, None
            if knee > at:
                self._move(knee, now)
                return
        if protecting and ratio > 1 + s.protect_tolerance and tried > 0:
            # a light key waits behind the queue: as far down as the ratio says, in one
            # step (each step waits for the requests admitted before it to clear: four
            # halvings from the ceiling took seconds of the light key's), at least a rung
            target = self._rungs[tried] * (1 + s.protect_tolerance) / ratio
            below = max((i for i, r in enumerate(self._rungs) if r <= target), default=0)
            self._move(min(tried - 1, below), now)
            return
        if phase is _Phase.CRUISE:
            if over_objective and at > 0:
                self._move(at - 1, now)
            elif self._rest:  # at the knee a while: probes further apart
                self._rest -= 1
                self._enter(_Phase.CRUISE, now)
            else:
                up_allowed = (s.objective_seconds is None or p90 * s.step <= s.objective_seconds) and not (
                    protecting and ratio * s.step > 1 + s.protect_tolerance
                )
                if up_allowed and at + 1 < len(self._rungs):
                    self._enter(_Phase.UP, now)
                elif at > 0:
                    self._enter(_Phase.DOWN, now)
                else:
                    self._stay(now)
            return
        current = self._rates[at].rate
        if phase is _Phase.UP:
            rise = self._rungs[tried] / self._rungs[at] - 1
            if self._rates[tried].rate > current * (1 + s.gain * rise) and not over_objective:
                self._move(tried, now)
            elif at > 0:
                self._enter(_Phase.DOWN, now)
            else:
                self._stay(now)
            return
        # DOWN: kept when it delivers within the tolerance of the best fresh rung (not of
        # the current one: in the flat past the knee, a window's noise would otherwise
        # stop the run down at a rung that only queues)
        down = self._rates[tried].rate
        if down >= (1 - s.tolerance) * self._best(now) or over_objective:
            self._move(tried, now, _Phase.DOWN)
        else:
            self._stay(now)

    def _move(self, rung: int, now: float, onwards: _Phase = _Phase.CRUISE) -> None:
        # a step down that paid is followed by the next at once (a cold start at the
        # ceiling reaches the knee in a window a rung); its rate is the new rung's
        self._at = rung
        self._rest = self._rest_after = 0
        if not 0 <= rung + onwards.value < len(self._rungs):
            onwards = _Phase.CRUISE
        self._enter(onwards, now)

    def _stay(self, now: float) -> None:
        # neither rung paid: at the knee; the next probes come further apart
        self._rest = self._rest_after = min(MAX_REST, max(1, 2 * self._rest_after))
        self._enter(_Phase.CRUISE, now)

    def _enter(self, phase: _Phase, now: float) -> None:
        self._phase = phase
        self._phase_started = now
        self._window_started = None
        self._work = 0.0
        self._latencies = []
        self._ratios = []
        self._saturated = 0
        self._full = False
