"""Overload refused before the upload: a client that sends `Expect: 100-continue` hears
its 503 before it sends a byte of body, on a saturated gateway (the real app and uvicorn
on a loopback port; the transport faked slow, which a real Triton does not do on demand).
Raw sockets, so the test sees exactly what goes over the wire. (Before: the gateway read
the body first, so the client got `100 Continue`, uploaded, and only then the 503.)"""

from __future__ import annotations

import asyncio
import socket
import statistics
import threading
import time
from collections.abc import Iterator, Mapping, Sequence

import httpx
import pytest

from gateway.app import create_app
from gateway.errors import InvalidInputError
from gateway.settings import Settings
from gateway.triton.backend import InferResult
from gateway.triton.tensors import Tensor

from helpers.support import FakeBackend, ServedApp, small_png

pytestmark = pytest.mark.alone  # it times or loads the machine: run with nothing beside it

BODY_BYTES = 2 * 2**20


class SlowBackend(FakeBackend):
    """Every inference takes ``seconds``: the gateway's in-flight slots fill up."""

    seconds: float = 1.5

    async def infer(
        self,
        model: str,
        version: str,
        inputs: Sequence[Tensor],
        request_id: str,
        outputs: Sequence[str] = (),
        invalid: InvalidInputError | None = None,
        priority: int = 0,
        classes: Mapping[str, int] | None = None,
    ) -> InferResult:
        await asyncio.sleep(self.seconds)
        return await super().infer(model, version, inputs, request_id, outputs, invalid)


@pytest.fixture
def saturated() -> Iterator[ServedApp]:
    settings = Settings(server={"max_in_flight": 2, "queue_seconds": 0.02})
    backend = SlowBackend()
    served = ServedApp(create_app(settings, backend_factory=lambda *_: backend), settings).start()
    stop = threading.Event()

    def occupy() -> None:
        with httpx.Client(base_url=served.url, timeout=30) as client:
            while not stop.is_set():
                client.post("/classify", content=small_png(), headers={"content-type": "image/png"})

    holders = [threading.Thread(target=occupy, daemon=True) for _ in range(4)]
    for holder in holders:
        holder.start()
    deadline = time.monotonic() + 5
    while served.app.state.admission.in_flight < 2:
        assert time.monotonic() < deadline, "the gateway never filled up"
        time.sleep(0.01)
    try:
        yield served
    finally:
        stop.set()
        for holder in holders:
            holder.join(timeout=10)
        served.stop()


def _headers(port: int, path: str, expect: bool, length: int = BODY_BYTES) -> bytes:
    lines = [f"POST {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Content-Type: image/jpeg",
             f"Content-Length: {length}"]  # fmt: skip
    if expect:
        lines.append("Expect: 100-continue")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _read_response(sock: socket.socket) -> tuple[bytes, bool]:
    """The response (status line, headers and body), and whether the server then closed."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data, True
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = next(
        (
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        ),
        0,
    )
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        rest += chunk
    sock.settimeout(2)
    try:
        closed = sock.recv(1) == b""
    except TimeoutError:
        closed = False
    return head + b"\r\n\r\n" + rest, closed


@pytest.mark.parametrize("path", ["/classify", "/v2/models/image_classifier/infer"])
def test_an_expect_continue_client_is_refused_before_it_uploads(saturated: ServedApp, path: str) -> None:
    seconds = []
    for _ in range(30):
        with socket.create_connection(("127.0.0.1", saturated.port), timeout=10) as sock:
            started = time.perf_counter()
            sock.sendall(_headers(saturated.port, path, expect=True))  # and no body: it waits for 100
            answer, closed = _read_response(sock)
            seconds.append(time.perf_counter() - started)
        status_line = answer.split(b"\r\n", 1)[0]
        assert status_line == b"HTTP/1.1 503 Service Unavailable", answer[:300]
        assert b"100 Continue" not in answer
        head = answer.split(b"\r\n\r\n", 1)[0].lower()
        assert b"retry-after:" in head
        assert b"connection: close" in head
        assert b"application/problem+json" in head or b"application/json" in head
        assert closed, "the connection must close: the body was never read"
    median = statistics.median(seconds)
    p99 = sorted(seconds)[int(0.99 * (len(seconds) - 1))]
    print(f"Expect: 100-continue refused on {path}: median {1000 * median:.1f} ms, p99 {1000 * p99:.1f} ms")


def test_a_client_without_expect_is_still_read_then_refused(saturated: ServedApp) -> None:
    with socket.create_connection(("127.0.0.1", saturated.port), timeout=10) as sock:
        sock.sendall(
            _headers(saturated.port, "/classify", expect=False, length=len(small_png())) + small_png()
        )
        answer, _ = _read_response(sock)
    assert answer.split(b"\r\n", 1)[0] in (b"HTTP/1.1 503 Service Unavailable", b"HTTP/1.1 200 OK")
    assert b"100 Continue" not in answer


def test_an_admitted_expect_client_gets_100_continue_and_its_answer() -> None:
    """With a slot free the client goes through: 100 Continue, then its answer, and the
    slot is given back (no accounting drift). Its slot is taken once its body is in, as
    any request's: under saturation, one freed meanwhile may go to another request."""
    settings = Settings(server={"max_in_flight": 2, "queue_seconds": 0.02})
    served = ServedApp(create_app(settings, backend_factory=lambda *_: SlowBackend()), settings).start()
    try:
        body = small_png()
        with socket.create_connection(("127.0.0.1", served.port), timeout=10) as sock:
            sock.sendall(_headers(served.port, "/classify", expect=True, length=len(body)))
            assert sock.recv(65536).startswith(b"HTTP/1.1 100 Continue")
            sock.sendall(body)
            answer, _ = _read_response(sock)
        assert answer.startswith(b"HTTP/1.1 200 OK"), answer[:300]
        assert served.app.state.admission.in_flight == 0
    finally:
        served.stop()


