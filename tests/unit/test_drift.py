"""Drift of the answers against a reference: the distances, what no drift looks like (the
bootstrap threshold, against a fixed PSI rule), and the monitor's windows, references and
gauges on one process's store (the Redis-shared store: tests/e2e/test_drift_shared.py)."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from gateway.errors import ConflictError
from gateway.observe.drift import (
    OTHER,
    SCORE_BINS,
    Distribution,
    DriftMonitor,
    LocalDriftStore,
    Reference,
    Served,
    _js,
    label_distance,
    no_drift,
    score_bin,
    score_distance,
)
from gateway.observe.metrics import GatewayMetrics
from gateway.settings import DriftSettings


def test_distances_are_zero_for_the_same_mix_and_one_for_disjoint_ones() -> None:
    mix = Counter({"cat": 30, "dog": 10})
    assert label_distance(mix, Counter({"cat": 3, "dog": 1})) == pytest.approx(0.0, abs=1e-9)
    assert label_distance(mix, Counter({"car": 5})) == pytest.approx(1.0)
    low, high = [0] * SCORE_BINS, [0] * SCORE_BINS
    low[score_bin(0.1)], high[score_bin(0.95)] = 10, 10
    assert score_distance(low, low) == 0.0
    assert score_distance(low, high) == pytest.approx(1.0)
    # half the mass moved: KS is the share moved
    half = list(low)
    half[score_bin(0.1)], half[score_bin(0.95)] = 5, 5
    assert score_distance(low, half) == pytest.approx(0.5)


def test_score_bins_clip_what_is_outside_0_1() -> None:
    assert score_bin(float("nan")) == 0
    assert score_bin(-3.0) == 0
    assert score_bin(1.0) == SCORE_BINS - 1
    assert score_bin(7.0) == SCORE_BINS - 1


def _psi(live: np.ndarray, reference: np.ndarray) -> float:
    eps = 1e-4
    p, q = np.maximum(live, eps), np.maximum(reference, eps)
    return float(((p - q) * np.log(p / q)).sum())


@pytest.mark.parametrize("window", [100, 500, 2000])
def test_the_bootstrap_threshold_holds_on_undrifted_windows_where_a_fixed_psi_rule_fires(window: int) -> None:
    """Windows drawn from the population the reference came from (no drift), over 1000
    classes with a long tail the reference of 5000 partly missed: the threshold is crossed
    about 1 % of the time (its quantile), a PSI > 0.2 rule almost always; a shifted mix is
    caught nearly every time. (Without the unseen tail put back, windows of 500 crossed
    it 74 % of the time.)"""
    rng = np.random.default_rng(7)
    classes = 1000
    weights = 1 / np.arange(1, classes + 1)  # Zipf: a few common classes, a long tail
    p = weights / weights.sum()
    reference = rng.multinomial(5000, p).astype(float)
    threshold = no_drift(reference, window, _js, 0.99, rng)
    ref_p = reference / reference.sum()

    undrifted = rng.multinomial(window, p, size=400) / window
    false_alarms = float(np.mean(_js(undrifted, np.broadcast_to(ref_p, undrifted.shape)) > threshold))
    psi_alarms = float(np.mean([_psi(row, ref_p) > 0.2 for row in undrifted]))
    assert false_alarms <= 0.05, false_alarms
    assert psi_alarms >= 0.8, psi_alarms

    shifted_p = np.roll(p, 3)  # the common classes are now others
    shifted = rng.multinomial(window, shifted_p, size=300) / window
    caught = float(np.mean(_js(shifted, np.broadcast_to(ref_p, shifted.shape)) > threshold))
    assert caught >= 0.95, caught


class Clock:
    def __init__(self) -> None:
        self.now = 1_800_000_000.0

    def __call__(self) -> float:
        return self.now


def _monitor(
    served: list[Served], store: LocalDriftStore | None = None, **settings: object
) -> tuple[DriftMonitor, CollectorRegistry, Clock]:
    registry = CollectorRegistry()
    clock = Clock()
    config = DriftSettings.model_validate(
        {"window_seconds": 60, "slot_seconds": 10, "min_inputs": 50, **settings}
    )
    monitor = DriftMonitor(
        config, GatewayMetrics(registry), store or LocalDriftStore(), lambda: served, clock
    )
    return monitor, registry, clock


def _feed(monitor: DriftMonitor, count: int, labels: list[str], score: float, version: str = "1") -> None:
    for index in range(count):
        monitor.observe("m", version, labels[index % len(labels)], score)


def _gauge(registry: CollectorRegistry, name: str, signal: str, version: str = "1") -> float | None:
    return registry.get_sample_value(name, {"model": "m", "version": version, "signal": signal})


def test_a_captured_reference_and_a_shifted_window_raise_the_gauges_past_their_thresholds() -> None:
    async def scenario() -> None:
        monitor, registry, clock = _monitor([Served("m", ("1",))])
        _feed(monitor, 400, ["cat", "dog", "fox", "owl"], 0.9)
        await monitor.tick()
        # a window without a reference: its size, no drift
        assert (
            registry.get_sample_value("gateway_prediction_window_inputs", {"model": "m", "version": "1"})
            == 400
        )
        assert _gauge(registry, "gateway_prediction_drift", "labels") is None
        reference = await monitor.capture("m", ["1"])
        assert reference.distribution.inputs == 400
        await monitor.tick()
        same = _gauge(registry, "gateway_prediction_drift", "labels")
        assert same is not None
        assert same < 1e-9  # the window is the reference
        assert _gauge(registry, "gateway_prediction_drift_threshold", "labels") is not None

        clock.now += 120  # the window (60 s) has slid past every slot: nothing live
        await monitor.tick()
        assert _gauge(registry, "gateway_prediction_drift", "labels") is None
        _feed(monitor, 200, ["cat", "cat", "cat", "car"], 0.3)  # darker photos: one label, low scores
        await monitor.tick()
        labels = _gauge(registry, "gateway_prediction_drift", "labels")
        confidence = _gauge(registry, "gateway_prediction_drift", "confidence")
        assert labels is not None
        assert confidence is not None
        assert labels > (_gauge(registry, "gateway_prediction_drift_threshold", "labels") or 1)
        assert confidence == pytest.approx(1.0)  # every score moved from 0.9 to 0.3
        reading = monitor.readings("m")["1"].as_json()
        assert reading["drift"]["drifting"] is True
        assert reading["top_labels"]["cat"] == 150

    asyncio.run(scenario())


def test_a_capture_under_min_inputs_is_refused_and_a_window_can_be_counted_in_inputs() -> None:
    async def scenario() -> None:
        monitor, _, clock = _monitor([Served("m", ("1",))], window_inputs=100)
        _feed(monitor, 20, ["a"], 0.5)
        with pytest.raises(ConflictError):
            await monitor.capture("m", ["1"])
        # three slots of 60 inputs: a count window of 100 keeps the two newest slots only
        for _ in range(3):
            _feed(monitor, 60, ["a"], 0.5)
            await monitor.flush()
            clock.now += 10
        clock.now -= 10
        assert (await monitor.window("m", "1")).inputs == 120

    asyncio.run(scenario())


def test_labels_past_max_labels_count_as_other_and_clientless_rows_count_scores_only() -> None:
    async def scenario() -> None:
        monitor, _, _ = _monitor([Served("m", ("1",))], max_labels=10)
        for index in range(25):
            monitor.observe("m", "1", f"label-{index}", 0.5)
        monitor.observe("m", "1", None, 0.5)
        await monitor.flush()
        window = await monitor.window("m", "1")
        assert len(window.labels) == 11
        assert window.labels[OTHER] == 15
        assert window.inputs == 26
        assert window.labelled == 25

    asyncio.run(scenario())


def test_a_reference_in_the_configuration_applies_until_one_is_captured(tmp_path: Path) -> None:
    configured = Reference(Distribution(Counter({"dog": 100}), [0] * (SCORE_BINS - 1) + [100]), 0, "x")
    document = __import__("json").dumps(configured.as_json())

    async def scenario() -> None:
        store = LocalDriftStore(str(tmp_path))
        monitor, registry, _ = _monitor([Served("m", ("1",), document)], store)
        _feed(monitor, 100, ["cat"], 0.99)
        await monitor.tick()
        found = await monitor.reference("m", document)
        assert found is not None
        assert found.source == "model-config"
        assert _gauge(registry, "gateway_prediction_drift", "labels") == pytest.approx(1.0)
        await monitor.capture("m", ["1"])
        assert (tmp_path / "m.json").is_file()  # kept across restarts
        again, _, _ = _monitor([Served("m", ("1",), document)], LocalDriftStore(str(tmp_path)))
        kept = await again.reference("m", document)
        assert kept is not None
        assert kept.source == "captured"
        assert kept.distribution.labels == {"cat": 100}
        assert await again.forget("m")
        back = await again.reference("m", document)
        assert back is not None
        assert back.source == "model-config"

    asyncio.run(scenario())


def test_a_version_gone_from_the_catalog_leaves_no_series() -> None:
    async def scenario() -> None:
        served = [Served("m", ("1", "2"))]
        monitor, registry, _ = _monitor(served)
        _feed(monitor, 100, ["a", "b"], 0.8, version="2")
        await monitor.tick()
        assert (
            registry.get_sample_value("gateway_prediction_window_inputs", {"model": "m", "version": "2"})
            == 100
        )
        served[0] = Served("m", ("1",))
        await monitor.tick()
        assert (
            registry.get_sample_value("gateway_prediction_window_inputs", {"model": "m", "version": "2"})
            is None
        )
        assert "2" not in monitor.readings("m")

    asyncio.run(scenario())


@pytest.mark.parametrize(
    "document",
    [
        [],
        {"labels": {"a": 1}},
        {"labels": {"a": -1}, "scores": [0] * SCORE_BINS},
        {"labels": {"a": 1}, "scores": [1] * (SCORE_BINS - 1)},
        {"labels": {"a": 1.5}, "scores": [1] * SCORE_BINS},
        {"labels": {}, "scores": [0] * SCORE_BINS},
        {"labels": {}, "scores": [1] * SCORE_BINS, "captured_at": "yesterday"},
    ],
)
def test_a_reference_that_is_not_one_is_refused(document: object) -> None:
    with pytest.raises(ValueError, match=r"reference|labels|scores|captured_at"):
        Reference.from_json(document)
