"""The gateway's Prometheus metrics, and Triton's own metrics merged into one exposition.

Everything lives in an explicit :class:`CollectorRegistry` built by the app factory
(no global registry). Names are in base units with the ``gateway_`` prefix; labels use
Triton's names (``model``, ``version``) so dashboards can join the two families, and
their values are bounded: route templates, status codes, model names from settings,
error slugs, gRPC status names. Never user input, file names or request ids.

The gateway runs one process per container (one event loop, one gRPC channel); scale
it with replicas, each scraped on its own. prometheus-client's multiprocess mode is
therefore not used.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from time import perf_counter
from typing import NamedTuple

import httpx
from prometheus_client import (
    CollectorRegistry,
    Enum,
    Gauge,
    Info,
    disable_created_metrics,
)
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.parser import text_string_to_metric_families

from gateway.observe.families import CounterValue, HistogramValues, LoopCounter, LoopGauge, LoopHistogram

# Prometheus text format 0.0.4: what both generate_latest and Triton write, and what
# every Prometheus parses.
EXPOSITION_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# OpenMetrics 1.0, for scrapers that ask for it: the format that carries exemplars.
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"
# 1 ms .. 10 s, roughly x2.5 per step.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
INPUT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
# Scores and margins live in [0, 1]; finer near both ends, where confidence is read.
SCORE_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0)
LABEL_COUNT_BUCKETS = (0, 1, 2, 3, 5, 8, 13, 21)
BYTES_BUCKETS = (1024, 16 * 1024, 64 * 1024, 256 * 1024, 1024**2, 4 * 1024**2, 16 * 1024**2, 64 * 1024**2)


class _Timed:
    """Observes the seconds its block took, however the block ends (a class, not a
    generator: it is around every Triton call)."""

    __slots__ = ("_histogram", "_started")

    def __init__(self, histogram: HistogramValues) -> None:
        self._histogram = histogram
        self._started = 0.0

    def __enter__(self) -> None:
        self._started = perf_counter()

    def __exit__(self, *exc: object) -> None:
        self._histogram.observe(perf_counter() - self._started)


class CallSeries(NamedTuple):
    """What one kind of finished call updates (:meth:`GatewayMetrics.call_series`)."""

    requests: CounterValue
    duration: HistogramValues
    body: HistogramValues


class GatewayMetrics:
    """Every metric the gateway exports, registered in ``registry``."""

    def __init__(
        self, registry: CollectorRegistry, merges_triton: bool = True, shares_state: bool = False
    ) -> None:
        # *_created series double the series count for nothing Prometheus uses here. The
        # switch is process-wide in prometheus-client, so it is flipped here, when the
        # app is built, never at import.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = registry
        self._calls: dict[tuple[str, str, int, str], CallSeries] = {}
        self._replicas: ReplicaCollector | None = None
        self.requests = LoopCounter(
            "gateway_requests",
            "HTTP requests answered, by route template, method, status code and model.",
            ["route", "method", "status", "model"],
            registry=registry,
        )
        self.request_duration = LoopHistogram(
            "gateway_request_duration_seconds",
            "Time from the first byte of a request to the last byte of its response.",
            ["route", "method", "model"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.in_flight = LoopGauge(
            "gateway_requests_in_flight", "Requests being handled now.", registry=registry
        )
        self.request_body = LoopHistogram(
            "gateway_request_body_bytes",
            "Request body size as received.",
            ["route"],
            buckets=BYTES_BUCKETS,
            registry=registry,
        )
        self.validation_duration = LoopHistogram(
            "gateway_validation_duration_seconds",
            "Reading and validating a /classify body, before Triton is called.",
            ["model"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.inputs = LoopHistogram(
            "gateway_inputs_per_request",
            "Images or texts in one /classify request.",
            ["model"],
            buckets=INPUT_BUCKETS,
            registry=registry,
        )
        self.rejections = LoopCounter(
            "gateway_rejections",
            "Requests refused before or by Triton for being invalid, by reason (the problem type).",
            ["reason"],
            registry=registry,
        )
        self.triton_duration = LoopHistogram(
            "gateway_triton_request_duration_seconds",
            "One gRPC inference call to Triton, as the gateway sees it.",
            ["model", "version"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.triton_failures = LoopCounter(
            "gateway_triton_failures",
            "Failed gRPC inference calls to Triton, by gRPC status code.",
            ["model", "code"],
            registry=registry,
        )
        # Only when Triton's metrics are merged: scraped directly, Prometheus's own `up` says it.
        self.triton_metrics_up = (
            Gauge(
                "gateway_triton_metrics_up",
                "1 when Triton's metrics endpoint answered the last scrape, else 0.",
                registry=registry,
            )
            if merges_triton
            else None
        )
        self.model_ready = Gauge(
            "gateway_model_ready",
            "1 when a served model and all its ensemble steps are ready in Triton, else 0.",
            ["model"],
            registry=registry,
        )
        self.client_requests = LoopCounter(
            "gateway_client_requests",
            "Requests with a valid API key, by the key's configured id and outcome (allowed, rate_limited).",
            ["client", "outcome"],
            registry=registry,
        )
        # Only with a shared store (GATEWAY_REDIS__URL): without one there is nothing to be down.
        self.shared_state_up = (
            Gauge(
                "gateway_shared_state_up",
                "1 when the shared state (Redis) answered its last command, else 0 (the failure policy applies).",
                registry=registry,
            )
            if shares_state
            else None
        )
        self.shared_state_fallbacks = LoopCounter(
            "gateway_shared_state_fallbacks",
            "Rate-limit checks decided by the failure policy because Redis did not answer, by policy.",
            ["policy"],
            registry=registry,
        )
        self.key_reloads = LoopCounter(
            "gateway_key_reloads",
            "Changes of a keys file seen, by file (api, admin) and outcome (applied, refused: the "
            "file did not parse and the previous keys stay).",
            ["file", "outcome"],
            registry=registry,
        )
        self.keys_file_valid = Gauge(
            "gateway_keys_file_valid",
            "Whether a keys file (api, admin) parsed when last read: 0 while it does not (the "
            "auth.on_invalid_keys_file policy then applies: keep the previous keys, or refuse all).",
            ["file"],
            registry=registry,
        )
        self.rollout_requests = LoopCounter(
            "gateway_rollout_requests",
            "Requests to a model under a rollout, by the arm that answered (primary, canary) or "
            "also ran (shadow).",
            ["model", "arm"],
            registry=registry,
        )
        self.rollout_duration = LoopHistogram(
            "gateway_rollout_duration_seconds",
            "Time of each arm's inference for a model under a rollout.",
            ["model", "arm"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.shadow_comparisons = LoopCounter(
            "gateway_shadow_comparisons",
            "Shadowed inputs by outcome: agree or disagree (top-1 labels), error (the shadow "
            "failed), dropped (not sent: shadow cap full or the gateway shedding load).",
            ["model", "target", "outcome"],
            registry=registry,
        )
        self.shadow_score_difference = LoopHistogram(
            "gateway_shadow_score_difference",
            "|top-1 score of the shadow - top-1 score of the primary| per shadowed input.",
            ["model", "target"],
            buckets=(0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0),
            registry=registry,
        )
        # What the models answer: one observation per classified input, labelled by the
        # catalog's model and the version Triton says answered (never a client's value).
        self.prediction_top1 = LoopHistogram(
            "gateway_prediction_top1_score",
            "Top-1 score of each classified input, by model and version.",
            ["model", "version"],
            buckets=SCORE_BUCKETS,
            registry=registry,
        )
        self.prediction_margin = LoopHistogram(
            "gateway_prediction_margin",
            "Top-1 score minus top-2 score of each classified input with two predictions or more "
            "(single-label models: softmax, none).",
            ["model", "version"],
            buckets=SCORE_BUCKETS,
            registry=registry,
        )
        self.prediction_labels = LoopHistogram(
            "gateway_prediction_labels_above_threshold",
            "Labels at or above the threshold (the request's, else 0.5) of each classified input "
            "of a multi-label (sigmoid) model, among those answered.",
            ["model", "version"],
            buckets=LABEL_COUNT_BUCKETS,
            registry=registry,
        )
        self.prediction_low_confidence = LoopCounter(
            "gateway_prediction_low_confidence",
            "Classified inputs whose top-1 score is under the model's confidence floor "
            "(GATEWAY_PREDICTIONS__CONFIDENCE_FLOOR, per model GATEWAY_PREDICTIONS__CONFIDENCE_FLOORS).",
            ["model", "version"],
            registry=registry,
        )
        self.prediction_drift = Gauge(
            "gateway_prediction_drift",
            "Distance of the live window of answers to the model's reference, by signal: labels "
            "(Jensen-Shannon distance of the top-1 label mix, 0..1) or confidence (Kolmogorov-Smirnov "
            "statistic of the top-1 scores, 0..1). Absent without a reference or under min_inputs.",
            ["model", "version", "signal"],
            registry=registry,
        )
        self.prediction_drift_threshold = Gauge(
            "gateway_prediction_drift_threshold",
            "What gateway_prediction_drift reaches without drift: its quantile (GATEWAY_DRIFT__QUANTILE) "
            "between samples of the reference itself at the live window's size.",
            ["model", "version", "signal"],
            registry=registry,
        )
        self.prediction_window = Gauge(
            "gateway_prediction_window_inputs",
            "Classified inputs in the live drift window (every replica's, with Redis).",
            ["model", "version"],
            registry=registry,
        )
        self.prediction_log_sent = LoopCounter(
            "gateway_prediction_log_sent", "Prediction log records the sink took.", registry=registry
        )
        self.prediction_log_dropped = LoopCounter(
            "gateway_prediction_log_dropped",
            "Prediction log records dropped, by reason: queue_full (the sink is slower than the "
            "sampled traffic) or sink_error (the sink failed or timed out).",
            ["reason"],
            registry=registry,
        )
        for reason in ("queue_full", "sink_error"):  # 0 from the start: a rate, not a gap
            self.prediction_log_dropped.labels(reason)
        self.circuit = Enum(
            "gateway_triton_circuit_state",
            "The circuit breaker in front of Triton: closed (calls go through), open (503 at once), "
            "half_open (one trial call).",
            states=["closed", "open", "half_open"],
            registry=registry,
        )
        self.catalog_refreshed = Gauge(
            "gateway_catalog_last_refresh_timestamp_seconds",
            "When the model catalog was last read from Triton (Unix time): it moves every "
            "catalog refresh period while Triton answers, with no traffic; `time() - this` is "
            "the catalog's age.",
            registry=registry,
        )
        self.build = Info("gateway_build", "Gateway version and configuration.", registry=registry)

    def call_series(self, route: str, method: str, status: int, model: str) -> CallSeries:
        """The series a finished call of this kind updates (its count, its duration, its
        body's size), found once per kind: three label lookups a call are one. The keys
        are as bounded as the labels (route templates, methods, statuses, models)."""
        key = (route, method, status, model)
        found = self._calls.get(key)
        if found is None:
            found = self._calls[key] = CallSeries(
                self.requests.labels(route, method, str(status), model),
                self.request_duration.labels(route, method, model),
                self.request_body.labels(route),
            )
        return found

    def predictions(
        self,
        model: str,
        version: str,
        rows: Iterable[Sequence[float]],
        floor: float,
        multi_label: bool,
        threshold: float,
    ) -> None:
        """One observation per classified input: ``rows`` are each input's scores, highest
        first (as answered: the top-k the model returned)."""
        top1 = self.prediction_top1.labels(model, version)
        spread = (self.prediction_labels if multi_label else self.prediction_margin).labels(model, version)
        low = 0
        for scores in rows:
            if not scores:
                continue
            best = scores[0]
            top1.observe(best)
            low += best < floor
            if multi_label:
                spread.observe(sum(1 for score in scores if score >= threshold))
            elif len(scores) > 1:
                spread.observe(best - scores[1])
        if low:
            self.prediction_low_confidence.labels(model, version).inc(low)

    def watch_replicas(self, read: Callable[[], Sequence[ReplicaReading]]) -> None:
        """Export the Triton replicas' placement state, read at scrape time (the last
        placement built replaces an earlier one)."""
        if self._replicas is not None:
            self.registry.unregister(self._replicas)
        self._replicas = ReplicaCollector(read)
        self.registry.register(self._replicas)

    def time_triton_call(self, model: str, version: str) -> _Timed:
        """Around one Triton call: its duration, however it ends."""
        return _Timed(self.triton_duration.labels(model, version or "latest"))

    def exposition(self, triton: TritonScrape | None, accept: str = "") -> tuple[bytes, str]:
        """The gateway's families, then Triton's (when they were read), and the media type.

        A scraper that accepts OpenMetrics (Prometheus does) gets it, with the exemplars
        (trace ids) on the latency histogram; anything else gets the text format 0.0.4,
        Triton's part verbatim."""
        if "application/openmetrics-text" in accept:
            collectors = (self.registry, _TritonFamilies(triton)) if triton else (self.registry,)
            text = generate_openmetrics(_Chain(*collectors))  # type: ignore[no-untyped-call]
            return text, OPENMETRICS_CONTENT_TYPE
        ours = generate_latest(self.registry)
        if triton is None:
            return ours, EXPOSITION_CONTENT_TYPE
        return ours + triton.text.encode("utf-8"), EXPOSITION_CONTENT_TYPE


