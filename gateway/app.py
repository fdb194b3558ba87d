"""create_app(settings) -> FastAPI: lifespan, middleware, routes, error handlers, docs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.openapi.utils import get_openapi
from prometheus_client import CollectorRegistry

from gateway import __version__
from gateway.http.auth import AdminGate, AuthMiddleware
from gateway.http.budget import BodyBudgetMiddleware
from gateway.http.compression import OipCompression
from gateway.http.dependencies import GatewayState
from gateway.http.docs import install_docs
from gateway.http.fastlane import FastLane
from gateway.http.problems import install_error_handlers
from gateway.http.routes import admin as admin_routes
from gateway.http.routes import classify, health, metrics_route, oip
from gateway.http.routes import openai as openai_routes
from gateway.http.schemas import Problem, classify_json_model
from gateway.http.telemetry import TelemetryMiddleware
from gateway.observe.drift import DriftMonitor, LocalDriftStore, Served, SharedDriftStore
from gateway.observe.metrics import CapacityCollector, GatewayMetrics, TritonMetricsScraper
from gateway.observe.predictionlog import PredictionLog, Sink, make_sink
from gateway.observe.tracing import Tracing
from gateway.serving.admission import build_admission
from gateway.serving.budget import BodyBudget
from gateway.serving.catalog import Catalog
from gateway.serving.control import ModelControl, RoutingControl
from gateway.serving.dispatch import Dispatcher
from gateway.serving.guard import GuardedBackend
from gateway.serving.heap import keep_heap
from gateway.serving.plane import InferencePlane
from gateway.serving.rollout import RolloutRunner
from gateway.serving.workers import CheckWorkers
from gateway.settings import PredictionLogSettings, Settings
from gateway.shared.keyfiles import KeyRing
from gateway.shared.quota import QuotaKeeper
from gateway.shared.ratelimit import RateLimiter
from gateway.shared.routing import Routing
from gateway.triton.backend import InferenceBackend

if TYPE_CHECKING:
    from gateway.shared.store import SharedState

BackendFactory = Callable[[Settings, GatewayMetrics, Tracing], InferenceBackend]

DESCRIPTION = """
A validating front door for NVIDIA Triton Inference Server.

Every classifier Triton serves (a model whose configuration has a `gateway_task`) is
in the catalog (`GET /models`) and answers at `POST /models/{model}/classify`;
`POST /classify` uses the default model of each input kind. Every input is checked
cheaply (magic bytes, sizes, header dimensions) against what the model takes before
it reaches Triton, then runs through its Triton ensemble (preprocess -> model ->
postprocess) over gRPC. Errors are RFC 9457 `application/problem+json`; every
response carries `X-Request-ID`.
"""


def _triton_backend(settings: Settings, metrics: GatewayMetrics, tracing: Tracing) -> InferenceBackend:
    from gateway.triton.client import TritonBackend

    # gRPC refuses messages over this size before they leave: the largest single call is
    # one image or one text request at the gateway-wide caps.
    max_send = max(settings.image.max_bytes, settings.max_text_body_bytes) + 64 * 1024
    return TritonBackend(settings.triton, metrics, tracing, max_send_bytes=max_send)


def _shared_state(settings: Settings, metrics: GatewayMetrics) -> SharedState | None:
    if settings.redis.url is None:
        return None
    from gateway.shared.store import SharedState

    gauge = metrics.shared_state_up
    return SharedState(
        settings.redis, on_health=None if gauge is None else lambda up: gauge.set(1 if up else 0)
    )


def _prediction_sink(settings: PredictionLogSettings) -> Sink:
    """The prediction log's sink: a Redis Stream per model for redis(s)://, else the
    observe layer's own (HTTP CloudEvents, file)."""
    url = settings.url.get_secret_value()
    if url.startswith(("redis://", "rediss://")):
        from gateway.shared.streams import RedisStreamSink

        return RedisStreamSink(
            url, settings.stream_prefix, settings.max_stream_length, settings.timeout_seconds
        )
    return make_sink(settings)


def _url_kind(url: str) -> str:
    host = url.rsplit(":", 1)[0].strip("[]")
    return "loopback" if host in ("127.0.0.1", "localhost", "::1") else "remote"


