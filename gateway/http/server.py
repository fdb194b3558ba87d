"""How the gateway runs under uvicorn: limits, timeouts, and a drain on SIGTERM.

- ``server_config`` builds the one uvicorn configuration every entry point uses: no
  ``server`` banner, a connection cap (uvicorn's ``limit_concurrency``, the last
  backstop), keep-alive and graceful-shutdown timeouts from the settings, and an HTTP
  protocol that closes connections whose request head does not arrive in time
  (uvicorn has no such timeout: 500 silent sockets would stay open forever).
- With ``admin.port`` set, the gateway listens on two sockets: ``/admin`` is answered on
  the admin listener only, and everything else on the main one only (404 elsewhere), so
  a firewall, a Service or a loopback bind keeps model control private.
- Each listener accepts every connection waiting when it finds a queue
  (gateway.http.listener), not one per turn of the loop as libuv does under uvloop.
- ``GatewayServer`` turns the first SIGTERM/SIGINT into a drain: ``/readyz`` answers 503
  at once; after the drain delay (0 s unless set: the time a load balancer's health
  checks need to take the replica out) new inference requests answer 503 too, requests
  in flight finish (up to the grace period), and only then does uvicorn stop listening
  and exit. A second signal exits now.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractAsyncContextManager, contextmanager
from types import FrameType
from typing import Any

import uvicorn
from fastapi import FastAPI
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.config import STARTUP_FAILURE

from gateway.errors import NotFoundError
from gateway.http.addresses import AddressConnections
from gateway.http.listener import Listener, bind
from gateway.http.paths import ADMIN_PREFIX
from gateway.http.problems import problem_response
from gateway.http.protocol import HeaderTimeoutProtocol
from gateway.observe.logs import flush_logs
from gateway.serving.admission import Admission
from gateway.serving.collector import freeze_startup
from gateway.serving.heap import keep_heap
from gateway.settings import Settings

logger = logging.getLogger("gateway.server")

BACKLOG = 2048  # connections the kernel holds until accepted (uvicorn's default)


def split_by_listener(app: ASGIApp, admin_port: int) -> ASGIApp:
    """``/admin`` on the admin listener only, the rest on the main listener only."""

    async def split(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            on_admin = scope.get("server", ("", 0))[1] == admin_port
            if on_admin != scope["path"].startswith(ADMIN_PREFIX):
                error = NotFoundError("there is no such route on this listener")
                await problem_response(error, Request(scope))(scope, receive, send)
                return
        await app(scope, receive, send)

    return split


def listen_sockets(settings: Settings, host: str, port: int) -> list[socket.socket] | None:
    """The main and the admin listeners when the admin surface has a port of its own;
    None: the server binds ``host:port`` itself."""
    admin_port = settings.admin_listener_port
    if admin_port is None:
        return None
    if admin_port == port:
        raise ValueError("the admin port must differ from the main port")
    return [
        bind(address, number, BACKLOG)
        for address, number in ((host, port), (settings.admin.host, admin_port))
    ]


def _uncounted(slug: str) -> None:
    return None


def server_config(app: FastAPI, settings: Settings, host: str, port: int) -> uvicorn.Config:
    """The uvicorn configuration of the gateway (used by serve, local and the tests)."""
    protocol = type(
        "GatewayHttpProtocol",
        (HeaderTimeoutProtocol,),
        {
            "header_timeout": settings.server.header_timeout_seconds,
            "linger_seconds": settings.server.linger_seconds,
            "send_seconds": settings.server.send_timeout_seconds,
            "max_age_seconds": settings.server.max_connection_age_seconds,
            "age_grace_seconds": settings.triton.timeout_seconds,
            "linger_bytes": settings.max_json_body_bytes,
            "max_head_bytes": settings.server.max_head_bytes,
            "min_chunk_bytes": settings.server.min_chunk_bytes,
            "max_pipelined": settings.server.max_pipelined,
            "max_headers": settings.server.max_headers,
            "head_shed": getattr(app.state, "head_shed", None),
            "addresses": AddressConnections(settings.server.max_connections_per_address),
            "counted": staticmethod(getattr(app.state, "count_rejection", _uncounted)),
        },
    )
    asgi: ASGIApp = app
    if settings.admin_listener_port is not None:
        asgi = split_by_listener(app, settings.admin_listener_port)
    return uvicorn.Config(
        asgi,
        host=host,
        port=port,
        http=protocol,
        ws="none",  # no WebSocket route: an upgrade offer is served as HTTP/1.1 (gateway.http.protocol)
        loop=settings.server.event_loop,
        log_config=None,
        access_log=False,  # the gateway writes its own access log
        server_header=False,
        # The gateway reads no client address: no X-Forwarded-* rewriting layer per request.
        proxy_headers=False,
        limit_concurrency=settings.server.max_connections,
        timeout_keep_alive=int(max(1, settings.server.keep_alive_seconds)),
        # After the drain, only stragglers (e.g. slow uploads) are left.
        timeout_graceful_shutdown=5,
        backlog=BACKLOG,
    )


class GatewayServer(uvicorn.Server):
    """uvicorn's server with a drain before shutdown (see the module docstring)."""

    def __init__(
        self, config: uvicorn.Config, admission: Admission, grace_seconds: float, delay_seconds: float = 0.0
    ) -> None:
        super().__init__(config)
        self._admission = admission
        self._grace = grace_seconds
        self._delay = delay_seconds
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain_task: asyncio.Task[None] | None = None
        self._drain_requested = False

    async def serve(self, sockets: Any = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's startup (the lifespan, then the listeners), with listeners that accept
        every connection waiting when they find a queue (gateway.http.listener), and what
        the start built kept out of the garbage collector's walks (gateway.serving.collector)."""
        await self.lifespan.startup()
        if self.lifespan.should_exit:
            sys.exit(STARTUP_FAILURE)
        frozen = freeze_startup()
        logger.debug("%d objects built at start frozen out of the collector's walks", frozen)
        config = self.config

        def create_protocol() -> asyncio.Protocol:
            protocol: asyncio.Protocol = config.http_protocol_class(  # type: ignore[call-arg]
                config=config, server_state=self.server_state, app_state=self.lifespan.state
            )
            return protocol

        listeners = sockets
        if listeners is None:
            try:
                listeners = [bind(config.host, config.port, config.backlog)]
            except OSError as exc:
                logger.error("cannot listen on %s:%d: %s", config.host, config.port, exc)
                await self.lifespan.shutdown()
                sys.exit(STARTUP_FAILURE)
        loop = asyncio.get_running_loop()
        # uvicorn types its servers as asyncio's; it calls close() and wait_closed() on them
        listening = [
            await Listener(loop, sock, create_protocol, backlog=config.backlog).start() for sock in listeners
        ]
        self.servers = listening  # type: ignore[assignment]
        for sock in listeners:
            logger.info("listening on http://%s", _address(sock))
        self.started = True

    @contextmanager
    def capture_signals(self) -> Iterator[None]:
        """uvicorn's, and the log written out before it raises the signal it stopped on
        again (the process then ends at once, without its exit handlers)."""
        with super().capture_signals():
            try:
                yield
            finally:
                flush_logs()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._loop is None or self._drain_requested or self.should_exit:
            super().handle_exit(sig, frame)  # a second signal: stop now
            return
        self._drain_requested = True
        self._captured_signals.append(sig)
        self._loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        self._drain_task = asyncio.ensure_future(self._drain())

    async def _drain(self) -> None:
        if self._delay:
            self._admission.start_leaving()
            logger.info("leaving: /readyz is 503; serving %.1f s more before the drain", self._delay)
            await asyncio.sleep(self._delay)
        logger.info("draining: %d request(s) in flight", self._admission.in_flight)
        self._admission.start_draining()
        try:
            async with asyncio.timeout(self._grace):
                await self._admission.wait_idle()
        except TimeoutError:
            logger.warning(
                "%d request(s) still in flight after %.0f s", self._admission.in_flight, self._grace
            )
        # Linger: kept-alive clients sending now get 503 + Connection: close instead of a
        # connection closed under their request when uvicorn shuts idle connections.
        await asyncio.sleep(1.0)
        self.should_exit = True


def _address(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def gateway_server(app: FastAPI, settings: Settings, host: str, port: int) -> GatewayServer:
    """The gateway's server, with its drain as the settings say (serve and local both),
    in a process tuned for it (the heap: gateway.serving.heap)."""
    keep_heap(settings.server.heap_keep_bytes)
    admission: Admission = app.state.admission
    return GatewayServer(
        server_config(app, settings, host, port),
        admission,
        settings.server.shutdown_grace_seconds,
        settings.server.drain_delay_seconds,
    )


def run_server(
    app: FastAPI,
    settings: Settings,
    host: str,
    port: int,
    running: Callable[[], AbstractAsyncContextManager[object]],
) -> None:
    """Serve until SIGTERM/SIGINT, then drain and exit: inside ``running`` (the runtime:
    the services both doors share, and the gRPC door), the HTTP server over ``app``."""
    server = gateway_server(app, settings, host, port)
    sockets = listen_sockets(settings, host, port)

    async def serve() -> None:
        async with running():
            await server.serve(sockets)

    with asyncio.Runner(loop_factory=server.config.get_loop_factory()) as runner:
        runner.run(serve())
