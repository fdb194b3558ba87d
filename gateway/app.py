"""create_app(settings) -> FastAPI: the HTTP door over the runtime's services (gateway.runtime):
its lifespan, middleware, routes, error handlers and docs."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import fields
from typing import Any, cast

from fastapi import FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.openapi.utils import get_openapi
from prometheus_client import CollectorRegistry

from gateway import __version__
from gateway.http.auth import AdminGate, AuthMiddleware, TrustedProxies
from gateway.http.budget import BodyBudgetMiddleware
from gateway.http.compression import OipCompression
from gateway.http.dependencies import GatewayState
from gateway.http.docs import install_docs
from gateway.http.fastlane import FastLane
from gateway.http.headshed import HeadShed
from gateway.http.problems import install_error_handlers
from gateway.http.routes import admin as admin_routes
from gateway.http.routes import classify, health, metrics_route, oip
from gateway.http.routes import openai as openai_routes
from gateway.http.schemas import Problem, classify_json_model
from gateway.http.telemetry import TelemetryMiddleware
from gateway.runtime import BackendFactory, Runtime, Services
from gateway.settings import Settings

# The route modules every gateway serves (the admin routes only with admin keys).
SERVED = (classify, health, metrics_route, oip, openai_routes)

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


def _state(services: Services) -> GatewayState:
    """Every service, by its name, in each request's state."""
    return cast(GatewayState, {f.name: getattr(services, f.name) for f in fields(services)})


def create_app(
    settings: Settings,
    backend_factory: BackendFactory | None = None,
    registry: CollectorRegistry | None = None,
    runtime: Runtime | None = None,
) -> FastAPI:
    """The HTTP door over ``runtime``'s services (a runtime of its own by default, built
    from ``settings``; ``backend_factory`` replaces Triton in tests, and metrics go to
    ``registry``, a fresh one by default, never the global registry). The process runs
    the runtime around the HTTP server (gateway.http.server.run_server); an app served
    without it running runs it in its lifespan."""
    runtime = runtime or Runtime(settings, backend_factory, registry)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[GatewayState]:
        if runtime.services is not None:  # the process runs it, beside this app
            yield _state(runtime.services)
            return
        async with runtime.running() as services:
            yield _state(services)

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
    metrics, admission = runtime.metrics, runtime.admission
    admin_keys = runtime.admin_keys
    # The server drains through it at SIGTERM (gateway.http.server).
    app.state.admission = admission
    # The HTTP protocol's own refusals (a head too large), counted as every refusal is.
    app.state.count_rejection = lambda slug: metrics.rejections.labels(slug).inc()
    # Added last = outermost: the request id and telemetry wrap everything else.
    # Innermost: the classify routes answered beneath the framework (gateway.http.fastlane).
    app.add_middleware(FastLane, routes=classify.router.routes, handler=classify.classify_request)
    app.add_middleware(OipCompression)  # compresses /v2 answers only
    proxies = TrustedProxies(settings.auth.trusted_proxies)
    if runtime.gate.enabled or settings.auth.trusted_proxies:
        # The caller pipeline, inside the request id and telemetry layer, so refusals are
        # counted and logged.
        app.add_middleware(
            AuthMiddleware,
            gate=runtime.gate,
            metrics=metrics,
            protect_metrics=settings.auth.protect_metrics,
            protect_docs=settings.auth.protect_docs,
            proxies=proxies,
            metrics_readers=settings.auth.metrics_readers,
        )
    if admin_keys is not None:
        app.add_middleware(
            AdminGate, keys=admin_keys, metrics=metrics, body_seconds=settings.server.body_timeout_seconds
        )
    # Inside telemetry (its refusals are counted and logged), outside everything that reads a body.
    app.add_middleware(BodyBudgetMiddleware, budget=runtime.budget)
    app.add_middleware(
        TelemetryMiddleware,
        metrics=metrics,
        tracing=runtime.tracing,
        admission=admission,
        # the served routes, to name the one a request refused before the router asked for
        routes=[route for module in SERVED for route in module.router.routes],
    )
    # A request the classify lane takes, refused from its head in the HTTP protocol when
    # its route would (gateway.http.headshed; the server reads it: gateway.http.server).
    app.state.head_shed = HeadShed.build(
        settings, runtime.refusals, runtime.gate, metrics, runtime.tracing, classify.router.routes, proxies
    )
    if settings.auth.cors_origins:
        app.add_middleware(
            CORSMiddleware,
            allow_origins=settings.auth.cors_origins,
            allow_methods=["GET", "POST"],
            allow_headers=["Authorization", "X-API-Key", "Content-Type", "X-Request-ID"],
            expose_headers=["X-Request-ID", "Retry-After", "RateLimit", "RateLimit-Policy"],
        )
    install_error_handlers(app, metrics)
    for module in SERVED:
        app.include_router(module.router)
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
