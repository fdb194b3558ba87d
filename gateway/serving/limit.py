"""The adaptive in-flight limit: how many inference requests Triton can take now.

AIMD anchored to a measured latency, in the manner of Envoy's adaptive concurrency filter:

- **Baseline.** A request admitted with nothing else in flight is a quiet sample; the p90
  of each cost class's last ``probe_samples`` quiet samples (the windows' statistic, so
  latency's own spread never reads as queueing) is the baseline: what a request costs
  Triton with almost nothing queued. When the limit binds and no quiet sample has come
  for ``probe_interval_seconds`` (jittered), or before the class has 5 quiet samples, the
  limit is held at its floor until ``probe_samples`` requests admitted during the probe
  have completed. A gateway below its limit never probes. A probe also starts at once when the
  limit has sat at its floor for ``floor_windows`` windows (Triton slowed down: the old
  baseline makes every latency look congested) and when a window's p90 is under three quarters of
  the baseline (Triton got faster). So the anchor follows Triton both ways in about a
  second, without anyone configuring a latency target.
- **Adjustment.** Each ``window_seconds`` (and at least ``window_samples`` requests), the
  p90 of the window's latencies, each divided by its class's baseline, is compared with
  ``1 + tolerance``. At or under it, nothing queues in Triton to speak of and the limit
  grows by its square root (additive, quick from a small limit, gentle near a large
  one); over it, requests queue inside Triton and the limit is multiplied by
  ``(1 + tolerance) / ratio``, at most halved. Bounded by ``[floor, ceiling]``
  (``max_in_flight``). The excess waits in the gateway's short queue, then gets a fast 503.
- **Light load** (with ``idle`` set; off by default). A window in which the limit never
  bound moves it toward twice the most requests in flight over the last 10 s, at least
  ``idle``: down by a fifth a window from a ceiling no load has tested (a cold replica
  starts there, so it sheds no burst it can serve), up by its square root (while nothing
  queues) from a floor an overload left. A flood after a quiet spell then starts from a
  few requests in Triton, not from 64 queued there.
- **Cost classes.** The gateway fronts many models: an 8-image request to a ResNet is not
  slow next to a text on a MiniLM, it is a different request. Each latency is compared
  with its own class's baseline (model and a bucket of the inputs it carries), so a mix
  of models never reads as congestion.

Why not a static cap: it is right for one model speed on one machine. Why not Gradient2
(Netflix): its long-term average follows the queueing it should detect, so latency creeps
up under steady overload; a measured baseline does not. Why not Envoy's gradient as is:
its multiplicative growth and sqrt headroom settle at about twice the parallelism Triton
has (every request queued behind another: p99 at 3x in our simulation, 2x here), and a
limit pinned at its floor waits up to a whole interval for the next baseline.
"""

from __future__ import annotations

import math
import random
import statistics
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from time import monotonic

# quiet samples a baseline needs before it judges a window (fewer: a cold first request,
# a lucky one; the limit binding without one measures one at once)
TRUSTED_SAMPLES = 5
# a window in which the limit did not bind moves an untested limit this much toward twice
# what was in flight (64 to 16 in 0.6 s)
DECAY = 0.8
# what was in flight is the most any window saw this long: a load that comes in waves (10
# clients, a pause, 10 more) keeps room for its waves
PEAK_MEMORY_SECONDS = 10.0
# a window whose p90 is under this share of the baseline (measured at the floor, so faster
# than anything at a higher concurrency should be): Triton got faster, probe again
FASTER = 0.75
# the smallest latency a sample may claim (a clock that did not move is not a latency)
_TINY = 1e-5


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0-1) of ``values`` by the nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


@dataclass
class LimitSettings:
    """The controller's knobs (the gateway's come from ``AdaptiveSettings``)."""

    floor: int = 1
    ceiling: int = 64
    initial: int | None = None  # None: the ceiling
    # a light load moves the limit to twice the most in flight lately, at least this (None:
    # it never moves while it does not bind)
    idle: int | None = None
    tolerance: float = 1.0
    window_seconds: float = 0.1
    window_samples: int = 10
    probe_interval_seconds: float = 30.0
    probe_samples: int = 20
    floor_windows: int = 5
    probe_timeout_seconds: float = 5.0


@dataclass
class LimitState:
    """What the gauges show."""

    limit: int
    probing: bool
    sample_ratio: float  # the last window's p90 latency over its baseline (0: none yet)
    baseline_seconds: dict[Hashable, float]