@dataclass(frozen=True)
class TritonScrape:
    """Triton's exposition as read (text, passed on verbatim) and as parsed once."""

    text: str
    families: list[Metric]


class _TritonFamilies:
    """Triton's families re-typed for OpenMetrics: its counters lack the ``_total`` suffix
    OpenMetrics requires, so they go out as ``unknown``, which keeps every series name
    exactly as Triton writes it (and as dashboards query it)."""

    def __init__(self, scrape: TritonScrape) -> None:
        self._scrape = scrape

    def collect(self) -> Iterator[Metric]:
        # The parser names counter samples *_total; Triton's are not: keep Triton's names.
        written = {
            line.split("{", 1)[0].split(" ", 1)[0]
            for line in self._scrape.text.splitlines()
            if line[:1] != "#"
        }
        for family in self._scrape.families:
            if family.type in ("counter", "untyped", "unknown"):
                samples = [
                    sample
                    if sample.name in written
                    else sample._replace(name=sample.name.removesuffix("_total"))
                    for sample in family.samples
                ]
                # an unknown family's samples bear its name exactly
                retyped = Metric(samples[0].name if samples else family.name, family.documentation, "unknown")
                retyped.samples = samples
                yield retyped
            else:
                yield family


class _Chain:
    """Several collectors as one, for one exposition."""

    def __init__(self, *collectors: CollectorRegistry | _TritonFamilies) -> None:
        self._collectors = collectors

    def collect(self) -> Iterator[Metric]:
        for collector in self._collectors:
            yield from collector.collect()


