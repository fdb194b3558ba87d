"""Counters, histograms and a gauge updated on the event loop alone: prometheus-client's
exposition, without its per-update work.

A prometheus-client histogram observation takes two locks, checks its own state and walks
its buckets one by one; a counter takes a lock and checks. The gateway makes about seven
observations and three increments a request, every one of them on the event loop (the
check workers, the drift thresholds, the prediction log's sink and the log flusher update
none), so the locks guard nothing. These families are custom collectors (prometheus-client's
public interface for them): an update is a bisect and two additions, and the families
expose exactly the samples prometheus-client's own would (tests/unit/test_families.py holds
the two expositions equal, text and OpenMetrics, exemplars included).

Update them from the event loop only. A metric a thread updates stays a prometheus-client
one. ``*_created`` series are not written (the gateway turns them off:
:func:`prometheus_client.disable_created_metrics`).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator, Sequence
from math import inf
from time import time
from typing import Generic, TypeVar

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Exemplar
from prometheus_client.utils import floatToGoString

C = TypeVar("C")


class _Family(Generic[C]):
    """One metric family: its children by label values, made on first use and kept."""

    kind = ""  # the exposition's type

    def __init__(
        self, name: str, documentation: str, labelnames: Sequence[str], registry: CollectorRegistry
    ) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._children: dict[tuple[str, ...], C] = {}
        registry.register(self)

    def labels(self, *values: str, **named: str) -> C:
        """The child for these label values (positional, in the family's label order, or by
        name), made on first use."""
        if named:
            if values or set(named) != set(self.labelnames):
                raise ValueError(f"{self.name}: the labels are {', '.join(self.labelnames)}")
            values = tuple(named[label] for label in self.labelnames)
        found = self._children.get(values)
        if found is None:
            if len(values) != len(self.labelnames) or not self.labelnames:
                raise ValueError(f"{self.name}: {len(self.labelnames)} label values expected")
            if not all(isinstance(value, str) for value in values):  # one key for one series
                raise TypeError(f"{self.name}: label values are strings")
            found = self._children[values] = self._child(values)
        return found

    def _child(self, values: tuple[str, ...]) -> C:
        raise NotImplementedError

    def _family(self) -> Metric:
        return Metric(self.name, self.documentation, self.kind)

    def describe(self) -> Iterator[Metric]:
        """The family without samples: what the registry checks names against."""
        yield self._family()

    def collect(self) -> Iterator[Metric]:
        family = self._family()
        for values, child in self._children.items():
            self._samples(family, dict(zip(self.labelnames, values, strict=True)), child)
        yield family

    def _samples(self, family: Metric, labels: dict[str, str], child: C) -> None:
        raise NotImplementedError


class CounterValue:
    """One counter series."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError("a counter only goes up")
        self.value += amount


class LoopCounter(_Family[CounterValue]):
    """A counter family (``<name>_total`` samples); unlabelled, it is its own series."""

    kind = "counter"

    def __init__(
        self, name: str, documentation: str, labelnames: Sequence[str] = (), *, registry: CollectorRegistry
    ) -> None:
        super().__init__(name, documentation, labelnames, registry)
        self._only: CounterValue | None = None
        if not self.labelnames:
            self._only = self._children[()] = CounterValue()

    def inc(self, amount: float = 1.0) -> None:
        """The unlabelled counter's increment (a labelled one's is its series': ``labels``)."""
        if self._only is None:
            raise ValueError(f"{self.name}: {len(self.labelnames)} label values expected")
        self._only.inc(amount)

    def _child(self, values: tuple[str, ...]) -> CounterValue:
        return CounterValue()

    def _samples(self, family: Metric, labels: dict[str, str], child: CounterValue) -> None:
        family.add_sample(self.name + "_total", labels, child.value)


class HistogramValues:
    """One histogram series: each bucket's own count (not cumulative), the sum, and each
    bucket's latest exemplar."""

    __slots__ = ("_bounds", "counts", "exemplars", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self._bounds = bounds
        self.counts = [0] * len(bounds)
        self.exemplars: list[Exemplar | None] = [None] * len(bounds)
        self.sum = 0.0

    def observe(self, amount: float, exemplar: dict[str, str] | None = None) -> None:
        bounds = self._bounds
        at = bisect_left(bounds, amount)  # the first bound >= amount: prometheus-client's bucket
        self.sum += amount
        if amount <= bounds[at]:  # (not NaN: NaN counts in no bucket there either)
            self.counts[at] += 1
            if exemplar:
                self.exemplars[at] = Exemplar(exemplar, amount, time())


class LoopHistogram(_Family[HistogramValues]):
    """A histogram family (``_bucket``, ``_count`` and ``_sum`` samples; +Inf is added)."""

    kind = "histogram"

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str],
        *,
        buckets: Sequence[float],
        registry: CollectorRegistry,
    ) -> None:
        bounds = [float(bound) for bound in buckets]
        if bounds != sorted(bounds) or (bounds and bounds[0] < 0):
            raise ValueError(f"{name}: buckets must be sorted and not negative")
        if not bounds or bounds[-1] != inf:
            bounds.append(inf)
        self._bounds = tuple(bounds)
        self._les = tuple(floatToGoString(bound) for bound in bounds)  # type: ignore[no-untyped-call]
        super().__init__(name, documentation, labelnames, registry)

    def _child(self, values: tuple[str, ...]) -> HistogramValues:
        return HistogramValues(self._bounds)

    def _samples(self, family: Metric, labels: dict[str, str], child: HistogramValues) -> None:
        total = 0.0
        for le, count, exemplar in zip(self._les, child.counts, child.exemplars, strict=True):
            total += count
            family.add_sample(self.name + "_bucket", {**labels, "le": le}, total, None, exemplar)
        family.add_sample(self.name + "_count", labels, total)
        family.add_sample(self.name + "_sum", labels, child.sum)


class LoopGauge:
    """An unlabelled gauge that goes up and down (requests in flight)."""

    kind = "gauge"
    labelnames: tuple[str, ...] = ()

    def __init__(self, name: str, documentation: str, *, registry: CollectorRegistry) -> None:
        self.name = name
        self.documentation = documentation
        self.value = 0.0
        registry.register(self)

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount

    def dec(self, amount: float = 1.0) -> None:
        self.value -= amount

    def describe(self) -> Iterator[Metric]:
        yield Metric(self.name, self.documentation, self.kind)

    def collect(self) -> Iterator[Metric]:
        family = Metric(self.name, self.documentation, self.kind)
        family.add_sample(self.name, {}, self.value)
        yield family
