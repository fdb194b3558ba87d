"""The event loop's metric families expose exactly what prometheus-client's own would, after
the same updates: text format and OpenMetrics, exemplars included (the dashboards, alerts
and Prometheus's own parsing read these bytes)."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.exposition import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from gateway.observe.families import LoopCounter, LoopGauge, LoopHistogram

BUCKETS = (0.001, 0.01, 0.1, 1.0, 10.0)
LABELS = ("a", "b", "c")
amounts = st.one_of(
    st.floats(min_value=0, max_value=100, allow_nan=False),
    st.sampled_from([0.0, 0.001, 0.01, 1.0, 10.0, 10.5, math.inf, math.nan]),
)
updates = st.lists(
    st.tuples(
        st.sampled_from(["observe", "inc", "gauge"]),
        st.sampled_from(LABELS),
        amounts,
        st.booleans(),  # with an exemplar
    ),
    max_size=40,
)


def _pair() -> tuple[CollectorRegistry, list[Any], CollectorRegistry, list[Any]]:
    disable_created_metrics()  # type: ignore[no-untyped-call]
    theirs, ours = CollectorRegistry(), CollectorRegistry()
    their = [
        Counter("t_requests", "Requests.", ["kind"], registry=theirs),
        Histogram("t_seconds", "Seconds.", ["kind"], buckets=BUCKETS, registry=theirs),
        Gauge("t_in_flight", "In flight.", registry=theirs),
        Counter("t_sent", "Sent.", registry=theirs),
    ]
    our = [
        LoopCounter("t_requests", "Requests.", ["kind"], registry=ours),
        LoopHistogram("t_seconds", "Seconds.", ["kind"], buckets=BUCKETS, registry=ours),
        LoopGauge("t_in_flight", "In flight.", registry=ours),
        LoopCounter("t_sent", "Sent.", registry=ours),
    ]
    return theirs, their, ours, our


@settings(max_examples=150, deadline=None)
@given(updates)
def test_the_same_updates_expose_the_same_bytes(steps: list[tuple[str, str, float, bool]]) -> None:
    theirs, their, ours, our = _pair()
    for step, label, amount, exemplar in steps:
        for counter, histogram, gauge, sent in (their, our):
            if step == "observe":
                histogram.labels(label).observe(amount, {"trace_id": "ab" * 16} if exemplar else None)
            elif step == "inc" and not math.isnan(amount):
                counter.labels(kind=label).inc(amount)
                sent.inc()
            else:
                (gauge.inc if exemplar else gauge.dec)(1)
    # exemplars carry the time they were set: the same instant for both
    for family in (their[1], our[1]):
        _pin_exemplar_times(family)
    assert generate_latest(ours) == generate_latest(theirs)
    assert generate_openmetrics(ours) == generate_openmetrics(theirs)  # type: ignore[no-untyped-call]
    for name, labels in (("t_requests_total", {"kind": "a"}), ("t_seconds_count", {"kind": "b"})):
        assert ours.get_sample_value(name, labels) == theirs.get_sample_value(name, labels)


def _pin_exemplar_times(family: Any) -> None:
    if isinstance(family, LoopHistogram):
        children = [child.exemplars for child in family._children.values()]
        for exemplars in children:
            for at, exemplar in enumerate(exemplars):
                if exemplar is not None:
                    exemplars[at] = exemplar._replace(timestamp=1.5)
        return
    for child in family._metrics.values():
        for bucket in child._buckets:
            if bucket._exemplar is not None:
                bucket._exemplar = bucket._exemplar._replace(timestamp=1.5)


def test_names_are_checked_against_the_registry_s() -> None:
    registry = CollectorRegistry()
    LoopHistogram("x_seconds", "x", ["a"], buckets=BUCKETS, registry=registry)
    with pytest.raises(ValueError, match="Duplicated"):
        Counter("x_seconds_count", "clash", registry=registry)
    with pytest.raises(ValueError, match="Duplicated"):
        LoopCounter("x_seconds_sum", "clash", registry=registry)


def test_label_values_are_checked_once_per_series() -> None:
    family = LoopCounter("y", "y", ["a", "b"], registry=CollectorRegistry())
    with pytest.raises(ValueError, match="2 label values expected"):
        family.labels("one")
    with pytest.raises(ValueError, match="the labels are a, b"):
        family.labels(a="1")
    with pytest.raises(TypeError):
        family.labels("1", 2)  # type: ignore[arg-type]
    assert family.labels("1", "2") is family.labels(a="1", b="2")
    with pytest.raises(ValueError, match="2 label values expected"):
        family.inc()  # as prometheus-client refuses it: a labelled family has no series of its own
    with pytest.raises(ValueError, match="only goes up"):
        family.labels("1", "2").inc(-1)
    with pytest.raises(ValueError, match="sorted"):
        LoopHistogram("z", "z", [], buckets=(2.0, 1.0), registry=CollectorRegistry())
