"""Typed access to what the lifespan built: settings, the inference backend and helpers.

The getters are ``async def``: they do no I/O, and FastAPI would run a plain ``def``
dependency in the thread pool (a thread hop per dependency per request)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from time import perf_counter
from typing import Annotated, Any, NotRequired, TypedDict, cast

from fastapi import Depends, Request

from gateway.observe.drift import DriftMonitor
from gateway.observe.metrics import GatewayMetrics, TritonMetricsScraper
from gateway.observe.predictionlog import PredictionLog
from gateway.observe.tracing import Tracing
from gateway.serving.admission import Admission
from gateway.serving.budget import BodyBudget
from gateway.serving.call import Call, bind
from gateway.serving.caller import Caller, CallerGate
from gateway.serving.catalog import Catalog
from gateway.serving.control import ModelControl, RoutingControl
from gateway.serving.dispatch import Dispatcher
from gateway.serving.exposure import Exposure
from gateway.serving.oipcall import OipCalls
from gateway.serving.plane import InferencePlane
from gateway.serving.readiness import Readiness
from gateway.serving.rollout import RolloutRunner
from gateway.serving.workers import CheckWorkers
from gateway.settings import Settings
from gateway.shared.keyfiles import KeyRing
from gateway.shared.quota import QuotaKeeper
from gateway.triton.backend import InferenceBackend


class GatewayState(TypedDict):
    """The lifespan state every request sees as ``request.state``."""

    settings: Settings
    backend: InferenceBackend
    metrics: GatewayMetrics
    triton_metrics: TritonMetricsScraper
    workers: CheckWorkers
    admission: Admission
    tracing: Tracing
    catalog: Catalog
    plane: InferencePlane
    rollouts: RolloutRunner
    dispatcher: Dispatcher
    model_control: ModelControl
    routing_control: RoutingControl
    prediction_log: PredictionLog
    drift: DriftMonitor
    key_ring: KeyRing | None  # the API keys (None: keys are off)
    quotas: QuotaKeeper
    readiness: Readiness
    exposure: Exposure
    gate: CallerGate
    budget: BodyBudget
    oip_calls: OipCalls
    # per request: set by the telemetry and caller middlewares, and the route
    request_id: NotRequired[str]
    caller: NotRequired[Caller]  # who called (gateway.serving.caller)
    model: NotRequired[str]


def gateway_state(request: Request) -> GatewayState:
    """The request's state as one typed dict, without dependency resolution (for the hot
    path; routes elsewhere use the ``*Dep`` annotations below)."""
    return cast(GatewayState, request.scope["state"])


def new_call(request: Request, state: GatewayState) -> Call:
    """The serving side's view of one request: its caller (gateway.serving.caller: id,
    key, tenant), its start, who a canary assignment sticks to (the key's id, else the
    ``X-Rollout-Key`` header) and the state its model label goes to."""
    caller = state["caller"]
    return bind(Call(caller.request_id, perf_counter(), labels=state), caller, request.scope["headers"])


def _from_state(name: str) -> Callable[[Request], Awaitable[Any]]:
    """A dependency returning ``request.state.<name>`` (what the lifespan or the request-id
    middleware put there); ``async`` so FastAPI runs it on the loop, not in a thread."""

    async def get(request: Request) -> Any:
        return getattr(request.state, name)

    get.__name__ = f"get_{name}"
    return get


SettingsDep = Annotated[Settings, Depends(_from_state("settings"))]
BackendDep = Annotated[InferenceBackend, Depends(_from_state("backend"))]
RequestIdDep = Annotated[str, Depends(_from_state("request_id"))]
MetricsDep = Annotated[GatewayMetrics, Depends(_from_state("metrics"))]
WorkersDep = Annotated[CheckWorkers, Depends(_from_state("workers"))]
AdmissionDep = Annotated[Admission, Depends(_from_state("admission"))]
TracingDep = Annotated[Tracing, Depends(_from_state("tracing"))]
TritonMetricsDep = Annotated[TritonMetricsScraper, Depends(_from_state("triton_metrics"))]
CatalogDep = Annotated[Catalog, Depends(_from_state("catalog"))]
RolloutsDep = Annotated[RolloutRunner, Depends(_from_state("rollouts"))]
PlaneDep = Annotated[InferencePlane, Depends(_from_state("plane"))]
DispatcherDep = Annotated[Dispatcher, Depends(_from_state("dispatcher"))]
ModelControlDep = Annotated[ModelControl, Depends(_from_state("model_control"))]
RoutingControlDep = Annotated[RoutingControl, Depends(_from_state("routing_control"))]
DriftDep = Annotated[DriftMonitor, Depends(_from_state("drift"))]
KeyRingDep = Annotated["KeyRing | None", Depends(_from_state("key_ring"))]
QuotasDep = Annotated[QuotaKeeper, Depends(_from_state("quotas"))]
ReadinessDep = Annotated[Readiness, Depends(_from_state("readiness"))]
ExposureDep = Annotated[Exposure, Depends(_from_state("exposure"))]
CallerDep = Annotated[Caller, Depends(_from_state("caller"))]
