"""GET /metrics: the gateway's metrics and Triton's, in one Prometheus exposition."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import Response

from gateway.http.dependencies import CatalogDep, MetricsDep, ReadinessDep, TritonMetricsDep
from gateway.http.problems import problem_responses
from gateway.observe.metrics import EXPOSITION_CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE

router = APIRouter(tags=["health"])


@router.get(
    "/metrics",
    summary="Prometheus metrics: gateway_* and, when Triton's endpoint answers, Triton's nv_*",
    response_class=Response,
    responses={
        200: {
            "content": {EXPOSITION_CONTENT_TYPE: {}, OPENMETRICS_CONTENT_TYPE: {}},
            "description": "Prometheus text format 0.0.4, or OpenMetrics 1.0 (with exemplars: trace "
            "ids on the request-latency histogram) when the Accept header asks for it.",
        },
        **problem_responses(401, 403),
    },
)
async def metrics(
    request: Request,
    catalog: CatalogDep,
    readiness: ReadinessDep,
    gateway_metrics: MetricsDep,
    scraper: TritonMetricsDep,
) -> Response:
    triton, statuses = await asyncio.gather(scraper.fetch(), readiness.served_statuses())
    if gateway_metrics.triton_metrics_up is not None:
        gateway_metrics.triton_metrics_up.set(1 if triton else 0)
    # The defaults as Triton answers now; the rest of the catalog as last read (a model
    # gone from it loses its series, so the label stays bounded by the catalog).
    ready = {entry.name: entry.ready for entry in catalog.entries()}
    ready.update({status.name: status.ready for status in statuses})
    gateway_metrics.model_ready.clear()
    for name, is_ready in ready.items():
        gateway_metrics.model_ready.labels(model=name).set(1 if is_ready else 0)
    body, media_type = gateway_metrics.exposition(triton, request.headers.get("accept", ""))
    return Response(body, media_type=media_type)
