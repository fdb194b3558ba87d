"""Dispatch gated on Triton's own queue, per model.

The gateway sends a model's requests while Triton's measured queue for it is under a
target, and holds the rest in its own queue (gateway.serving.admission), where they are
ordered fairly and by priority and refused with a ``Retry-After`` when they would wait too
long. Triton measures the queue itself, per model, in its statistics (the OIP statistics
extension): cumulative queue time and compute time over the requests it completed.
Differenced over a window, these are far steadier than end-to-end latency.

- **The signal.** For each window (``interval_seconds``, and at least ``min_samples``
  requests completed by the model's slowest step), the time a request waited in Triton's
  queues (summed over an ensemble's steps: the ensemble's own queue is always empty) over
  the time one batch of the slowest step took to compute (its compute time per request:
  every request of a batch is charged the whole batch). A ratio of 1: a request waited
  about one batch.
- **The target.** ``target`` batches (1 by default): every batch finds the next one
  waiting, and no request waits behind more than that.
- **The limit.** Each model has its own limit on the requests the gateway has in Triton
  for it. A window over ``target`` x (1 + ``tolerance``) multiplies it by target/ratio (at
  most halving), then leaves it for one pass through Triton (the window after it still
  measures requests sent before); a window under the target in which the limit bound
  (a request of the model waited for it) raises it by its square root. Bounded by
  ``[floor, ceiling]`` (``server.max_in_flight``, which also bounds every model together).
- **Until measured** a model's limit is the ceiling, as a static cap would be: a cold
  replica sheds no burst it can serve; the first windows of a flood bring it down.

Statistics are read for every model at once (one call per interval) and only while the
gateway has sent something since the last read: an idle gateway asks Triton nothing.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from time import monotonic
from typing import Any, Protocol

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Totals:
    """A model's cumulative statistics (every version summed): requests completed, their
    time queued and computing (input, inference, output), and the batches run."""

    count: int = 0
    queue_ns: int = 0
    compute_ns: int = 0
    executions: int = 0

    def __sub__(self, other: Totals) -> Totals:
        return Totals(
            self.count - other.count,
            self.queue_ns - other.queue_ns,
            self.compute_ns - other.compute_ns,
            self.executions - other.executions,
        )


def _number(value: Any) -> int:
    """A statistics field: protobuf's JSON writes 64-bit integers as strings."""
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def totals_of(document: Mapping[str, Any]) -> dict[str, Totals]:
    """Every model's totals from a statistics document (Triton's HTTP JSON form)."""
    found: dict[str, Totals] = {}
    for model in document.get("model_stats") or ():
        stats = model.get("inference_stats") or {}

        def ns(part: str, stats: Mapping[str, Any] = stats) -> int:
            return _number((stats.get(part) or {}).get("ns"))

        one = Totals(
            _number((stats.get("success") or {}).get("count")),
            ns("queue"),
            ns("compute_input") + ns("compute_infer") + ns("compute_output"),
            _number(model.get("execution_count")),
        )
        name = str(model.get("name", ""))
        before = found.get(name, Totals())
        found[name] = Totals(
            before.count + one.count,
            before.queue_ns + one.queue_ns,
            before.compute_ns + one.compute_ns,
            before.executions + one.executions,
        )
    return found


@dataclass(frozen=True)
class GateSettings:
    """The gate's knobs (the gateway's come from ``server.gate``)."""

    target: float = 1.0
    tolerance: float = 0.25
    floor: int = 1
    ceiling: int = 64
    interval_seconds: float = 0.25
    min_samples: int = 8


@dataclass(frozen=True)
class Window:
    """What one window measured of a model: requests completed (by its slowest step), the
    mean wait in Triton's queues and the slowest step's batch time, in seconds."""

    count: int
    queued: float
    batch: float

    @property
    def ratio(self) -> float:
        """Batches waited: the queue wait over one batch's compute time."""
        return self.queued / self.batch if self.batch > 0 else 0.0


