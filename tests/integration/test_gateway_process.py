"""The test harness's gateway process (gateway.dev.gatewayprocess): it is ready when its own
listener answers, never another process's on the same port, and a gateway whose port was
taken between choosing it and binding it starts again on another. Before, a gateway that
lost its port to another test's gateway (pytest-xdist workers choose ports at once) was
taken as ready from the other's answer, and six tests then failed against it
(Address already in use, 2026-12-03)."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from gateway.dev import gatewayprocess
from gateway.dev.gatewayprocess import GatewayProcess
from gateway.dev.tritonserver import free_port

# the gateway starts without Triton (/livez answers): only Triton's addresses are read
NO_TRITON: Any = SimpleNamespace(
    grpc_url="127.0.0.1:1", metrics_url="http://127.0.0.1:1/metrics", repository_key="unused"
)


class _Livez(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        return None


@pytest.fixture
def squatter() -> Iterator[int]:
    """Another process's server on a port, answering 200 to everything."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), _Livez)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_another_servers_answer_on_its_port_is_not_the_gateway_ready(squatter: int, tmp_path: Path) -> None:
    gateway = GatewayProcess.start(NO_TRITON, tmp_path, port=squatter)
    try:
        with pytest.raises(RuntimeError, match="Address already in use"):
            gateway.wait("/livez", timeout=30)
    finally:
        gateway.stop()


def test_a_port_taken_before_the_gateway_bound_it_is_replaced(
    squatter: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ports = iter([squatter])
    monkeypatch.setattr(gatewayprocess, "free_port", lambda: next(ports, None) or free_port())
    gateway = GatewayProcess.start(NO_TRITON, tmp_path)
    try:
        assert gateway.port == squatter
        gateway.wait("/livez", timeout=60)
        assert gateway.port != squatter
        assert gatewayprocess._listens(gateway.process.pid, gateway.port)
    finally:
        gateway.stop()
