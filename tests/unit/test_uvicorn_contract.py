"""The uvicorn internals gateway.http.protocol relies on, held against the installed
uvicorn: every attribute and method of its private ``HttpToolsProtocol`` and request cycle
the gateway's protocol touches exists and means what it meant, and only that module
imports them. An upgrade that renames one fails here, not in production (pyproject.toml
also bounds uvicorn above)."""

from __future__ import annotations

import ast
import asyncio
import inspect
from pathlib import Path
from typing import Any

import httptools
import pytest
import uvicorn
from uvicorn.protocols.http import httptools_impl
from uvicorn.server import ServerState

from gateway.http.protocol import HeaderTimeoutProtocol

from helpers.transport import RecordingTransport

ROOT = Path(__file__).resolve().parents[2]

# What gateway.http.protocol reads or calls on uvicorn's protocol (self.<name>).
PROTOCOL_ATTRIBUTES = (
    "loop",
    "parser",
    "url",
    "scope",
    "root_path",
    "server_state",
    "transport",
    "flow",
    "cycle",
    "pipeline",
    "timeout_keep_alive",
    "timeout_keep_alive_task",
    "headers",
    "expect_100_continue",
    "logger",
)
PROTOCOL_METHODS = (
    "connection_made",
    "connection_lost",
    "data_received",
    "eof_received",
    "on_message_begin",
    "on_headers_complete",
    "on_body",
    "on_message_complete",
    "on_response_complete",
    "timeout_keep_alive_handler",
    "_unset_keepalive_if_required",
    "send_400_response",
    "on_url",
    "on_header",
    "pause_writing",
    "resume_writing",
    "shutdown",
    "_should_upgrade",
)
CYCLE_ATTRIBUTES = (
    "response_started",
    "response_complete",
    "more_body",
    "keep_alive",
    "disconnected",
    "message_event",
)


async def _app(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 204, "headers": []})
    await send({"type": "http.response.body", "body": b""})


def test_the_protocol_has_what_the_gateway_touches() -> None:
    loop = asyncio.new_event_loop()
    try:
        config = uvicorn.Config(_app, http="httptools", lifespan="off", log_config=None)
        protocol = httptools_impl.HttpToolsProtocol(config, ServerState(), {}, _loop=loop)
        for name in PROTOCOL_METHODS:
            assert callable(getattr(protocol, name, None)), name
        protocol.connection_made(RecordingTransport())
        protocol.data_received(b"POST /x?q=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\nab")
        for name in PROTOCOL_ATTRIBUTES:
            assert hasattr(protocol, name), name
        assert protocol.url == b"/x?q=1"  # the raw target, as on_headers_complete parses it
        assert protocol.parser.get_method() == b"POST"
        assert protocol.parser.get_http_version() == "1.1"
        assert protocol.parser.should_keep_alive() is True
        assert isinstance(protocol.server_state.default_headers, list)
        assert isinstance(protocol.server_state.total_requests, int)
        for name in ("resume_reading", "pause_reading"):
            assert callable(getattr(protocol.flow, name)), name
        cycle = protocol.cycle
        for name in CYCLE_ATTRIBUTES:
            assert hasattr(cycle, name), name
        assert cycle.more_body is True  # the body is still on its way
        # the cycle reports a complete answer through the protocol's own method, looked up
        # on the instance: an override of on_response_complete is what it calls
        assert cycle.on_response == protocol.on_response_complete
        # after the answer, uvicorn stops following the body: the gateway must
        assert "response_complete" in inspect.getsource(httptools_impl.HttpToolsProtocol.on_message_complete)
        assert set(httptools_impl.STATUS_LINE) >= {401, 404, 408, 413, 429, 431, 503}
        loop.run_until_complete(asyncio.sleep(0.01))  # the app answers (204)
        assert cycle.response_complete
        protocol.connection_lost(None)
    finally:
        loop.close()


def test_the_keep_alive_timer_is_cancelled_by_any_byte() -> None:
    """Why the gateway keeps deadlines of its own: uvicorn's keep-alive timer goes on the
    first byte that arrives, whatever it is."""
    source = inspect.getsource(httptools_impl.HttpToolsProtocol.data_received)
    assert "_unset_keepalive_if_required" in source


def test_what_the_parser_refuses_is_answered_by_send_400_response() -> None:
    """The gateway's protocol answers it in problem+json by overriding that method; what a
    parser callback raises (too many chunks) is one of the errors it is called for."""
    source = inspect.getsource(httptools_impl.HttpToolsProtocol.data_received)
    assert "self.send_400_response(" in source
    assert "except httptools.HttpParserError" in source
    assert issubclass(httptools.HttpParserCallbackError, httptools.HttpParserError)


