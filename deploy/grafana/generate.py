"""Generate the Grafana dashboards in deploy/grafana/dashboards/ (the JSON is committed).

    python deploy/grafana/generate.py            # rewrite the JSON files
    python deploy/grafana/generate.py --check    # fail if they are out of date (the tests do)

Every panel queries the Prometheus datasource chosen by the ``datasource`` variable; the
``model`` variable lists Triton's models. The end-to-end tests run every query below
against a real Prometheus scraping a real gateway and Triton.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "dashboards"
DS = {"type": "prometheus", "uid": "${datasource}"}
RATE = "$__rate_interval"
MODEL = 'model=~"$model"'


def target(expr: str, legend: str, ref: str, exemplar: bool = False) -> dict[str, Any]:
    found = {"refId": ref, "datasource": DS, "expr": expr, "legendFormat": legend, "range": True}
    if exemplar:
        # Exemplars (trace ids of sampled requests) as points; the Prometheus datasource
        # links each to its trace in the Jaeger datasource (provisioning/datasources).
        found["exemplar"] = True
    return found


def panel(
    title: str,
    description: str,
    queries: list[tuple[str, str]],
    unit: str,
    grid: tuple[int, int, int, int],
    kind: str = "timeseries",
    stack: bool = False,
    exemplars: bool = False,
) -> dict[str, Any]:
    x, y, w, h = grid
    custom: dict[str, Any] = {}
    if kind == "timeseries":
        custom = {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 20 if stack else 0,
            "showPoints": "never",
        }
        if stack:
            custom["stacking"] = {"mode": "normal", "group": "A"}
    options: dict[str, Any] = {
        "tooltip": {"mode": "multi", "sort": "desc"},
        "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
    }
    if kind == "stat":
        options = {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "value",
        }
    return {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DS,
        "gridPos": {"x": x, "y": y, "w": w, "h": h},
        "targets": [
            target(expr, legend, chr(ord("A") + i), exemplars) for i, (expr, legend) in enumerate(queries)
        ],
        "fieldConfig": {"defaults": {"unit": unit, "custom": custom}, "overrides": []},
        "options": options,
    }


def variables(with_model: bool, models_from: str = "nv_inference_request_success") -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = [
        {
            "name": "datasource",
            "label": "Prometheus",
            "type": "datasource",
            "query": "prometheus",
            # The provisioned datasource (deploy/grafana/provisioning) has this uid.
            "current": {"text": "Prometheus", "value": "prometheus"},
            "hide": 0,
            "refresh": 1,
        }
    ]
    if with_model:
        found.append(
            {
                "name": "model",
                "label": "Model",
                "type": "query",
                "datasource": DS,
                "query": {"query": f"label_values({models_from}, model)", "refId": "models"},
                "includeAll": True,
                "allValue": ".*",
                "multi": True,
                "current": {"text": "All", "value": "$__all"},
                "refresh": 2,
                "hide": 0,
                "sort": 1,
            }
        )
    return found


def dashboard(
    uid: str,
    title: str,
    description: str,
    panels: list[dict[str, Any]],
    with_model: bool,
    models_from: str = "nv_inference_request_success",
) -> dict[str, Any]:
    for index, item in enumerate(panels, start=1):
        item["id"] = index
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["triton-gateway", "triton"],
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "timepicker": {},
        "timezone": "browser",
        "templating": {"list": variables(with_model, models_from)},
        "annotations": {"list": []},
        "links": [],
        "panels": panels,
    }


def quantile(q: float, metric: str, by: str, selector: str = "") -> str:
    return f"histogram_quantile({q}, sum by (le, {by}) (rate({metric}_bucket{{{selector}}}[{RATE}])))"


def mean(metric: str, by: str, selector: str = "") -> str:
    return f"sum by ({by}) (rate({metric}_sum{{{selector}}}[{RATE}])) / sum by ({by}) (rate({metric}_count{{{selector}}}[{RATE}]))"


def triton_mean_seconds(counter: str) -> str:
    """Mean per request, in seconds, from Triton's cumulative microsecond counters."""
    return (
        f"sum by (model) (rate({counter}{{{MODEL}}}[{RATE}])) / 1e6"
        f" / sum by (model) (rate(nv_inference_request_success{{{MODEL}}}[{RATE}]))"
    )


