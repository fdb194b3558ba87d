"""The composition root: every service the doors share, built once, and the doors started
as peers (MLServer's ``server.py`` over its REST and gRPC servers is the model).

:class:`Runtime` is built from the settings (nothing network-bound at construction) and
run as an async context manager on the serving loop: it starts Triton's client behind
its breaker, the catalog, the shared state, the keys, the prediction log and drift, the
caller pipeline, readiness, exposure and the dispatcher, then the gRPC door (when
``GATEWAY_GRPC__PORT`` is set). The process (``serve``, ``local``: gateway.http.server's
``run_server``) runs the runtime and, inside it, the HTTP server over the app
(gateway.app), which reads the same :class:`Services`: the two doors are peers. An app
served without a running runtime (the tests' in-process servers) runs its own in its
lifespan. Stopping runs the other way: the HTTP server's drain, the gRPC door (its
grace), then what both used.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry

from gateway import __version__
from gateway.observe.drift import DriftMonitor, LocalDriftStore, Served, SharedDriftStore
from gateway.observe.metrics import CapacityCollector, GatewayMetrics, TritonMetricsScraper
from gateway.observe.predictionlog import PredictionLog, Sink, make_sink
from gateway.observe.tracing import Tracing
from gateway.periodic import Periodic
from gateway.serving.admission import Admission, build_admission
from gateway.serving.budget import BodyBudget
from gateway.serving.caller import CallerGate
from gateway.serving.catalog import Catalog
from gateway.serving.control import ModelControl, RoutingControl
from gateway.serving.dispatch import Dispatcher
from gateway.serving.exposure import Exposure
from gateway.serving.guard import GuardedBackend
from gateway.serving.observed import PredictionObserver
from gateway.serving.oipcall import OipCalls
from gateway.serving.plane import InferencePlane
from gateway.serving.queuegate import Statistics, StatisticsSource
from gateway.serving.readiness import Readiness
from gateway.serving.refusal import Refusals
from gateway.serving.rollout import RolloutRunner
from gateway.serving.workers import CheckWorkers
from gateway.settings import PredictionLogSettings, Settings
from gateway.shared.keyfiles import KeyRing
from gateway.shared.quota import QuotaKeeper
from gateway.shared.ratelimit import RateLimiter
from gateway.shared.routing import Routing
from gateway.shared.tokens import TokenVerifier
from gateway.triton.backend import InferenceBackend

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from gateway.rpc.service import FrontDoor
    from gateway.shared.store import SharedState

BackendFactory = Callable[[Settings, GatewayMetrics, Tracing], InferenceBackend]


def triton_backend(settings: Settings, metrics: GatewayMetrics, tracing: Tracing) -> InferenceBackend:
    """The transport to Triton: one channel, or with several replicas (a list, or a
    ``dns:///`` name under ``shortest_queue``) one each, placed per call
    (gateway.serving.placement)."""
    from gateway.serving.placement import Placement, endpoints, resolve_now, resolver
    from gateway.triton.client import TritonBackend

    # gRPC refuses messages over this size before they leave: the largest single call is
    # one image or one text request at the gateway-wide caps.
    max_send = max(settings.image.max_bytes, settings.max_text_body_bytes) + 64 * 1024
    triton = settings.triton
    resolve = resolver(triton.url) if triton.load_balancing == "shortest_queue" else None
    addresses = resolve_now(triton.url) if resolve is not None else endpoints(triton.url)
    if resolve is None and len(addresses) == 1:
        return TritonBackend(triton, metrics, tracing, max_send_bytes=max_send)

    def connect(address: str) -> InferenceBackend:
        one = triton.model_copy(update={"url": address, "load_balancing": "pick_first"})
        return TritonBackend(one, metrics, tracing, max_send_bytes=max_send)

    placement = Placement(
        addresses,
        connect,
        probe_interval=triton.probe_interval_seconds,
        probe_timeout=min(triton.probe_timeout_seconds, triton.probe_interval_seconds),
        resolve=resolve,
        round_robin=triton.load_balancing == "round_robin",
    )
    metrics.watch_replicas(placement.readings)
    return placement


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


@dataclass(frozen=True)
class Services:
    """What the doors share while the runtime runs."""

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
    key_ring: KeyRing | None
    quotas: QuotaKeeper
    readiness: Readiness
    exposure: Exposure
    gate: CallerGate
    budget: BodyBudget
    oip_calls: OipCalls


def _steps_of(catalog: Catalog, model: str) -> list[str]:
    """What Triton queues a model's requests in: an ensemble's steps, else the model."""
    entry = catalog.find(model)
    return [step.name for step in entry.steps] if entry is not None and entry.steps else [model]


def _statistics_of(backend: GuardedBackend) -> StatisticsSource | Callable[[], Awaitable[Statistics]]:
    """What the gate on Triton's queue reads: every replica's statistics when calls are
    placed across several (gateway.serving.placement), else the one Triton's."""
    from gateway.serving.placement import Placement

    if isinstance(backend.transport, Placement):
        return backend.transport.statistics_by_replica
    return backend


class Runtime:
    """The gateway's services and doors. What the HTTP middleware needs before the loop
    runs (metrics, admission, the caller pipeline, the body budget) is built at
    construction, without I/O; everything else when :meth:`running` starts."""

    def __init__(
        self,
        settings: Settings,
        backend_factory: BackendFactory | None = None,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.settings = settings
        self.make_backend = backend_factory or triton_backend
        self.metrics = GatewayMetrics(
            registry or CollectorRegistry(),
            merges_triton=bool(settings.triton.metrics_url),
            shares_state=settings.redis.url is not None,
        )
        self.tracing = Tracing(settings.tracing)
        self.admission = build_admission(settings.server)
        # refusing before the body, for every door (the HTTP head's, the routes', gRPC's)
        self.refusals = Refusals(self.admission, settings.server.shed_from_headers)
        # one budget of body bytes for every door
        self.budget = BodyBudget(
            settings.server.max_body_bytes_in_flight, settings.server.retry_after_seconds
        )
        self.metrics.registry.register(CapacityCollector(self.admission.reading, sorted(settings.tiers)))
        self.metrics.build.info(
            {
                "version": __version__,
                "triton_url_kind": _url_kind(settings.triton.url),
                "image_model": settings.image_model,
                "text_model": settings.text_model,
            }
        )
        # Read at build time: a keys file that does not parse refuses to start. Watched while
        # running: a rotated file applies without a restart.
        keep = settings.auth.on_invalid_keys_file == "keep"
        self.api_keys = (
            KeyRing(settings.auth.keys_file, "api", self.metrics, keep, settings.tiers)
            if settings.auth.keys_file
            else None
        )
        self.admin_keys = (
            KeyRing(settings.admin.keys_file, "admin", self.metrics, keep)
            if settings.admin.keys_file
            else None
        )
        self.limiter = RateLimiter(None, settings.redis, self.metrics)
        self.quotas = QuotaKeeper(None, settings.redis, self.metrics)
        self.routing = Routing(settings.default_pins())
        # OpenID Connect providers' tokens beside the keys (their key sets read when running)
        self.tokens = (
            TokenVerifier(
                settings.auth.oidc,
                settings.tiers,
                settings.auth.jwks_refresh_seconds,
                settings.auth.jwks_min_refresh_seconds,
            )
            if settings.auth.oidc
            else None
        )
        self.gate = CallerGate(
            self.api_keys,
            self.limiter,
            self.quotas,
            self.metrics,
            settings.tiers,
            self.tokens,
            settings.auth.unlisted_certificates,
        )
        self.services: Services | None = None  # while running

    @asynccontextmanager
    async def running(self) -> AsyncIterator[Services]:
        """The services started (network clients belong to the running loop), the gRPC
        door listening; all stopped on the way out."""
        settings, metrics, tracing = self.settings, self.metrics, self.tracing
        async with AsyncExitStack() as stack:
            tracing.start()
            # flushes spans, bounded by the export timeout
            stack.push_async_callback(asyncio.to_thread, tracing.shutdown)
            # the transport, behind the serving side's breaker, probe and signature cache
            backend = GuardedBackend(self.make_backend(settings, metrics, tracing), settings.triton, metrics)
            stack.push_async_callback(backend.close)
            scraper = TritonMetricsScraper(
                settings.triton.metrics_url, settings.triton.metrics_timeout_seconds
            )
            stack.push_async_callback(scraper.close)
            workers = CheckWorkers(settings.check_threads)
            store = _shared_state(settings, metrics)
            if store is not None:
                stack.push_async_callback(store.close)
            for shared in (self.limiter, self.quotas, self.routing):
                shared.attach(store)
            stack.push_async_callback(self.routing.stop)
            if store is not None:
                # The shared pins before the first request (a restarted replica keeps them);
                # the read-back every poll period keeps the store's health, and its gauge,
                # true with no traffic at all.
                await self.routing.sync()
                self.routing.start(settings.redis.routing_poll_seconds)
            for ring in (self.api_keys, self.admin_keys):
                if ring is not None:
                    ring.start(settings.auth.reload_seconds)
                    stack.push_async_callback(ring.stop)
            if self.tokens is not None:
                # the providers' key sets before the first request: never read on its path
                await self.tokens.start()
                stack.push_async_callback(self.tokens.stop)
            catalog = Catalog(
                settings, backend, self.routing, on_refresh=metrics.catalog_refreshed.set_to_current_time
            )
            rollouts = RolloutRunner(self.routing, metrics, self.admission, settings.shadow_in_flight)
            # The first read before serving (bounded by the health timeout; a Triton that is
            # not up yet is followed by the periodic refresh).
            await catalog.refresh()
            catalog.start()
            stack.push_async_callback(catalog.stop)
            gate = self.admission.gate
            if gate is not None:  # Triton's queue, read while requests are sent
                statistics = _statistics_of(backend)  # chosen once, read every interval
                reader = Periodic(
                    "triton queue statistics",
                    gate.settings.interval_seconds,
                    lambda: gate.read(statistics, lambda model: _steps_of(catalog, model)),
                    logger,
                )
                reader.start()
                stack.push_async_callback(reader.stop)
            stack.push_async_callback(rollouts.stop)
            plane = InferencePlane(backend, self.admission, tracing, metrics, workers)
            prediction_log = PredictionLog(settings.prediction_log, metrics, _prediction_sink)
            prediction_log.start()
            stack.push_async_callback(prediction_log.stop)
            drift = DriftMonitor(
                settings.drift,
                metrics,
                LocalDriftStore(settings.drift.reference_dir) if store is None else SharedDriftStore(store),
                lambda: [Served(e.name, e.versions, e.reference) for e in catalog.entries()],
            )
            drift.start()
            stack.push_async_callback(drift.stop)
            # one allow-list of the non-classifier models the doors serve
            allow_listed = [*settings.v2_models, *settings.openai.embedding_models]
            exposure = Exposure(catalog, backend, allow_listed)
            observer = PredictionObserver(metrics, settings.predictions, drift)
            dispatcher = Dispatcher(catalog, plane, rollouts, exposure, observer, self.refusals, self.gate)
            # the models /v2 health names: the defaults and GATEWAY_V2_MODELS (an embedding
            # model is served, but decides readiness no more than a non-default classifier)
            readiness = Readiness(
                catalog,
                backend,
                self.admission,
                frozenset(settings.v2_models),
                settings.triton.probe_cache_seconds,
            )
            services = Services(
                settings=settings,
                backend=backend,
                metrics=metrics,
                triton_metrics=scraper,
                workers=workers,
                admission=self.admission,
                tracing=tracing,
                catalog=catalog,
                plane=plane,
                rollouts=rollouts,
                dispatcher=dispatcher,
                model_control=ModelControl(
                    backend, catalog, settle_seconds=settings.triton.load_timeout_seconds
                ),
                routing_control=RoutingControl(backend, catalog, rollouts),
                prediction_log=prediction_log,
                drift=drift,
                key_ring=self.api_keys,
                quotas=self.quotas,
                readiness=readiness,
                exposure=exposure,
                gate=self.gate,
                budget=self.budget,
                oip_calls=OipCalls(dispatcher, prediction_log, settings),
            )
            if settings.grpc.port:
                stack.push_async_callback((await self._grpc_door(services)).stop, settings.grpc.grace_seconds)
            self.services = services
            try:
                yield services
            finally:
                self.services = None

    @staticmethod
    async def _grpc_door(services: Services) -> FrontDoor:
        """The gRPC door, a peer of the HTTP app on the same services."""
        from gateway.rpc.door import InferenceDoor
        from gateway.rpc.service import DoorLimits, serve
        from gateway.shared.certificates import TrustedProxies

        settings = services.settings
        door = InferenceDoor(
            settings,
            services.dispatcher,
            services.exposure,
            services.backend,
            services.metrics,
            services.tracing,
            services.gate,
            services.budget,
            services.readiness,
            services.oip_calls,
        )
        return await serve(
            door,
            settings.grpc_host,
            settings.grpc.port,
            DoorLimits(
                max_message_bytes=door.max_message_bytes,
                max_calls=settings.grpc.max_concurrent_calls,
                max_streams=settings.grpc.max_streams_per_connection,
                max_connections=settings.grpc.max_connections,
                max_health_watches=settings.grpc.max_health_watches,
                handshake_seconds=settings.server.header_timeout_seconds,
                idle_seconds=settings.grpc.idle_seconds,
                age_seconds=settings.grpc.max_connection_age_seconds,
                age_grace_seconds=settings.triton.timeout_seconds,
                compressed_messages=settings.grpc.compressed_messages,
            ),
            tls=_door_tls(settings),
            proxies=TrustedProxies(settings.auth.trusted_proxies),
        )


def _door_tls(settings: Settings) -> tuple[bytes, bytes, bytes | None] | None:
    """The gRPC door's TLS material (PEM), read at start: a missing file refuses to start."""
    grpc = settings.grpc
    if grpc.tls_cert_file is None or grpc.tls_key_file is None:
        return None
    client_ca = grpc.client_ca_file.read_bytes() if grpc.client_ca_file is not None else None
    return grpc.tls_cert_file.read_bytes(), grpc.tls_key_file.read_bytes(), client_ca
