"""How the gateway runs under uvicorn: limits, timeouts, and a drain on SIGTERM.

- ``server_config`` builds the one uvicorn configuration every entry point uses: no
  ``server`` banner, a connection cap (uvicorn's ``limit_concurrency``, the last
  backstop), keep-alive and graceful-shutdown timeouts from the settings, and an HTTP
  protocol that closes connections whose request head does not arrive in time
  (uvicorn has no such timeout: 500 silent sockets would stay open forever).
- With ``admin.port`` set, the gateway listens on two sockets: ``/admin`` is answered on
  the admin listener only, and everything else on the main one only (404 elsewhere), so
  a firewall, a Service or a loopback bind keeps model control private.
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
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import AbstractAsyncContextManager, contextmanager
from time import perf_counter
from types import FrameType
from typing import Any

import httptools
import uvicorn
from fastapi import FastAPI
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from gateway.errors import NotFoundError
from gateway.http.auth import ADMIN_PREFIX
from gateway.http.headshed import HeadRefusal, HeadShed
from gateway.http.problems import problem_response
from gateway.observe.logs import flush_logs
from gateway.serving.admission import Admission
from gateway.serving.heap import keep_heap
from gateway.settings import Settings

logger = logging.getLogger("gateway.server")


class _LingerOnClose:
    """A connection's transport as uvicorn sees it: closing it lingers while the request's
    body is still on its way (:meth:`HeaderTimeoutProtocol.close_lingering`), and what is
    written in one turn of the event loop goes out in one write: uvicorn writes an
    answer's head and its body apart, two system calls and two TCP segments. (Measured
    on a refusal flood: 0.310 ms of gateway CPU a refusal with it, 0.301 without, so the
    saving is below this machine's noise; the segments it saves are the client's.)"""

    def __init__(self, transport: asyncio.Transport, protocol: HeaderTimeoutProtocol) -> None:
        self._transport = transport
        self._protocol = protocol
        self._pending: list[bytes] = []
        self._loop = protocol.loop
        # what uvicorn calls on every request, bound here rather than found by __getattr__
        self.get_extra_info = transport.get_extra_info
        self.pause_reading = transport.pause_reading
        self.resume_reading = transport.resume_reading

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def write(self, data: bytes) -> None:
        if not data:
            return
        if not self._pending:
            self._loop.call_soon(self.flush)
        self._pending.append(data)

    def flush(self) -> None:
        """Write what this turn of the loop wrote (before the transport closes or shuts
        its write side, too)."""
        pending = self._pending
        if not pending:
            return
        data = pending[0] if len(pending) == 1 else b"".join(pending)
        pending.clear()
        if not self._transport.is_closing():
            self._transport.write(data)

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def close(self) -> None:
        self._protocol.close_lingering()

    def is_closing(self) -> bool:
        return self._protocol.lingering or self._transport.is_closing()


class _NoEvent:
    def set(self) -> None:
        return None


class _RefusedCycle:
    """What uvicorn's callbacks see of a request refused from its head
    (gateway.http.headshed) until its answer is written: an answer under way (a pipelined
    next request waits for it), a body read away as it comes, and whether all of it came."""

    def __init__(self, keep_alive: bool) -> None:
        self.keep_alive = keep_alive
        self.response_complete = False
        self.more_body = True
        self.disconnected = False
        self.message_event = _NoEvent()


class HeaderTimeoutProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, closing a connection whose request head is late, and
    lingering before it closes one whose request body is still coming.

    A timer is armed when the connection opens and when the first bytes of a next request
    arrive on a kept-alive connection (the parser's message-begin callback), and disarmed
    once the head is complete; between requests uvicorn's keep-alive timeout applies.

    A request refused before its body was read (503 from its headers, 413 from its
    length) is answered with ``Connection: close``. Closed at once, the socket would be
    reset under a client still sending, whose next write fails before it reads the answer
    (64 of 100 clients uploading 7 MiB never read their 503). So, as nginx's lingering
    close: the answer goes out, the write side is shut (FIN), and what the client still
    sends is read and thrown away until it stops (its FIN), for at most
    ``linger_seconds`` and ``linger_bytes``; then the socket closes.
    """

    header_timeout: float = 10.0
    linger_seconds: float = 10.0
    linger_bytes: int = 64 * 1024 * 1024
    head_shed: HeadShed | None = None  # refuses from the head what the route would

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._head_timer: asyncio.TimerHandle | None = None
        self._raw = transport
        self.lingering = False
        self._discarded = 0
        self._linger_timer: asyncio.TimerHandle | None = None
        self._wrapped = _LingerOnClose(transport, self)
        super().connection_made(self._wrapped)  # type: ignore[arg-type]
        self._arm()

    def close_lingering(self) -> None:
        self._wrapped.flush()  # the answer first
        raw, cycle = self._raw, self.cycle
        if self.lingering or raw.is_closing():
            return
        if cycle is None or not cycle.more_body or cycle.disconnected:
            raw.close()  # nothing more is coming
            return
        self.lingering = True
        if raw.can_write_eof():
            raw.write_eof()  # once the answer is out
        raw.resume_reading()
        self._linger_timer = self.loop.call_later(self.linger_seconds, raw.close)

    def data_received(self, data: bytes) -> None:
        if not self.lingering:
            super().data_received(data)
            return
        self._discarded += len(data)
        if self._discarded > self.linger_bytes:
            self._raw.close()

    def eof_received(self) -> None:
        if self.lingering:
            self._raw.close()  # the client has sent all it will: the answer is read

    def _arm(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.header_timeout, self._head_late)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_late(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            self.transport.close()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        shed = self.head_shed
        if shed is not None and shed.armed() and (self.cycle is None or self.cycle.response_complete):
            refusal = self._head_refusal(shed)
            if refusal is not None:
                self._refuse(shed, refusal)
                return
        super().on_headers_complete()

    def _head_refusal(self, shed: HeadShed) -> HeadRefusal | None:
        """The head's refusal, its scope filled in as uvicorn fills it (only a POST is
        ever refused here, so nothing is parsed for the rest)."""
        if self.parser.get_method() != b"POST":
            return None
        scope = self.scope
        parsed = httptools.parse_url(self.url)
        path = parsed.path.decode("ascii")
        if "%" in path:
            path = urllib.parse.unquote(path)
        scope["method"] = "POST"
        scope["path"] = self.root_path + path
        scope["raw_path"] = self.root_path.encode("ascii") + parsed.path
        scope["query_string"] = parsed.query or b""
        try:
            return shed.refuse(scope)  # type: ignore[arg-type]
        except Exception:  # a bug here must not cost the request its answer: the route gives it
            logger.exception("the refusal from the request head failed; the route answers")
            return None

    def _refuse(self, shed: HeadShed, refusal: HeadRefusal) -> None:
        """Answer ``refusal`` (after its hold), then go on as uvicorn does after an answer:
        keep the connection, or close it lingering."""
        keep_alive = (
            not refusal.close and self.parser.get_http_version() != "1.0" and self.parser.should_keep_alive()
        )
        cycle = _RefusedCycle(keep_alive)
        self.cycle = cycle  # type: ignore[assignment]
        head = [STATUS_LINE[refusal.status]]
        for name, value in (*self.server_state.default_headers, *refusal.headers):
            head += [name, b": ", value, b"\r\n"]
        if not keep_alive and not refusal.close:
            head.append(b"connection: close\r\n")
        head += [b"\r\n", refusal.body]
        data = b"".join(head)

        def write() -> None:
            # the hold counts from the request's head: the loop's timers run on a clock read
            # once an iteration, in whole milliseconds, and may fire a little early
            early = refusal.hold - (perf_counter() - refusal.started)
            if early > 0 and not self._raw.is_closing():
                self.loop.call_later(early, write)
                return
            cycle.response_complete = True
            if not self._raw.is_closing():
                self._raw.write(data)
            shed.answered(refusal)
            if cycle.keep_alive:  # (the server's shutdown may have cleared it during the hold)
                self.on_response_complete()  # resumes reading, the keep-alive timer or the next request
            else:
                self.close_lingering()

        if refusal.hold:
            # reading goes on: the body is read away, and a request pipelined behind waits
            # for this answer as behind any other (uvicorn's pipeline)
            self.loop.call_later(refusal.hold, write)
        else:
            write()

    def on_body(self, body: bytes) -> None:
        if isinstance(self.cycle, _RefusedCycle):
            return  # read away: a refused request's body is never used
        super().on_body(body)

    def on_message_complete(self) -> None:
        if isinstance(self.cycle, _RefusedCycle):
            self.cycle.more_body = False
            return
        super().on_message_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._linger_timer is not None:
            self._linger_timer.cancel()
        self.lingering = False
        super().connection_lost(exc)


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
    None: uvicorn binds ``host:port`` itself."""
    admin_port = settings.admin_listener_port
    if admin_port is None:
        return None
    if admin_port == port:
        raise ValueError("the admin port must differ from the main port")
    return [
        socket.create_server((address, number), family=socket.AF_INET6 if ":" in address else socket.AF_INET)
        for address, number in ((host, port), (settings.admin.host, admin_port))
    ]


def server_config(app: FastAPI, settings: Settings, host: str, port: int) -> uvicorn.Config:
    """The uvicorn configuration of the gateway (used by serve, local and the tests)."""
    protocol = type(
        "GatewayHttpProtocol",
        (HeaderTimeoutProtocol,),
        {
            "header_timeout": settings.server.header_timeout_seconds,
            "linger_seconds": settings.server.linger_seconds,
            "linger_bytes": settings.max_json_body_bytes,
            "head_shed": getattr(app.state, "head_shed", None),
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