def gateway_overview() -> dict[str, Any]:
    classify = 'route="/classify"'
    panels = [
        panel(
            "Request rate",
            "Requests answered per second, by route and status code.",
            [(f"sum by (route, status) (rate(gateway_requests_total[{RATE}]))", "{{route}} {{status}}")],
            "reqps",
            (0, 0, 12, 8),
        ),
        panel(
            "Errors by status",
            "4xx (the client's input) and 5xx (Triton or the gateway) answers per second.",
            [(f'sum by (status) (rate(gateway_requests_total{{status=~"[45].."}}[{RATE}]))', "{{status}}")],
            "reqps",
            (12, 0, 12, 8),
        ),
        panel(
            "/classify latency percentiles",
            "Whole-request latency at the gateway, from the first byte in to the last byte out. "
            "With tracing on, the dots are exemplars: click one to open that request's trace.",
            [
                (quantile(0.5, "gateway_request_duration_seconds", "route", classify), "p50"),
                (quantile(0.95, "gateway_request_duration_seconds", "route", classify), "p95"),
                (quantile(0.99, "gateway_request_duration_seconds", "route", classify), "p99"),
            ],
            "s",
            (0, 8, 12, 8),
            exemplars=True,
        ),
        panel(
            "Requests in flight",
            "Requests being handled right now (saturation).",
            [("sum(gateway_requests_in_flight)", "in flight")],
            "short",
            (12, 8, 6, 8),
        ),
        panel(
            "Triton and models",
            "1 = up/ready (the lowest over the gateway replicas). Triton's metrics endpoint (merged by "
            "the gateway, or scraped directly as job `triton`) and each served model with all its "
            "ensemble steps.",
            [
                ('min(gateway_triton_metrics_up or up{job="triton"})', "triton metrics"),
                ("min by (model) (gateway_model_ready)", "{{model}}"),
            ],
            "short",
            (18, 8, 6, 8),
            kind="stat",
        ),
        panel(
            "Rejections by reason",
            "Requests refused as invalid, by problem type (payload-too-large, unsupported-image-format, ...).",
            [(f"sum by (reason) (rate(gateway_rejections_total[{RATE}]))", "{{reason}}")],
            "reqps",
            (0, 16, 12, 8),
        ),
        panel(
            "Triton call failures",
            "Failed gRPC calls to Triton by status code (INVALID_ARGUMENT: input the model rejected).",
            [(f"sum by (model, code) (rate(gateway_triton_failures_total[{RATE}]))", "{{model}} {{code}}")],
            "reqps",
            (12, 16, 12, 8),
        ),
        panel(
            "Inputs per request",
            "Mean images or texts per /classify request, by model.",
            [(mean("gateway_inputs_per_request", "model"), "{{model}}")],
            "short",
            (0, 24, 12, 8),
        ),
        panel(
            "Request body size (p95)",
            "95th percentile of request body bytes, by route.",
            [(quantile(0.95, "gateway_request_body_bytes", "route"), "{{route}}")],
            "bytes",
            (12, 24, 12, 8),
        ),
        panel(
            "Rollouts: shadow agreement",
            "Share of shadowed inputs whose top-1 label agrees with the served model's, by model and "
            "shadow target (PUT /admin/models/{model}/rollout). The ShadowAgreementLow alert fires under 90 %.",
            [
                (
                    f'sum by (model, target) (rate(gateway_shadow_comparisons_total{{outcome="agree"}}[{RATE}])) / '
                    f'sum by (model, target) (rate(gateway_shadow_comparisons_total{{outcome=~"agree|disagree"}}[{RATE}]))',
                    "{{model}} vs {{target}}",
                )
            ],
            "percentunit",
            (0, 32, 12, 8),
        ),
        panel(
            "Rollouts: latency per arm (p50)",
            "Median inference time of each arm of a rollout: primary (the served model), canary, shadow.",
            [(quantile(0.5, "gateway_rollout_duration_seconds", "model, arm"), "{{model}} {{arm}}")],
            "s",
            (12, 32, 12, 8),
        ),
    ]
    return dashboard(
        "triton-gateway-overview",
        "Triton gateway: overview",
        "Traffic, errors, latency and saturation of the gateway.",
        panels,
        with_model=False,
    )


