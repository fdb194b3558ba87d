"""Dispatch gated on what Triton's own statistics say its batches cost, per model.

The gateway sends a model's requests while fewer than its limit are in Triton, and holds
the rest in its own queue (gateway.serving.admission), where they are ordered fairly and
by priority and refused with a ``Retry-After`` when they would wait too long. The limit is
not searched for with end-to-end latency, the noisiest signal there is: it is computed
from what Triton measures of every batch it runs (the statistics extension's per batch
size compute time).

- **What a batch costs.** For the model's bottleneck step (an ensemble's step with the
  most compute per request; the model itself otherwise), each batch size's compute time
  per request, as measured: no line through them. On this project's CPU text model (a
  2-core machine, 2026-11-29): a batch of 1 costs 27-31 ms a request, of 4 17.5, of 7
  16.3, and of 11 and more 24-28 (larger batches are dearer a request, not cheaper). A
  line ``a + c*b`` through those had its cost per batch ``a`` drift with the sizes seen
  (17.5 ms from a flood's batches of 1-7, -171 ms from its batches of 11-45), and with it
  the limit: 24 at speed where 10 is right.
- **The batch worth making.** The smallest size whose cost per request is within
  ``1 - efficiency`` of the cheapest measured (``efficiency`` 0.9 by default: the text
  model's 4; on a GPU, where a batch costs about the same whatever its size, the largest
  seen, so the limit opens as larger batches are seen). A larger batch only waits longer
  for no more throughput. While the batch worth making is the largest seen (no size
  measured past the cheapest), the limit makes room for twice it: a larger batch forms
  only where there is room for it, so a limit that never had room for one would never
  learn whether it pays (a light load's batches of 1 and 2, followed by a flood on a
  Triton whose larger batches pay more when it is slowed). The cheapest is taken among the sizes seen at least
  ``min_size_batches`` times (one lucky batch does not set it).
- **The limit.** ``b*`` running and ``target`` batches of it waiting (one by default: each
  batch finds the next one formed, and no request waits behind more than that), plus one
  request for every other step of an ensemble (each holds about one while the batch
  runs): ``ceil((1 + target) * b*) + steps - 1``, within ``[floor, ceiling]``
  (``server.max_in_flight``, which also bounds every model together; the gateway's floor
  is 8, so a few clients sending back to back are never refused for want of room in
  Triton whatever a light load's batches said). For the CPU text classifier: 10, where a
  sweep of static limits finds its knee (8-16).
- **Learning.** The statistics are read every ``interval_seconds`` while the gateway has
  sent something since the last read (an idle gateway asks Triton nothing), for every
  model in one call; each read's batches are added to an average that forgets with a
  half-life of ``memory_seconds``, so a model that got slower or faster (another GPU,
  Triton throttled) is followed within seconds. Triton's speed changing by the same
  factor for every batch (5x slower) moves every size's cost alike, and ``b*`` not at
  all. Batches whose cost is all proportional to their size (a light load's batches of 1
  and 2 often read so) give the cautious limit, ``b* = 1``: the next flood does not start
  from the ceiling, and its larger batches, once seen, open it.
- **Until measured** (``min_batches`` batches) a model's limit is the ceiling, as a
  static cap's would be: a cold replica sheds no burst it can serve, and a flood's first
  batches, of every size, measure it. A light load's batches all of one size measure it
  too: that size is the batch worth making until a larger one is seen (room for twice
  it). Before, one size counted as unmeasured, and a flood after a light load of 2
  clients for 1 s (55 batches, all of 2) went in at the ceiling: its p99 2.7x the steady
  one's.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from time import monotonic
from typing import Any, Protocol

from gateway.errors import GatewayError
from gateway.observe.metrics import GateReading

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BatchCost:
    """A batch size's executions and their compute time (input, inference, output) in ns."""

    count: float = 0.0
    ns: float = 0.0


Batches = dict[int, BatchCost]  # by batch size
MIN_SIZE_BATCHES = 2.0  # a size's batches before its cost may set the cheapest (one lucky batch does not)


