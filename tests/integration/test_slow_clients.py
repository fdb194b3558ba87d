"""Slow and greedy clients: silent sockets, trickled heads and stalled bodies are cut off
on time, and meanwhile /livez and a real /classify still answer within a second."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable

import httpx
import pytest

from gateway.dev.gatewayprocess import GatewayProcess
from gateway.dev.tritonserver import TritonServer

from helpers.support import coffee_png

pytestmark = pytest.mark.alone  # it times or loads the machine: run with nothing beside it

SOCKETS = 500


def open_socket(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.setblocking(False)
    return sock


def closed_by_server(sock: socket.socket) -> bool:
    try:
        return sock.recv(65536) == b"" or True  # an answer (408) or EOF: the server acted
    except BlockingIOError:
        return False  # still open, nothing sent
    except OSError:
        return True  # reset


def test_slow_sockets_do_not_starve_others_and_are_cut_off(
    triton: TritonServer, spawn_gateway: Callable[..., GatewayProcess]
) -> None:
    gateway = spawn_gateway(
        triton,
        GATEWAY_SERVER__HEADER_TIMEOUT_SECONDS="3",
        GATEWAY_SERVER__BODY_TIMEOUT_SECONDS="3",
    )
    silent, trickled, stalled = [], [], []
    for i in range(SOCKETS):
        sock = open_socket(gateway.port)
        if i % 3 == 0:
            silent.append(sock)
        elif i % 3 == 1:
            sock.send(b"POST /classify HTTP/1.1\r\nHost: x\r\n")  # a head that never ends
            trickled.append(sock)
        else:
            sock.send(
                b"POST /classify HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\n"
                b"Content-Length: 100000\r\n\r\n" + coffee_png()[:1000]
            )
            stalled.append(sock)
    try:
        with httpx.Client(base_url=gateway.url, timeout=5) as client:
            started = time.monotonic()
            assert client.get("/livez").status_code == 200
            livez = time.monotonic() - started
            started = time.monotonic()
            answer = client.post("/classify", content=coffee_png(), headers={"content-type": "image/png"})
            classify = time.monotonic() - started
        assert answer.status_code == 200, answer.text
        print(
            f"with {SOCKETS} slow sockets: /livez {livez * 1000:.0f} ms, /classify {classify * 1000:.0f} ms"
        )
        assert livez < 1.0
        assert classify < 1.0
        time.sleep(5)  # past both timeouts
        still_open = [s for s in silent + trickled + stalled if not closed_by_server(s)]
        assert not still_open, f"{len(still_open)} of {SOCKETS} slow sockets are still open"
        # A stalled body is answered 408 problem+json before the connection closes.
        leftover = b""
        fresh = open_socket(gateway.port)
        fresh.setblocking(True)
        fresh.settimeout(10)
        fresh.send(
            b"POST /classify HTTP/1.1\r\nHost: x\r\nContent-Type: image/png\r\nContent-Length: 100000\r\n\r\nabc"
        )
        while b"\r\n\r\n" not in leftover:
            chunk = fresh.recv(65536)
            if not chunk:
                break
            leftover += chunk
        fresh.close()
        assert leftover.startswith(b"HTTP/1.1 408"), leftover[:200]
        assert b"application/problem+json" in leftover
    finally:
        for sock in silent + trickled + stalled:
            sock.close()
