"""The capacity sweep's bounds (gateway.bench.capacity): the reference a run's static limits
set, the verdict on the adaptive limit, and the cross check of saved runs against each other."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.bench.capacity import GATE, Reference, Row, cross, main, verdict


def row(limit: str, goodput: float, p99_ms: float, speed: int = 1) -> Row:
    return Row(speed, limit, 10.0, goodput, p99_ms / 2, p99_ms, p99_ms, 100.0, {})


# a flat curve past 8: which limit is "the smallest at 90 %" turns on a few per cent
RUN_A = [
    row("static 4", 120, 80), row("static 8", 140, 130), row("static 16", 145, 250),
    row("static 64", 150, 740), row(GATE, 146, 180),
]  # fmt: skip
RUN_B = [
    row("static 4", 118, 85), row("static 8", 144, 120), row("static 16", 164, 220),
    row("static 64", 143, 940), row(GATE, 150, 300),
]  # fmt: skip


def test_the_reference_is_the_best_static_the_smallest_at_90_and_the_cap() -> None:
    reference = Reference.of(RUN_A, 1)
    assert (reference.best.limit, reference.smallest.limit, reference.cap.limit) == (
        "static 64", "static 8", "static 64",
    )  # fmt: skip
    judged = reference.judge(RUN_A[-1])
    assert judged.goodput_vs_best == pytest.approx(146 / 150)
    assert judged.p99_vs_smallest_at_90 == pytest.approx(180 / 130)
    assert judged.meets_knee_bound  # 97 %, 1.38x
    assert judged.meets_ceiling_bound  # 97 % of the cap's goodput, 0.24x its p99
    assert not reference.judge(row("static 16", 145, 250)).meets_knee_bound  # 1.92x static 8's


def test_the_verdict_names_the_static_limits_that_meet_the_caps_bound_themselves() -> None:
    [v] = [verdict(RUN_B, 1)]
    assert v.smallest_at_90 == "static 16"  # 144 < 0.9 * 164
    assert v.p99_vs_smallest_at_90 == pytest.approx(300 / 220)
    assert v.statics_meeting_ceiling_bound == ["static 8", "static 16"]  # 4: 83 % of the cap's
    slow = [row(f"static {n}", g, p, speed=5) for n, g, p in [(16, 33, 850), (32, 44, 1060), (64, 44, 1680)]]
    assert verdict([*slow, row(GATE, 40, 1240, speed=5)], 5).statics_meeting_ceiling_bound == []


def test_runs_held_to_each_others_reference_show_a_bound_set_by_noise() -> None:
    crossed = {(c.reference, c.candidate): c for c in cross({"a": RUN_A, "b": RUN_B})}
    # B's static 8 against A: 96 % of 150, 120 / 130 = 0.92x; B's 16: 1.69x
    assert crossed["a", "b"].smallest_at_90 == "static 8"
    assert crossed["a", "b"].meeting_knee_bound == ["static 8"]
    # A's rows against B's best (164): none reaches 90 % (A's 64: 150 / 164 = 91 %, but
    # 740 / 220 = 3.4x; A's 16: 88 %)
    assert crossed["b", "a"].meeting_knee_bound == []
    assert "static 16" in crossed["b", "a"].meeting_ceiling_bound  # 145 / 143, 250 / 940


def test_the_cross_check_reads_saved_runs_without_starting_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = []
    for name, rows in (("a", RUN_A), ("b", RUN_B)):
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps({"rows": [r.__dict__ for r in rows]}))
        files.append(str(path))
    assert main(["--cross", *files, "--out", str(tmp_path / "crossed")]) == 0
    saved = json.loads((tmp_path / "crossed.json").read_text())
    assert len(saved) == 2
    printed = capsys.readouterr().out
    assert "static 8: the knee's bound in 1 of 2 pairs" in printed
    assert printed.index("static 4:") < printed.index("static 16:") < printed.index(f"{GATE}:")