def triton_models() -> dict[str, Any]:
    panels = [
        panel(
            "Inference rate",
            "Successful inference requests per second, by model (ensembles and their steps).",
            [(f"sum by (model) (rate(nv_inference_request_success{{{MODEL}}}[{RATE}]))", "{{model}}")],
            "reqps",
            (0, 0, 12, 8),
        ),
        panel(
            "Inference failures",
            "Failed inference requests per second, by model.",
            [(f"sum by (model) (rate(nv_inference_request_failure{{{MODEL}}}[{RATE}]))", "{{model}}")],
            "reqps",
            (12, 0, 12, 8),
        ),
        panel(
            "Average batch size",
            "Inferences per model execution: how well the dynamic batcher merges requests.",
            [
                (
                    f"sum by (model) (rate(nv_inference_count{{{MODEL}}}[{RATE}]))"
                    f" / sum by (model) (rate(nv_inference_exec_count{{{MODEL}}}[{RATE}]))",
                    "{{model}}",
                )
            ],
            "short",
            (0, 8, 12, 8),
        ),
        panel(
            "Pending requests",
            "Requests waiting in Triton's queues, by model.",
            [(f"sum by (model) (nv_inference_pending_request_count{{{MODEL}}})", "{{model}}")],
            "short",
            (12, 8, 12, 8),
        ),
        panel(
            "Queue vs compute per request",
            "Mean time per request in the queue and in compute (input, infer, output), by model.",
            [
                (triton_mean_seconds("nv_inference_queue_duration_us"), "{{model}} queue"),
                (triton_mean_seconds("nv_inference_compute_input_duration_us"), "{{model}} input"),
                (triton_mean_seconds("nv_inference_compute_infer_duration_us"), "{{model}} infer"),
                (triton_mean_seconds("nv_inference_compute_output_duration_us"), "{{model}} output"),
            ],
            "s",
            (0, 16, 24, 9),
            stack=True,
        ),
        panel(
            "CPU utilisation",
            "Triton host CPU utilisation (0-1).",
            [("nv_cpu_utilization", "cpu")],
            "percentunit",
            (0, 25, 12, 8),
        ),
        panel(
            "CPU memory",
            "Triton host memory used and total.",
            [("nv_cpu_memory_used_bytes", "used"), ("nv_cpu_memory_total_bytes", "total")],
            "bytes",
            (12, 25, 12, 8),
        ),
        panel(
            "GPU utilisation",
            "GPU hosts only: utilisation per GPU (empty on CPU-only Triton).",
            [("nv_gpu_utilization", "{{gpu_uuid}}")],
            "percentunit",
            (0, 33, 12, 8),
        ),
        panel(
            "GPU memory",
            "GPU hosts only: memory used and total per GPU (empty on CPU-only Triton).",
            [
                ("nv_gpu_memory_used_bytes", "{{gpu_uuid}} used"),
                ("nv_gpu_memory_total_bytes", "{{gpu_uuid}} total"),
            ],
            "bytes",
            (12, 33, 12, 8),
        ),
        panel(
            "Response cache hit ratio",
            "Share of requests Triton answered from its response cache, by model (models with "
            "response_cache enabled, on a Triton started with --cache-config; empty otherwise).",
            [
                (
                    f"sum by (model) (rate(nv_cache_num_hits_per_model{{{MODEL}}}[{RATE}]))"
                    f" / (sum by (model) (rate(nv_cache_num_hits_per_model{{{MODEL}}}[{RATE}]))"
                    f" + sum by (model) (rate(nv_cache_num_misses_per_model{{{MODEL}}}[{RATE}])))",
                    "{{model}}",
                )
            ],
            "percentunit",
            (0, 41, 12, 8),
        ),
    ]
    return dashboard(
        "triton-gateway-models",
        "Triton gateway: Triton models",
        "Per-model throughput, batching, queueing and compute inside Triton, and host utilisation.",
        panels,
        with_model=True,
    )


