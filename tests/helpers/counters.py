"""Counter totals read from a /metrics text, and what a call moved of them (the parity
tests compare what two paths count)."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

Totals = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def totals(text: str, families: Collection[str]) -> Totals:
    """Every ``_total`` sample of ``families`` in ``text``, by name and labels."""
    found = {}
    for family in text_string_to_metric_families(text):
        if family.name in families:
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def moved(before: dict[Any, float], after: dict[Any, float]) -> dict[Any, float]:
    """The samples that changed, by how much."""
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v != before.get(k, 0.0)}