@dataclass
class AdaptiveLimit:
    """The limit; fed a latency per completed request (``observe``); read through ``limit``."""

    settings: LimitSettings
    clock: Callable[[], float] = monotonic
    rng: random.Random = field(default_factory=random.Random)
    _limit: float = field(init=False)
    _baseline: dict[Hashable, float] = field(init=False, default_factory=dict)
    _quiet: dict[Hashable, deque[float]] = field(init=False, default_factory=dict)
    _window: list[float] = field(init=False, default_factory=list)
    _window_started: float = field(init=False)
    _probing: bool = field(init=False, default=False)
    _probe_count: int = field(init=False, default=0)
    _probe_started: float = field(init=False, default=0.0)
    _fresh_until: float = field(init=False, default=0.0)
    _at_floor: int = field(init=False, default=0)
    _saturated: bool = field(init=False, default=False)  # the window reached the limit
    _peak: int = field(init=False, default=0)  # the most in flight the window saw
    _peaks: deque[tuple[float, int]] = field(init=False, default_factory=deque)  # (when, peak)
    _measured: bool = field(init=False, default=False)  # a window has moved the limit
    sample_ratio: float = field(init=False, default=0.0)

    def __post_init__(self) -> None:
        s = self.settings
        if not 1 <= s.floor <= s.ceiling:
            raise ValueError("the floor must be between 1 and the ceiling")
        self._limit = float(s.initial if s.initial is not None else s.ceiling)
        now = self.clock()
        self._window_started = now
        # Serving starts at the ceiling, as a static cap would (a cold replica behind a
        # load balancer must not shed a burst while it learns); with ``idle`` set a light
        # load then takes it down, and a baseline comes from quiet requests, or from a
        # probe the moment the limit binds without one.
        self._fresh_until = now

    @property
    def limit(self) -> int:
        """Requests that may be in flight now (the floor while probing)."""
        if self._probing:
            return self.settings.floor
        return max(self.settings.floor, min(self.settings.ceiling, int(self._limit)))

    @property
    def probing(self) -> bool:
        return self._probing

    @property
    def protecting(self) -> bool:
        """Never: this anchor keeps every request's latency near the baseline."""
        return False

    @property
    def ceiling(self) -> int:
        return self.settings.ceiling

    def state(self) -> LimitState:
        return LimitState(self.limit, self.probing, self.sample_ratio, dict(self._baseline))

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
        ``admitted_at`` (this clock), admitted with ``in_flight`` others in flight;
        ``saturated``: whether the limit bound when it was admitted (None: whether it
        took the last slot; the admission knows better: its reserve, its queue);
        ``protected`` (a light key's) changes nothing here: this anchor keeps every
        request's latency near the baseline already. One
        admitted with at most the floor in flight is a quiet sample: the baseline is the p90
        of each class's last ``probe_samples`` quiet samples, so a gateway that is not
        saturated keeps its baseline fresh without ever probing."""
        now = self.clock()
        seconds = max(seconds, _TINY)
        s = self.settings
        if in_flight < s.floor and (not self._probing or admitted_at >= self._probe_started):
            self._quiet_sample(cost, seconds, now)
        if self._probing:
            if now - self._probe_started > s.probe_timeout_seconds or self._probe_count >= s.probe_samples:
                self._end_probe(now)
            return
        bound = in_flight + 1 >= self.limit if saturated is None else saturated
        self._saturated = self._saturated or bound
        self._peak = max(self._peak, in_flight + 1)
        # with ``idle`` set, a window the limit never bound closes on time, whatever its
        # count (a light load may bring fewer than ``window_samples``)
        light_load = s.idle is not None and not self._saturated
        quiet = self._quiet.get(cost)
        if quiet is None or len(quiet) < TRUSTED_SAMPLES:
            # too few quiet samples of this class: they say nothing about queueing; if the
            # limit binds, it is time to measure them
            if bound and now >= self._fresh_until:
                self._start_probe(now)
            elif light_load and now - self._window_started >= s.window_seconds:
                self._update(now)  # a light load: the limit falls to what it needs
            return
        self._window.append(seconds / self._baseline[cost])
        if now - self._window_started >= s.window_seconds and (
            len(self._window) >= s.window_samples or light_load
        ):
            self._update(now)
        elif now >= self._fresh_until and self._saturated:
            self._start_probe(now)

    def _quiet_sample(self, cost: Hashable, seconds: float, now: float) -> None:
        samples = self._quiet.get(cost)
        if samples is None:
            samples = self._quiet[cost] = deque(maxlen=self.settings.probe_samples)
        samples.append(seconds)
        # the statistic the windows use (p90), so latency's own spread is not queueing
        ordered = list(samples)
        self._baseline[cost] = percentile(ordered, 0.9) if len(ordered) >= 5 else statistics.median(ordered)
        self._probe_count += 1
        if len(ordered) >= 5:
            self._fresh_until = now + self.settings.probe_interval_seconds * self.rng.uniform(0.85, 1.15)

    def _update(self, now: float) -> None:
        s = self.settings
        target = 1 + s.tolerance
        timed = bool(self._window)  # latencies judged against a baseline (none without one)
        ratio = percentile(self._window, 0.9) if timed else math.inf
        if timed:
            self.sample_ratio = ratio
        self._window = []
        self._window_started = now
        saturated, self._saturated = self._saturated, False
        peak = self._recent_peak(now, self._peak) if s.idle is not None else 0
        self._peak = 0
        if not saturated:
            # A light load (the limit never bound): the limit goes to twice the most in
            # flight over the last 10 s, at least ``idle``: down from a ceiling no load
            # has tested (a flood after a quiet spell would queue it all in Triton before
            # the first window), up (while nothing queues) from a floor a past overload left.
            light = float(s.ceiling if s.idle is None else min(s.ceiling, max(s.idle, 2 * peak)))
            # without ``idle`` a timed window measures the limit, bound or not (a probe
            # then returns to half of it); with it, only a bound one does (a limit a
            # light load took down is not a measured one)
            self._measured = self._measured or (timed and s.idle is None)
            if self._limit > light:
                moved = max(light, self._limit * DECAY)
            elif ratio <= target:
                moved = min(light, self._limit + math.sqrt(self._limit))
            else:  # slow (or not timed), the limit not reached: admitting fewer would not help
                moved = self._limit
        elif not timed:  # bound, but nothing to judge it by (a probe measures a baseline)
            moved = self._limit
        elif ratio <= target:  # no queueing to speak of: probe upwards
            self._measured = True
            moved = self._limit + math.sqrt(self._limit)
        else:  # queueing in Triton while the limit binds: back off, at most by half
            self._measured = True
            moved = self._limit * max(0.5, target / ratio)
        self._limit = max(float(s.floor), min(float(s.ceiling), moved))
        self._at_floor = self._at_floor + 1 if self._limit < s.floor + 1 else 0
        # while the limit binds, a limit stuck at the floor (Triton slowed down), requests
        # far faster than the baseline (it recovered) or no quiet sample for a while:
        # measure now (a gateway below its limit never probes: a probe would shed a burst
        # the limit has room for, and the baseline matters only once the limit binds)
        if saturated and (self._at_floor >= s.floor_windows or ratio < FASTER or now >= self._fresh_until):
            self._start_probe(now)

    def _recent_peak(self, now: float, peak: int) -> int:
        """The most in flight over the last ``PEAK_MEMORY_SECONDS``, this window's ``peak``
        included (kept as a falling staircase: a peak under a later one is never the max)."""
        peaks = self._peaks
        while peaks and (peaks[0][0] <= now - PEAK_MEMORY_SECONDS):
            peaks.popleft()
        while peaks and peaks[-1][1] <= peak:
            peaks.pop()
        peaks.append((now, peak))
        return peaks[0][1]

    def _start_probe(self, now: float) -> None:
        self._probing = True
        self._probe_count = 0
        self._probe_started = now
        self._at_floor = 0
        # a fresh baseline: the probe's samples replace the old ones
        for samples in self._quiet.values():
            samples.clear()

    def _end_probe(self, now: float) -> None:
        # Back from the floor: to half the limit it left (a measured one), or, when no
        # window has measured any yet (the starting ceiling, never tested), from the
        # floor up, growing by its square root a window (1 to 10 in 0.5 s): returning
        # to an untested ceiling would queue it all in Triton before the first window.
        s = self.settings
        self._limit = max(float(s.floor), self._limit / 2 if self._measured else float(s.floor))
        self._probing = False
        self._window = []
        self._window_started = now
        self._fresh_until = now + self.settings.probe_interval_seconds * self.rng.uniform(0.85, 1.15)