def latency_breakdown() -> dict[str, Any]:
    gateway_model = 'route="/classify", model=~"$model"'
    panels = [
        panel(
            "Where /classify time goes (mean)",
            "Gateway validation, the gRPC call to Triton, and the rest of the request "
            "(reading the body, serialising the answer), per model.",
            [
                (mean("gateway_validation_duration_seconds", "model", MODEL), "{{model}} validation"),
                (mean("gateway_triton_request_duration_seconds", "model", MODEL), "{{model}} triton call"),
                (mean("gateway_request_duration_seconds", "model", gateway_model), "{{model}} whole request"),
            ],
            "s",
            (0, 0, 24, 9),
        ),
        panel(
            "Gateway validation (p95)",
            "Reading and checking the body before Triton is called.",
            [(quantile(0.95, "gateway_validation_duration_seconds", "model", MODEL), "{{model}}")],
            "s",
            (0, 9, 8, 8),
        ),
        panel(
            "gRPC call to Triton (p95)",
            "One inference call as the gateway sees it: network plus everything inside Triton.",
            [(quantile(0.95, "gateway_triton_request_duration_seconds", "model", MODEL), "{{model}}")],
            "s",
            (8, 9, 8, 8),
        ),
        panel(
            "Whole request (p95)",
            "The /classify request at the gateway, by model; with tracing on, exemplar dots open "
            "the trace of one request (gateway spans and every Triton step).",
            [(quantile(0.95, "gateway_request_duration_seconds", "model", gateway_model), "{{model}}")],
            "s",
            (16, 9, 8, 8),
            exemplars=True,
        ),
        panel(
            "Inside Triton: queue and compute per model (mean per request)",
            "Triton's own accounting for each ensemble step: queue wait, then compute input, infer, output.",
            [
                (triton_mean_seconds("nv_inference_queue_duration_us"), "{{model}} queue"),
                (triton_mean_seconds("nv_inference_compute_input_duration_us"), "{{model}} compute input"),
                (triton_mean_seconds("nv_inference_compute_infer_duration_us"), "{{model}} compute infer"),
                (triton_mean_seconds("nv_inference_compute_output_duration_us"), "{{model}} compute output"),
            ],
            "s",
            (0, 17, 24, 9),
            stack=True,
        ),
        panel(
            "Triton end-to-end per request (mean)",
            "Triton's request duration per model (for an ensemble: all of its steps).",
            [(triton_mean_seconds("nv_inference_request_duration_us"), "{{model}}")],
            "s",
            (0, 26, 24, 8),
        ),
    ]
    return dashboard(
        "triton-gateway-latency",
        "Triton gateway: latency breakdown",
        "Gateway validation vs the gRPC hop vs Triton queue and compute, per model.",
        panels,
        with_model=True,
    )


