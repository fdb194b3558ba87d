"""Refused from the headers, and heard: a request the gateway will not serve is answered
before its body is read, and the client, still sending, reads that answer (the server
reads the rest away before it closes) instead of a connection reset."""

from __future__ import annotations

import socket
import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import psutil

from gateway.dev.gatewayprocess import GatewayProcess
from gateway.dev.tritonserver import TritonServer

from helpers.support import chelsea_jpeg, coffee_png

MiB = 1024 * 1024


def _post(port: int, path: str, content_type: str, body: bytes, timeout: float = 30.0) -> tuple[bytes, float]:
    """A plain HTTP/1.1 POST: the head, the whole body (as most clients write it, before
    reading), then the answer's status line; the seconds from the first byte to it.
    b"reset" when the connection was reset under the client."""
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        try:
            sock.sendall(head)
            sock.sendall(body)
            answer = b""
            while b"\r\n" not in answer:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                answer += chunk
        except (ConnectionResetError, BrokenPipeError):
            return b"reset", time.monotonic() - started
    return answer.split(b"\r\n", 1)[0], time.monotonic() - started


def test_clients_uploading_bodies_refused_unread_all_read_their_answer(
    triton: TritonServer, spawn_gateway: Callable[..., GatewayProcess]
) -> None:
    # the body budget (1 MiB) cannot take a 7 MiB body: each is refused from its length,
    # before a byte of it is read (before, 64 of 100 such clients met a reset)
    gateway = spawn_gateway(triton, GATEWAY_SERVER__MAX_BODY_BYTES_IN_FLIGHT=str(MiB))
    body = b"\xff\xd8\xff" + bytes(7 * MiB)
    with ThreadPoolExecutor(max_workers=30) as pool:
        answers = list(pool.map(lambda _: _post(gateway.port, "/classify", "image/jpeg", body)[0], range(30)))
    print(f"30 clients uploading 7 MiB into a spent budget: {sorted(set(answers))}")
    assert answers == [b"HTTP/1.1 503 Service Unavailable"] * 30, answers


def _multipart(images: list[bytes]) -> tuple[str, bytes]:
    boundary = "storm-boundary-1234"
    parts = b"".join(
        f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{i}.jpg"\r\n'
        f"Content-Type: image/jpeg\r\n\r\n".encode()
        + image
        + b"\r\n"
        for i, image in enumerate(images)
    )
    return f"multipart/form-data; boundary={boundary}", parts + f"--{boundary}--\r\n".encode()


def test_an_upload_storm_is_shed_from_the_headers(
    triton: TritonServer, spawn_gateway: Callable[..., GatewayProcess]
) -> None:
    # Two slots, a 0.4 s queue wait, 8-image uploads from 40 clients that retry at once:
    # far more than the slots serve. A 503 read after the body and the queue wait takes
    # at least 0.4 s; one decided from the headers, milliseconds.
    gateway = spawn_gateway(
        triton,
        GATEWAY_SERVER__MAX_IN_FLIGHT="2",
        GATEWAY_SERVER__QUEUE_SECONDS="0.4",
        GATEWAY_SERVER__ADAPTIVE__ENABLED="false",
        GATEWAY_SERVER__SHED_FROM_HEADERS="true",
    )
    content_type, body = _multipart([chelsea_jpeg(), coffee_png()] * 4)
    until = time.monotonic() + 8.0
    refused: list[float] = []
    statuses: dict[bytes, int] = {}
    lock = threading.Lock()

    def client() -> None:
        while time.monotonic() < until:
            status, seconds = _post(gateway.port, "/classify", content_type, body)
            with lock:
                statuses[status] = statuses.get(status, 0) + 1
                if status.startswith(b"HTTP/1.1 503"):
                    refused.append(seconds)

    process = psutil.Process(gateway.process.pid)
    cpu_before = sum(process.cpu_times()[:2])
    threads = [threading.Thread(target=client) for _ in range(40)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    cpu = sum(process.cpu_times()[:2]) - cpu_before
    median = statistics.median(refused) if refused else float("nan")
    print(
        f"upload storm: {statuses}; 503 median {median * 1000:.0f} ms over {len(refused)}; "
        f"gateway CPU {cpu:.1f} s in 8 s"
    )
    assert set(statuses) <= {b"HTTP/1.1 200 OK", b"HTTP/1.1 503 Service Unavailable"}, statuses
    assert statuses.get(b"HTTP/1.1 200 OK", 0) > 0
    assert len(refused) > 100
    # today's code answered each 503 after the body and the 0.4 s wait; room is left for a
    # shared 2-core machine running 40 client threads
    assert median < 0.2, f"the median 503 took {median * 1000:.0f} ms"