def test_expect_clients_that_never_send_hold_no_slot() -> None:
    """max_in_flight + 4 clients ask `Expect: 100-continue`, get 100 Continue and then send
    nothing: the other clients' requests are all answered while they wait. (Before, each
    held an in-flight slot for the whole body timeout: 5 of 5 others got 503.)"""
    settings = Settings(server={"max_in_flight": 2, "queue_seconds": 0.05})
    backend = SlowBackend()
    backend.seconds = 0.05
    served = ServedApp(create_app(settings, backend_factory=lambda *_: backend), settings).start()
    silent: list[socket.socket] = []
    try:
        for _ in range(settings.server.max_in_flight + 4):
            sock = socket.create_connection(("127.0.0.1", served.port), timeout=10)
            sock.sendall(_headers(served.port, "/classify", expect=True, length=len(small_png())))
            assert sock.recv(65536).startswith(b"HTTP/1.1 100 Continue")
            silent.append(sock)
        assert served.app.state.admission.in_flight == 0
        with httpx.Client(base_url=served.url, timeout=10) as client:
            statuses = [
                client.post(
                    "/classify", content=small_png(), headers={"content-type": "image/png"}
                ).status_code
                for _ in range(5)
            ]
        assert statuses == [200] * 5
    finally:
        for sock in silent:
            sock.close()
        served.stop()


def test_in_flight_returns_to_zero_after_refusals_and_answers() -> None:
    settings = Settings(server={"max_in_flight": 1, "queue_seconds": 0.05})
    backend = SlowBackend()
    backend.seconds = 0.3
    served = ServedApp(create_app(settings, backend_factory=lambda *_: backend), settings).start()
    try:
        body = small_png()

        def one(expect: bool) -> None:
            with socket.create_connection(("127.0.0.1", served.port), timeout=10) as sock:
                sock.sendall(_headers(served.port, "/classify", expect=expect, length=len(body)))
                if not expect:
                    sock.sendall(body)
                else:
                    first = sock.recv(65536)
                    if not first.startswith(b"HTTP/1.1 100 Continue"):
                        return  # refused unsent
                    sock.sendall(body)
                _read_response(sock)

        threads = [threading.Thread(target=one, args=(i % 2 == 0,)) for i in range(12)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        deadline = time.monotonic() + 5
        while served.app.state.admission.in_flight != 0:
            assert time.monotonic() < deadline, served.app.state.admission.in_flight
            time.sleep(0.02)
    finally:
        served.stop()