def model_quality() -> dict[str, Any]:
    """What the models answer (issue 33): confidence, low-confidence share, drift against
    the reference and its threshold, rollout agreement, the prediction log's health."""
    top1 = "gateway_prediction_top1_score"
    panels = [
        panel(
            "Top-1 score (median and p10)",
            "Each classified input's top-1 score, by model. A slide down means the inputs (or the "
            "model) changed: darker photos, another language.",
            [
                (quantile(0.5, top1, "model", MODEL), "{{model}} p50"),
                (quantile(0.1, top1, "model", MODEL), "{{model}} p10"),
            ],
            "percentunit",
            (0, 0, 12, 8),
        ),
        panel(
            "Low-confidence share",
            "Share of inputs whose top-1 score is under the model's floor "
            "(GATEWAY_PREDICTIONS__CONFIDENCE_FLOOR[S]).",
            [
                (
                    f"sum by (model) (rate(gateway_prediction_low_confidence_total{{{MODEL}}}[{RATE}])) / "
                    f"sum by (model) (rate({top1}_count{{{MODEL}}}[{RATE}]))",
                    "{{model}}",
                )
            ],
            "percentunit",
            (12, 0, 12, 8),
        ),
        panel(
            "Drift: label mix",
            "Jensen-Shannon distance of the live window's top-1 labels to the model's reference "
            "(solid), and what chance alone reaches at this window size (dashed: the threshold). "
            "The PredictionDrift alert fires when the distance stays above it for 10 minutes.",
            [
                (
                    f'max by (model, version) (gateway_prediction_drift{{signal="labels", {MODEL}}})',
                    "{{model}} v{{version}}",
                ),
                (
                    f'max by (model, version) (gateway_prediction_drift_threshold{{signal="labels", {MODEL}}})',
                    "{{model}} v{{version}} threshold",
                ),
            ],
            "short",
            (0, 8, 12, 8),
        ),
        panel(
            "Drift: confidence",
            "Kolmogorov-Smirnov statistic of the live window's top-1 scores against the reference's, "
            "and its no-drift threshold.",
            [
                (
                    f'max by (model, version) (gateway_prediction_drift{{signal="confidence", {MODEL}}})',
                    "{{model}} v{{version}}",
                ),
                (
                    f'max by (model, version) (gateway_prediction_drift_threshold{{signal="confidence", {MODEL}}})',
                    "{{model}} v{{version}} threshold",
                ),
            ],
            "short",
            (12, 8, 12, 8),
        ),
        panel(
            "Inputs in the drift window",
            "Classified inputs the drift is measured on (every replica's, with Redis); under "
            "GATEWAY_DRIFT__MIN_INPUTS no drift is reported.",
            [
                (
                    f"max by (model, version) (gateway_prediction_window_inputs{{{MODEL}}})",
                    "{{model}} v{{version}}",
                )
            ],
            "short",
            (0, 16, 12, 8),
        ),
        panel(
            "Top-1 margin (median)",
            "Top-1 minus top-2 score of single-label models: a shrinking margin is a model "
            "hesitating between classes.",
            [(quantile(0.5, "gateway_prediction_margin", "model", MODEL), "{{model}}")],
            "percentunit",
            (12, 16, 12, 8),
        ),
        panel(
            "Rollouts: top-1 agreement",
            "Share of shadowed inputs whose top-1 label agrees with the served model's.",
            [
                (
                    f'sum by (model, target) (rate(gateway_shadow_comparisons_total{{outcome="agree", {MODEL}}}[{RATE}])) / '
                    f'sum by (model, target) (rate(gateway_shadow_comparisons_total{{outcome=~"agree|disagree", {MODEL}}}[{RATE}]))',
                    "{{model}} vs {{target}}",
                )
            ],
            "percentunit",
            (0, 24, 12, 8),
        ),
        panel(
            "Prediction log",
            "Records the sink took, and those dropped (queue_full: the sink is slower than the "
            "sampled traffic; sink_error: it failed or timed out).",
            [
                (f"sum(rate(gateway_prediction_log_sent_total[{RATE}]))", "sent"),
                (
                    f"sum by (reason) (rate(gateway_prediction_log_dropped_total[{RATE}]))",
                    "dropped {{reason}}",
                ),
            ],
            "reqps",
            (12, 24, 12, 8),
        ),
    ]
    return dashboard(
        "triton-gateway-model-quality",
        "Triton gateway: model quality",
        "Whether the models are still right: confidence, drift against each model's reference, "
        "rollout agreement.",
        panels,
        with_model=True,
        models_from="gateway_prediction_top1_score_count",
    )


