"""Typed access to what the lifespan built: settings and the inference backend."""

from __future__ import annotations

from typing import Annotated, TypedDict

from fastapi import Depends, Request

from gateway.backend import InferenceBackend
from gateway.metrics import GatewayMetrics, TritonMetricsScraper
from gateway.settings import Settings


class GatewayState(TypedDict):
    """The lifespan state every request sees as ``request.state``."""

    settings: Settings
    backend: InferenceBackend
    metrics: GatewayMetrics
    triton_metrics: TritonMetricsScraper


def get_settings(request: Request) -> Settings:
    settings: Settings = request.state.settings
    return settings


def get_backend(request: Request) -> InferenceBackend:
    backend: InferenceBackend = request.state.backend
    return backend


def get_metrics(request: Request) -> GatewayMetrics:
    metrics: GatewayMetrics = request.state.metrics
    return metrics


def get_triton_metrics(request: Request) -> TritonMetricsScraper:
    scraper: TritonMetricsScraper = request.state.triton_metrics
    return scraper


def get_request_id(request: Request) -> str:
    request_id: str = request.state.request_id
    return request_id


SettingsDep = Annotated[Settings, Depends(get_settings)]
BackendDep = Annotated[InferenceBackend, Depends(get_backend)]
RequestIdDep = Annotated[str, Depends(get_request_id)]
MetricsDep = Annotated[GatewayMetrics, Depends(get_metrics)]
TritonMetricsDep = Annotated[TritonMetricsScraper, Depends(get_triton_metrics)]
