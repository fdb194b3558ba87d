"""The prediction metrics: one observation per classified input, top-1, margin or
multi-label count, low confidence under the floor (a fresh registry per test)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from gateway.observe.metrics import GatewayMetrics
from gateway.settings import PredictionSettings


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    found = registry.get_sample_value(name, labels)
    return 0.0 if found is None else found


def test_single_label_answers_give_top1_margin_and_low_confidence() -> None:
    registry = CollectorRegistry()
    metrics = GatewayMetrics(registry)
    rows = [[0.9, 0.05], [0.4, 0.35, 0.1], [0.7], []]  # the last input answered nothing
    metrics.predictions("m", "1", rows, floor=0.5, multi_label=False, threshold=0.5)
    labels = {"model": "m", "version": "1"}
    assert value(registry, "gateway_prediction_top1_score_count", **labels) == 3
    assert value(registry, "gateway_prediction_top1_score_sum", **labels) == 0.9 + 0.4 + 0.7
    assert value(registry, "gateway_prediction_margin_count", **labels) == 2  # one had a single score
    assert abs(value(registry, "gateway_prediction_margin_sum", **labels) - (0.85 + 0.05)) < 1e-9
    assert value(registry, "gateway_prediction_low_confidence_total", **labels) == 1
    assert value(registry, "gateway_prediction_labels_above_threshold_count", **labels) == 0


def test_multi_label_answers_count_labels_at_or_above_the_threshold() -> None:
    registry = CollectorRegistry()
    metrics = GatewayMetrics(registry)
    metrics.predictions(
        "tags", "2", [[0.9, 0.6, 0.5, 0.2], [0.3]], floor=0.5, multi_label=True, threshold=0.5
    )
    labels = {"model": "tags", "version": "2"}
    assert value(registry, "gateway_prediction_labels_above_threshold_sum", **labels) == 3
    assert value(registry, "gateway_prediction_labels_above_threshold_count", **labels) == 2
    assert value(registry, "gateway_prediction_margin_count", **labels) == 0
    assert value(registry, "gateway_prediction_low_confidence_total", **labels) == 1


def test_a_model_may_have_its_own_floor() -> None:
    settings = PredictionSettings(confidence_floor=0.5, confidence_floors={"sentiment": 0.8})
    assert settings.floor("sentiment") == 0.8
    assert settings.floor("image_classifier") == 0.5