def capacity() -> dict[str, Any]:
    panels = [
        panel(
            "In-flight limit",
            "The in-flight limit per replica (its models' gates together: it follows Triton's speed), the requests holding a slot, "
            "and the ceiling (max_in_flight).",
            [
                ("max by (instance) (gateway_inflight_limit)", "limit {{instance}}"),
                ("max by (instance) (gateway_inflight_admitted)", "admitted {{instance}}"),
                ("max(gateway_inflight_ceiling)", "ceiling"),
            ],
            "short",
            (0, 0, 12, 8),
        ),
        panel(
            "Capacity in use",
            "Each replica's share of its limit in use, averaged over ~10 s (0-1): what the autoscalers "
            "scale the gateways on (deploy/k8s/components/autoscale-*).",
            [
                ("avg(gateway_capacity_in_use)", "average"),
                ("max(gateway_capacity_in_use)", "busiest replica"),
            ],
            "percentunit",
            (12, 0, 12, 8),
        ),
        panel(
            "Each model's gate",
            "Each model's requests let into Triton at once (the batch worth making running and "
            "queue_target_batches of it waiting), and the batch worth making, both computed from what "
            "Triton's statistics say each batch size costs a request.",
            [
                ("max by (model) (gateway_gate_limit)", "gate {{model}}"),
                ("max by (model) (gateway_gate_batch)", "batch worth making {{model}}"),
            ],
            "short",
            (0, 8, 12, 8),
        ),
        panel(
            "Waiting and shed",
            "Requests waiting for a slot now, and those refused 503 overloaded after the queue wait.",
            [
                ("sum(gateway_admission_queue)", "waiting"),
                (f"sum(rate(gateway_admission_shed_total[{RATE}]))", "shed /s"),
            ],
            "short",
            (12, 8, 12, 8),
        ),
        panel(
            "Mean wait for a slot",
            "Seconds a request spends in the gateway's queue before it is admitted or shed.",
            [
                (
                    f"sum(rate(gateway_admission_wait_seconds_total[{RATE}])) / clamp_min("
                    f"sum(rate(gateway_admission_admitted_total[{RATE}])) + "
                    f"sum(rate(gateway_admission_shed_total[{RATE}])), 1e-9)",
                    "mean wait",
                )
            ],
            "s",
            (0, 16, 12, 8),
        ),
        panel(
            "Slots by tier",
            "In-flight slots held by keys of each tier (the tiers' shares and priorities apply while "
            "keys contend).",
            [("sum by (tier) (gateway_inflight_by_tier)", "{{tier}}")],
            "short",
            (12, 16, 12, 8),
            stack=True,
        ),
        panel(
            "Triton queue time per request",
            "Seconds a request waits in Triton's queues, per model execution: what the autoscalers "
            "scale Triton on (past 20 ms, Triton is the bottleneck).",
            [
                (
                    f"sum(rate(nv_inference_queue_duration_us[{RATE}])) / "
                    f"clamp_min(sum(rate(nv_inference_request_success[{RATE}])), 0.001) / 1e6",
                    "queue per request",
                )
            ],
            "s",
            (0, 24, 24, 8),
        ),
    ]
    return dashboard(
        "triton-gateway-capacity",
        "Triton gateway: capacity",
        "The in-flight limit (each model's gate), its queue, the tiers' slots and the signals the autoscalers use.",
        panels,
        with_model=False,
    )


DASHBOARDS = {
    "gateway-overview.json": gateway_overview,
    "triton-models.json": triton_models,
    "latency-breakdown.json": latency_breakdown,
    "model-quality.json": model_quality,
    "capacity.json": capacity,
}


def render(build: Any) -> str:
    return json.dumps(build(), indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail when a committed file differs")
    args = parser.parse_args(argv)
    stale = []
    for name, build in DASHBOARDS.items():
        path = OUT / name
        text = render(build)
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            OUT.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path}")
    if stale:
        print(f"out of date: {', '.join(stale)}; run python deploy/grafana/generate.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