def test_httptools_stops_at_an_upgrade_offer_where_its_head_ends() -> None:
    """gateway.http.protocol serves an upgrade offer as HTTP/1.1 from what httptools does
    with one: the body skipped (the message complete at the head's end), the parser
    stopped there with the offset into the data fed, already resumed; uvicorn asks
    ``_should_upgrade`` (overridden: never) before it starts the request, and collects the
    headers lowercased."""
    events: list[str] = []

    class Target:
        def on_headers_complete(self) -> None:
            events.append("headers")

        def on_body(self, body: bytes) -> None:
            events.append(f"body {body!r}")

        def on_message_complete(self) -> None:
            events.append("complete")

    parser = httptools.HttpRequestParser(Target())
    head = b"POST / HTTP/1.1\r\nContent-Length: 2\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n"
    with pytest.raises(httptools.HttpParserUpgrade) as offer:
        parser.feed_data(head + b"{}")
    assert offer.value.args[0] == len(head)
    assert events == ["headers", "complete"]
    parser.feed_data(b"POST / HTTP/1.1\r\ncontent-length: 2\r\n\r\n{}")
    assert events[2:] == ["headers", "body b'{}'", "complete"]
    source = inspect.getsource(httptools_impl.HttpToolsProtocol.on_headers_complete)
    assert "self.parser.should_upgrade() and self._should_upgrade()" in source
    assert "name = name.lower()" in inspect.getsource(httptools_impl.HttpToolsProtocol.on_header)


def test_the_protocol_collects_a_header_as_uvicorn_does() -> None:
    """gateway.http.protocol's ``on_header`` does uvicorn's work inline (one call less a
    header field): uvicorn's must still be exactly that work, or the copy is stale."""
    ours = inspect.getsource(HeaderTimeoutProtocol.on_header)
    theirs = inspect.getsource(httptools_impl.HttpToolsProtocol.on_header)
    body = [line.strip() for line in theirs.splitlines()[1:] if line.strip()]
    assert body == [
        "name = name.lower()",
        'if name == b"expect" and value.lower() == b"100-continue":',
        "self.expect_100_continue = True",
        "self.headers.append((name, value))",
    ]
    assert "\n".join(body) in "\n".join(line.strip() for line in ours.splitlines())
    assert "super().on_header" not in ours


def test_the_pipeline_holds_the_newest_request_on_its_left() -> None:
    """The gateway reads ``pipeline[0]`` as the newest request waiting (a full pipeline's
    last, a refused pipelined body's) and takes it out with ``popleft``: uvicorn appends on
    the left and runs from the right."""
    assert "self.pipeline.appendleft(" in inspect.getsource(
        httptools_impl.HttpToolsProtocol.on_headers_complete
    )
    assert "self.pipeline.pop()" in inspect.getsource(httptools_impl.HttpToolsProtocol.on_response_complete)
    assert inspect.isclass(httptools_impl.RequestResponseCycle)


def test_only_the_protocol_module_imports_uvicorns_internals() -> None:
    importers = []
    for path in (ROOT / "gateway").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("uvicorn.protocols"):
                importers.append(path.relative_to(ROOT).as_posix())
    assert importers == ["gateway/http/protocol.py"]


def test_uvicorn_is_bounded_above() -> None:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    [line] = [line for line in text.splitlines() if line.strip().startswith('"uvicorn')]
    assert "<" in line, line


def test_the_server_startup_the_gateway_replaces_is_what_it_was() -> None:
    """gateway.http.server's GatewayServer.startup replaces uvicorn's (to listen with
    gateway.http.listener): the lifespan it starts, the protocol factory it builds, the
    servers uvicorn later closes and waits for, all as uvicorn's own startup does them."""
    startup = inspect.getsource(uvicorn.Server.startup)
    for used in (
        "await self.lifespan.startup()",
        "self.lifespan.should_exit",
        "sys.exit(STARTUP_FAILURE)",
        "config.http_protocol_class(",
        "server_state=self.server_state",
        "app_state=self.lifespan.state",
        "self.servers",
        "self.started = True",
        "backlog=config.backlog",
    ):
        assert used in startup, used
    shutdown = inspect.getsource(uvicorn.Server.shutdown) + inspect.getsource(
        uvicorn.Server._wait_tasks_to_complete
    )
    assert "server.close()" in shutdown
    assert "await server.wait_closed()" in shutdown
    assert list(inspect.signature(uvicorn.Server.startup).parameters) == ["self", "sockets"]
    config = uvicorn.Config(_app, backlog=7)
    assert config.backlog == 7
