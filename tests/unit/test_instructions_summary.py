"""gateway.bench.instructions' arithmetic: the idle taken off, medians over rounds, ratios."""

from __future__ import annotations

from gateway.bench.instructions import Count, summary, table


def test_a_request_is_its_count_less_the_idle_over_the_requests() -> None:
    assert Count("gateway", "text", 100, 250_000_000, 50_000_000, 3.0).per_request == 2_000_000


def test_the_summary_takes_the_median_round_and_the_ratios() -> None:
    counts = [
        Count("gateway", "text", 10, 30, 0, 1.0),
        Count("reference", "text", 10, 20, 0, 1.0),
        Count("against", "text", 10, 40, 10, 1.0),
        Count("gateway", "text", 10, 35, 5, 1.0),
        Count("reference", "text", 10, 20, 0, 1.0),
        Count("against", "text", 10, 100, 0, 1.0),
        Count("gateway", "text", 10, 90, 0, 1.0),
        Count("reference", "text", 10, 25, 5, 1.0),
        Count("against", "text", 10, 31, 1, 1.0),
    ]
    row = summary(counts)["text"]
    assert (row["gateway"], row["reference"], row["against"]) == (3.0, 2.0, 3.0)
    assert row["gateway/reference"] == 1.5
    assert row["against/reference"] == 1.5
    assert row["gateway/against"] == 1.0
    assert "| text | gateway | 0.000 M, 0.000 M, 0.000 M | 0.000 M |" in table(
        {"text": row}, counts
    )  # millions
    assert "| text | ratios | gateway/reference 1.500" in table({"text": row}, counts)