def sanitise_triton_metrics(text: str, reserved_prefix: str = "gateway_") -> TritonScrape | None:
    """Triton's exposition when it parses and has no family of ours; None otherwise.

    Passing it through verbatim keeps Triton's names and types exactly as Triton emits
    them (re-rendering through prometheus-client would rename counters).
    """
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError:
        return None
    if any(family.name.startswith(reserved_prefix) for family in families):
        return None
    return TritonScrape(text if text.endswith("\n") else text + "\n", families)


class TritonMetricsScraper:
    """Reads Triton's metrics endpoint at scrape time, with a short timeout."""

    def __init__(self, url: str, timeout: float) -> None:
        self._url = url
        self._client = httpx.AsyncClient(timeout=timeout)

    async def fetch(self) -> TritonScrape | None:
        """Triton's exposition, or None when it cannot be read or parsed."""
        if not self._url:
            return None
        try:
            response = await self._client.get(self._url)
        except httpx.HTTPError:
            return None
        if response.status_code != 200:
            return None
        return sanitise_triton_metrics(response.text)

    async def close(self) -> None:
        await self._client.aclose()


@dataclass(frozen=True)
class GateReading:
    """One model's gate at scrape time (gateway.serving.queuegate)."""

    model: str
    limit: int
    batch: int  # the batch worth making, 0 until measured
    cost_seconds: float  # the cheapest compute time a request measured, 0 until then