def window_of(steps: Mapping[str, Totals]) -> Window | None:
    """The window the differences ``steps`` (one per step) make, or None if no step of
    it completed a request."""
    measured = [d for d in steps.values() if d.count > 0]
    if not measured:
        return None
    queued = sum(d.queue_ns / d.count for d in measured) / 1e9
    slowest = max(measured, key=lambda d: d.compute_ns / d.count)
    return Window(slowest.count, queued, slowest.compute_ns / slowest.count / 1e9)


@dataclass
class ModelGate:
    """One model's limit on the requests the gateway has in Triton for it."""

    settings: GateSettings
    limit: float = 0.0
    bound: bool = False  # a request of the model waited for the limit this window
    last: Window | None = None
    hold_until: float = 0.0
    _base: dict[str, Totals] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.limit:
            self.limit = float(self.settings.ceiling)

    @property
    def allowed(self) -> int:
        return max(self.settings.floor, int(self.limit))

    def judge(self, steps: Mapping[str, Totals], now: float) -> bool:
        """A new read of the model's steps' totals; whether the limit moved. A window
        that has not completed ``min_samples`` requests waits for the next read."""
        if not self._base or set(self._base) != set(steps):
            self._base = dict(steps)
            return False
        diffs = {name: steps[name] - self._base[name] for name in steps}
        if any(d.count < 0 for d in diffs.values()):  # Triton restarted: counting anew
            self._base = dict(steps)
            return False
        window = window_of(diffs)
        if window is None or window.count < self.settings.min_samples:
            return False
        self._base = dict(steps)
        self.last = window
        bound, self.bound = self.bound, False
        if now < self.hold_until:
            return False
        settings, before = self.settings, self.allowed
        ratio = window.ratio
        if ratio > settings.target * (1 + settings.tolerance):
            self.limit = max(float(settings.floor), self.limit * max(0.5, settings.target / ratio))
            # the next window still measures requests sent under the old limit
            self.hold_until = now + window.queued + window.batch
        elif bound and ratio <= settings.target:
            self.limit = min(float(settings.ceiling), self.limit + max(1.0, math.sqrt(self.limit)))
        return self.allowed != before


class StatisticsSource(Protocol):
    async def statistics(self, model: str, version: str) -> dict[str, Any]: ...


class QueueGate:
    """Every model's gate, fed by one statistics read per interval (see the module)."""

    def __init__(self, settings: GateSettings, clock: Callable[[], float] = monotonic) -> None:
        self.settings = settings
        self.clock = clock
        self.gates: dict[str, ModelGate] = {}
        self.sent = False  # something was sent since the last read
        self.on_change: Callable[[], None] = lambda: None  # the admission grants anew

    @property
    def ceiling(self) -> int:
        return self.settings.ceiling

    def limit(self, model: str) -> int:
        gate = self.gates.get(model)
        return self.settings.ceiling if gate is None else gate.allowed

    def note_sent(self, model: str) -> None:
        self.sent = True
        if model not in self.gates:
            self.gates[model] = ModelGate(self.settings)

    def note_bound(self, model: str) -> None:
        gate = self.gates.get(model)
        if gate is not None:
            gate.bound = True

    async def read(self, source: StatisticsSource, steps_of: Callable[[str], Iterable[str]]) -> None:
        """One read of Triton's statistics, each gated model judged on its steps."""
        if not self.sent or not self.gates:
            return
        self.sent = False
        totals = totals_of(await source.statistics("", ""))
        now = self.clock()
        moved = False
        for model, gate in self.gates.items():
            steps = {step: totals[step] for step in steps_of(model) if step in totals}
            if steps and gate.judge(steps, now):
                moved = True
                logger.debug(
                    "gate of %s: %d (%.2f batches queued)", model, gate.allowed, gate.last and gate.last.ratio
                )
        if moved:
            self.on_change()
