"""The side-by-side bench's rounds (gateway/bench/side_by_side.py): the order each round
measures its targets in, and the A/B's difference round by round."""

from __future__ import annotations

import itertools

from gateway.bench.side_by_side import Measure, in_turn, summarise, table


def _measure(target: str, cpu_ms: float) -> Measure:
    return Measure("trivial", "text", target, 8, requests=100, seconds=1.0, p50_ms=1.0, p99_ms=2.0,
                   gateway_cpu_ms=cpu_ms, triton_cpu_ms=0.5)  # fmt: skip


def test_no_target_always_runs_after_the_same_one() -> None:
    targets = ["direct", "reference", "gateway", "variant"]
    first, second = in_turn(targets, 0), in_turn(targets, 1)
    assert sorted(first) == sorted(second) == sorted(targets)
    pairs = {(a, b) for order in (first, second) for a, b in itertools.pairwise(order)}
    # each neighbour pair is measured both ways round over two rounds
    assert ("gateway", "variant") in pairs
    assert ("variant", "gateway") in pairs
    assert ("reference", "gateway") in pairs
    assert ("gateway", "reference") in pairs
    assert in_turn(targets, 2) == first


def test_the_variant_is_compared_round_by_round_and_its_spread_reported() -> None:
    measures = [
        _measure("gateway", 1.5), _measure("variant", 1.4),  # round 1
        _measure("variant", 1.9), _measure("gateway", 1.6),  # round 2
        _measure("gateway", 1.4), _measure("variant", 1.5),  # round 3
    ]  # fmt: skip
    (row,) = summarise(measures)
    assert [round(d, 2) for d in row.variant_adds_by_round] == [-0.1, 0.3, 0.1]
    assert row.variant_adds_cpu_ms is not None
    assert round(row.variant_adds_cpu_ms, 2) == 0.0
    assert "| -0.10 to +0.30 ms |" in table([row], "the code at HEAD")


def test_without_a_variant_there_is_nothing_to_pair() -> None:
    (row,) = summarise([_measure("gateway", 1.5), _measure("gateway", 1.6)])
    assert row.variant_adds_by_round == []
    assert "Variant:" not in table([row])