@dataclass(frozen=True)
class CapacityReading:
    """The admission's state at scrape time (gateway.serving.admission.Admission.reading)."""

    limit: int
    ceiling: int
    in_flight: int
    waiting: int
    in_use: float  # the limit's share in use, averaged (0-1)
    gates: Sequence[GateReading]  # each gated model's (none with a static limit)
    admitted: int
    shed: int
    waited_seconds: float
    held_by_tier: dict[str, int]


@dataclass(frozen=True)
class ReplicaReading:
    """One Triton replica as the placement sees it (gateway.serving.placement)."""

    address: str
    up: bool
    in_flight: int
    call_seconds: float
    placed: int


class ReplicaCollector:
    """Each Triton replica's placement state (gateway.serving.placement), at scrape time:
    nothing is updated per call."""

    def __init__(self, read: Callable[[], Sequence[ReplicaReading]]) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        readings = self._read()
        families = (
            ("gateway_triton_replica_up", "1 while the Triton replica answers its probe and takes calls."),
            ("gateway_triton_replica_in_flight", "Calls to the Triton replica under way now."),
            (
                "gateway_triton_replica_call_seconds",
                "What the replica's calls have been taking (a decaying average; 0 until one returned).",
            ),
        )
        values: tuple[Callable[[ReplicaReading], float], ...] = (
            lambda r: 1.0 if r.up else 0.0,
            lambda r: float(r.in_flight),
            lambda r: r.call_seconds,
        )
        for (name, help_text), value in zip(families, values, strict=True):
            family = GaugeMetricFamily(name, help_text, labels=["replica"])
            for reading in readings:
                family.add_metric([reading.address], value(reading))
            yield family
        placed = CounterMetricFamily(
            "gateway_triton_replica_calls", "Calls placed on the Triton replica.", labels=["replica"]
        )
        for reading in readings:
            placed.add_metric([reading.address], reading.placed)
        yield placed