def _number(value: Any) -> int:
    """A statistics field: protobuf's JSON writes 64-bit integers as strings."""
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def batches_of(document: Mapping[str, Any]) -> dict[str, Batches]:
    """Every model's batches from a statistics document (Triton's HTTP JSON form), its
    versions summed."""
    found: dict[str, Batches] = {}
    for model in document.get("model_stats") or ():
        batches = found.setdefault(str(model.get("name", "")), {})
        for stat in model.get("batch_stats") or ():
            size = _number(stat.get("batch_size"))
            infer = stat.get("compute_infer") or {}
            count = _number(infer.get("count"))
            if size < 1 or count < 1:
                continue
            ns = sum(
                _number((stat.get(part) or {}).get("ns"))
                for part in ("compute_input", "compute_infer", "compute_output")
            )
            before = batches.get(size, BatchCost())
            batches[size] = BatchCost(before.count + count, before.ns + ns)
    return found


def since(now: Batches, before: Batches) -> Batches:
    """The batches run between two reads (a counter that went back: Triton restarted, so
    everything read now is new)."""
    if any(now.get(size, BatchCost()).count < cost.count for size, cost in before.items()):
        return dict(now)
    return {
        size: BatchCost(
            cost.count - before.get(size, BatchCost()).count, cost.ns - before.get(size, BatchCost()).ns
        )
        for size, cost in now.items()
        if cost.count > before.get(size, BatchCost()).count
    }


@dataclass(frozen=True)
class Worth:
    """What a model's measured batches say: the batch worth making (``size``) and the
    cheapest cost per request seen, in seconds, over ``batches`` executions."""

    size: int
    cheapest: float
    batches: float
    largest: int = 0  # the largest size seen

    @property
    def trying(self) -> int:
        """The batch the limit makes room for: ``size``, or twice it while it is the
        largest seen (the cheapest so far: a larger one, never seen, may be cheaper still,
        and is seen only if there is room to form it)."""
        return 2 * self.size if self.size >= self.largest else self.size


def worth(batches: Batches, efficiency: float, min_size_batches: float = MIN_SIZE_BATCHES) -> Worth | None:
    """The smallest batch size whose cost per request is within ``1 - efficiency`` of
    the cheapest among the sizes seen ``min_size_batches`` times; None with none. One
    size alone (a light load's batches, all of 2) says nothing of what batching gains:
    it is the batch worth making and the largest seen, so the limit makes room for twice
    it, and the larger batches a flood forms there measure the rest."""
    seen = {size: cost for size, cost in batches.items() if cost.count > 0 and cost.ns > 0}
    if not seen:
        return None
    each = {size: cost.ns / cost.count / size / 1e9 for size, cost in seen.items()}
    trusted = [each[size] for size, cost in seen.items() if cost.count >= min_size_batches] or list(
        each.values()
    )
    cheapest = min(trusted)
    size = min(size for size, cost in each.items() if cost * efficiency <= cheapest + 1e-12)
    return Worth(size, cheapest, sum(cost.count for cost in seen.values()), max(seen))


def per_request(batches: Batches) -> float:
    """Compute time per request (the bottleneck step has the most)."""
    requests = sum(size * cost.count for size, cost in batches.items())
    return sum(cost.ns for cost in batches.values()) / requests if requests else 0.0


@dataclass(frozen=True)
class GateSettings:
    """The gate's knobs (the gateway's from ``server.adaptive``)."""

    target: float = 1.0  # batches waiting behind the one running
    efficiency: float = 0.9  # the share of the most a batch can deliver that is worth waiting for
    floor: int = 1
    ceiling: int = 64
    interval_seconds: float = 0.25
    memory_seconds: float = 10.0  # the half-life of what was measured
    min_batches: int = 8
    min_size_batches: float = MIN_SIZE_BATCHES  # a size's batches before its cost may set the cheapest


