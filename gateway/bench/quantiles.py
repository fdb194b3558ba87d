"""Quantiles as the benchmarks report them."""

from __future__ import annotations

import math


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0-1) of ``values`` by the nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]