class CapacityCollector:
    """The gauges an autoscaler and the dashboard read, computed at scrape time from the
    admission (no per-request gauge updates on the hot path)."""

    def __init__(self, read: Callable[[], CapacityReading], tiers: Sequence[str]) -> None:
        self._read = read
        self._tiers = tiers

    def collect(self) -> Iterator[Metric]:
        r = self._read()
        yield GaugeMetricFamily(
            "gateway_inflight_limit",
            "Inference requests the gateway admits at once now (its models' gates together; "
            "max_in_flight at most).",
            value=r.limit,
        )
        yield GaugeMetricFamily(
            "gateway_inflight_ceiling", "The limit's ceiling (max_in_flight).", value=r.ceiling
        )
        yield GaugeMetricFamily(
            "gateway_inflight_admitted",
            "Inference requests holding an in-flight slot now.",
            value=r.in_flight,
        )
        yield GaugeMetricFamily(
            "gateway_admission_queue",
            "Inference requests waiting for an in-flight slot now.",
            value=r.waiting,
        )
        yield GaugeMetricFamily(
            "gateway_capacity_in_use",
            "Share of the in-flight limit in use, averaged over about 10 s (0-1): the one to scale on.",
            value=r.in_use,
        )
        gate_limit = GaugeMetricFamily(
            "gateway_gate_limit",
            "Each model's gate: its requests the gateway lets into Triton at once (the batch worth "
            "making running and queue_target_batches of it waiting; max_in_flight until measured).",
            labels=["model"],
        )
        gate_batch = GaugeMetricFamily(
            "gateway_gate_batch",
            "Each model's batch worth making, from Triton's statistics: the smallest batch size within "
            "1 - batch_efficiency of the cheapest cost a request (0 until measured).",
            labels=["model"],
        )
        gate_cost = GaugeMetricFamily(
            "gateway_gate_request_cost_seconds",
            "Each model's cheapest compute time a request, at the batch size that gives it, as Triton "
            "measures it (its bottleneck step's; 0 until measured).",
            labels=["model"],
        )
        for gate in r.gates:
            gate_limit.add_metric([gate.model], gate.limit)
            gate_batch.add_metric([gate.model], gate.batch)
            gate_cost.add_metric([gate.model], gate.cost_seconds)
        yield gate_limit
        yield gate_batch
        yield gate_cost
        yield CounterMetricFamily(
            "gateway_admission_admitted", "Inference requests given an in-flight slot.", value=r.admitted
        )
        yield CounterMetricFamily(
            "gateway_admission_shed",
            "Inference requests refused 503 overloaded after waiting queue_seconds for a slot.",
            value=r.shed,
        )
        yield CounterMetricFamily(
            "gateway_admission_wait_seconds",
            "Seconds requests spent waiting for an in-flight slot (divide by admitted + shed).",
            value=r.waited_seconds,
        )
        held = GaugeMetricFamily(
            "gateway_inflight_by_tier", "In-flight slots held by keys of each tier.", labels=["tier"]
        )
        for tier in self._tiers:
            held.add_metric([tier], r.held_by_tier.get(tier, 0))
        yield held