@dataclass
class ModelGate:
    """One model's limit on the requests the gateway has in Triton for it."""

    settings: GateSettings
    limit: int = 0
    batches: dict[str, Batches] = field(default_factory=dict)  # remembered, by step
    last: Worth | None = None
    _read: dict[tuple[str, str], Batches] = field(
        default_factory=dict
    )  # the last read's totals, by replica and step

    def __post_init__(self) -> None:
        if not self.limit:
            self.limit = self.settings.ceiling

    def judge(self, steps: Mapping[str, Batches], elapsed: float) -> bool:
        """A new read of the model's steps' totals on one Triton, ``elapsed`` seconds after
        the last; whether the limit moved."""
        return self.judge_replicas({"": steps}, elapsed)

    def judge_replicas(self, replicas: Mapping[str, Mapping[str, Batches]], elapsed: float) -> bool:
        """A new read of the model's steps' totals on each replica that answered (by
        address), ``elapsed`` seconds after the last; whether the limit moved. Each
        replica's counters are its own (what ran since its last read), their batches fitted
        together (the replicas serve the same models); the limit is one replica's, times
        the replicas read. A replica not read now is forgotten: back, its first read is its
        base again."""
        keep = 0.5 ** (elapsed / self.settings.memory_seconds)
        new_by_step: dict[str, Batches] = {}
        for replica, steps in replicas.items():
            for step, totals in steps.items():
                key = (replica, step)
                new = since(totals, self._read[key]) if key in self._read else {}
                self._read[key] = dict(totals)
                added = new_by_step.setdefault(step, {})
                for size, cost in new.items():
                    had = added.get(size, BatchCost())
                    added[size] = BatchCost(had.count + cost.count, had.ns + cost.ns)
        self._read = {key: totals for key, totals in self._read.items() if key[0] in replicas}
        steps_read = {step for steps in replicas.values() for step in steps}
        for step in steps_read:
            old, new = self.batches.get(step, {}), new_by_step.get(step, {})
            merged = {
                size: BatchCost(
                    old.get(size, BatchCost()).count * keep + new.get(size, BatchCost()).count,
                    old.get(size, BatchCost()).ns * keep + new.get(size, BatchCost()).ns,
                )
                for size in {*old, *new}
            }
            self.batches[step] = {size: cost for size, cost in merged.items() if cost.count >= 0.01}
        measured = {step: self.batches.get(step, {}) for step in steps_read}
        bottleneck = max(measured.values(), key=per_request, default={})
        found = worth(bottleneck, self.settings.efficiency, self.settings.min_size_batches)
        if found is not None and found.batches >= self.settings.min_batches:
            self.last = found
        if self.last is None or not replicas:  # until measured: the ceiling
            return False
        settings, before = self.settings, self.limit
        one = math.ceil((1 + settings.target) * self.last.trying - 1e-9) + len(steps_read) - 1
        self.limit = max(settings.floor, min(settings.ceiling, one * len(replicas)))
        return self.limit != before


Statistics = Mapping[str, Mapping[str, Any]]  # each replica's statistics document, by address


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
        self._read_at: float | None = None

    @property
    def ceiling(self) -> int:
        return self.settings.ceiling

    def limit(self, model: str) -> int:
        gate = self.gates.get(model)
        return self.settings.ceiling if gate is None else gate.limit

    def readings(self) -> tuple[GateReading, ...]:
        """Each gated model's limit and what it was computed from (for the metrics)."""
        return tuple(
            GateReading(
                model,
                gate.limit,
                gate.last.size if gate.last else 0,
                gate.last.cheapest if gate.last else 0.0,
            )
            for model, gate in self.gates.items()
        )

    def note_sent(self, model: str) -> None:
        self.sent = True
        if model not in self.gates:
            self.gates[model] = ModelGate(self.settings)

    async def read(
        self,
        source: StatisticsSource | Callable[[], Awaitable[Statistics]],
        steps_of: Callable[[str], Iterable[str]],
    ) -> None:
        """One read of Triton's statistics (``source``: one Triton, or a call that reads
        every replica's), each gated model judged on its steps."""
        if not self.sent or not self.gates:
            return
        self.sent = False
        try:
            if callable(source):
                documents = await source()
            else:
                documents = {"": await source.statistics("", "")}
        except GatewayError as error:  # Triton down or slow: its breaker and probe say so
            logger.debug("no statistics for the gates: %s", error)
            return
        found = {replica: batches_of(document) for replica, document in documents.items()}
        now = self.clock()
        elapsed = self.settings.interval_seconds if self._read_at is None else now - self._read_at
        self._read_at = now
        moved = False
        for model, gate in self.gates.items():
            names = list(steps_of(model))
            replicas = {
                replica: {step: batches[step] for step in names if step in batches}
                for replica, batches in found.items()
            }
            replicas = {replica: steps for replica, steps in replicas.items() if steps}
            if replicas and gate.judge_replicas(replicas, elapsed):
                moved = True
                last = gate.last
                logger.info(
                    "the gate of %s is %d, on %d replica(s) (batches of %d worth making; %.1f ms a request at the cheapest)",
                    model,
                    gate.limit,
                    len(replicas),
                    last.size if last else 0,
                    last.cheapest * 1000 if last else 0,
                )
        if moved:
            self.on_change()