def create_app(
    settings: Settings,
    backend_factory: BackendFactory | None = None,
    registry: CollectorRegistry | None = None,
) -> FastAPI:
    """Build the gateway. ``backend_factory`` replaces Triton (tests); it runs in the lifespan.
    Metrics go to ``registry`` (a fresh one by default, never the global registry)."""
    make_backend = backend_factory or _triton_backend
    metrics = GatewayMetrics(
        registry or CollectorRegistry(),
        merges_triton=bool(settings.triton.metrics_url),
        shares_state=settings.redis.url is not None,
    )
    tracing = Tracing(settings.tracing)
    admission = build_admission(settings.server)
    # one budget of body bytes for every door
    budget = BodyBudget(settings.server.max_body_bytes_in_flight, settings.server.retry_after_seconds)
    metrics.registry.register(CapacityCollector(admission.reading, sorted(settings.tiers)))
    metrics.build.info(
        {
            "version": __version__,
            "triton_url_kind": _url_kind(settings.triton.url),
            "image_model": settings.image_model,
            "text_model": settings.text_model,
        }
    )

    # Read at build time: a keys file that does not parse refuses to start. Watched while
    # serving (the lifespan starts the watch): a rotated file applies without a restart.
    keep = settings.auth.on_invalid_keys_file == "keep"
    api_keys = (
        KeyRing(settings.auth.keys_file, "api", metrics, keep, settings.tiers)
        if settings.auth.keys_file
        else None
    )
    admin_keys = (
        KeyRing(settings.admin.keys_file, "admin", metrics, keep) if settings.admin.keys_file else None
    )
    limiter = RateLimiter(None, settings.redis, metrics)
    quotas = QuotaKeeper(None, settings.redis, metrics)
    routing = Routing(settings.default_pins())

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[GatewayState]:
        # Network clients belong to the server's event loop: built here, not at import.
        keep_heap(settings.server.heap_keep_bytes)
        tracing.start()
        # the transport, behind the serving side's breaker, probe and signature cache
        backend = GuardedBackend(make_backend(settings, metrics, tracing), settings.triton, metrics)
        scraper = TritonMetricsScraper(settings.triton.metrics_url, settings.triton.metrics_timeout_seconds)
        workers = CheckWorkers(settings.check_threads)
        store = _shared_state(settings, metrics)
        limiter.attach(store)
        quotas.attach(store)
        routing.attach(store)
        if store is not None:
            # The shared pins before the first request (a restarted replica keeps them);
            # the read-back every poll period keeps the store's health, and its gauge,
            # true with no traffic at all.
            await routing.sync()
            routing.start(settings.redis.routing_poll_seconds)
        rings = [ring for ring in (api_keys, admin_keys) if ring is not None]
        for ring in rings:
            ring.start(settings.auth.reload_seconds)
        catalog = Catalog(
            settings, backend, routing, on_refresh=metrics.catalog_refreshed.set_to_current_time
        )
        rollouts = RolloutRunner(routing, metrics, admission, settings.shadow_in_flight)
        # The first read before serving (bounded by the health timeout; a Triton that is
        # not up yet is followed by the periodic refresh).
        await catalog.refresh()
        catalog.start()
        plane = InferencePlane(backend, admission, tracing, metrics, workers)
        prediction_log = PredictionLog(settings.prediction_log, metrics, _prediction_sink)
        prediction_log.start()
        drift = DriftMonitor(
            settings.drift,
            metrics,
            LocalDriftStore(settings.drift.reference_dir) if store is None else SharedDriftStore(store),
            lambda: [Served(e.name, e.versions, e.reference) for e in catalog.entries()],
        )
        drift.start()
        dispatcher = Dispatcher(
            catalog,
            plane,
            rollouts,
            settings.v2_models,
            settings.triton.probe_cache_seconds,
            settings.predictions,
            drift,
            quotas,
        )
        grpc_door = None
        if settings.grpc.port:
            from gateway.rpc.door import InferenceDoor
            from gateway.triton.frontdoor import serve as serve_grpc

            door = InferenceDoor(settings, dispatcher, backend, metrics, tracing, api_keys, limiter, budget)
            grpc_door = await serve_grpc(
                door,
                settings.grpc_host,
                settings.grpc.port,
                door.max_message_bytes,
                settings.grpc.max_concurrent_calls,
                settings.grpc.max_streams_per_connection,
            )
        try:
            yield GatewayState(
                settings=settings,
                backend=backend,
                metrics=metrics,
                triton_metrics=scraper,
                workers=workers,
                admission=admission,
                tracing=tracing,
                catalog=catalog,
                plane=plane,
                rollouts=rollouts,
                dispatcher=dispatcher,
                model_control=ModelControl(backend, catalog),
                routing_control=RoutingControl(backend, catalog, rollouts),
                prediction_log=prediction_log,
                drift=drift,
                key_ring=api_keys,
                quotas=quotas,
            )
        finally:
            if grpc_door is not None:
                await grpc_door.stop(settings.grpc.grace_seconds)
            await drift.stop()
            await prediction_log.stop()
            await rollouts.stop()
            await catalog.stop()
            await routing.stop()
            for ring in rings:
                await ring.stop()
            if store is not None:
                await store.close()
            await scraper.close()
            await backend.close()
            await asyncio.to_thread(tracing.shutdown)  # flushes spans, bounded by the export timeout

    openapi_url = "/openapi.json" if settings.docs_enabled else None
    app = FastAPI(
        title="triton-gateway",
        version=__version__,
        description=DESCRIPTION,
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=openapi_url,
        # The gateway's own telemetry (gateway.http.telemetry, gateway.observe.tracing) is the
        # one: FastAPI's native OpenTelemetry would look its providers up on every request
        # (environment reads) and, with a global provider, record every request twice.
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    # The server drains through it at SIGTERM (gateway.http.server).
    app.state.admission = admission
    # Added last = outermost: the request id and telemetry wrap everything else.
    # Innermost: the classify routes answered beneath the framework (gateway.http.fastlane).
    app.add_middleware(FastLane, routes=classify.router.routes)
    app.add_middleware(OipCompression)  # compresses /v2 answers only
    if api_keys is not None:
        # Inside the request id and telemetry layer, so refusals are counted and logged.
        app.add_middleware(
            AuthMiddleware,
            keys=api_keys,
            limiter=limiter,
            metrics=metrics,
            protect_metrics=settings.auth.protect_metrics,
            protect_docs=settings.auth.protect_docs,
            tiers=settings.tiers,
            quotas=quotas,
        )
    if admin_keys is not None:
        app.add_middleware(
            AdminGate, keys=admin_keys, metrics=metrics, body_seconds=settings.server.body_timeout_seconds
        )
    # Inside telemetry (its refusals are counted and logged), outside everything that reads a body.
    app.add_middleware(
        BodyBudgetMiddleware,
        budget=budget,
    )
    app.add_middleware(TelemetryMiddleware, metrics=metrics, tracing=tracing, admission=admission)
    if settings.auth.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.auth.cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "X-API-Key", "Content-Type", "X-Request-ID"],
            expose_headers=["X-Request-ID", "Retry-After", "RateLimit", "RateLimit-Policy"],
        )
    install_error_handlers(app, metrics)
    app.include_router(classify.router)
    app.include_router(health.router)
    app.include_router(metrics_route.router)
    app.include_router(oip.router)
    app.include_router(openai_routes.router)
    app.state.admin_included = admin_keys is not None
    if admin_keys is not None:
        app.state.admin_keys = admin_keys
        # never in the served document: whoever reaches the port learns nothing of /admin
        app.include_router(admin_routes.router, include_in_schema=False)
    if openapi_url is not None:
        install_docs(app, openapi_url)
        app.openapi = _openapi_with_components(app, settings)  # type: ignore[method-assign]
    return app


def openapi_document(app: FastAPI, settings: Settings, *, admin: bool = False) -> dict[str, Any]:
    """FastAPI's schema plus the models referenced only from hand-written request/response
    specs; the ``/admin`` routes only with ``admin`` (the operators' reference, not the
    document the gateway serves to whoever reaches its port)."""
    routes = [*app.routes, *(admin_routes.router.routes if admin and app.state.admin_included else [])]
    schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=routes)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    request_model = classify_json_model(**settings.list_caps())
    for model in (Problem, request_model):
        components[model.__name__] = model.model_json_schema(ref_template="#/components/schemas/{model}")
    return schema


def _openapi_with_components(app: FastAPI, settings: Settings) -> Callable[[], dict[str, Any]]:
    """The served document (:func:`openapi_document` without the admin routes), built once."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = openapi_document(app, settings)
        return app.openapi_schema

    return openapi
