"""Refused from the headers, and heard: a request the gateway will not serve is answered
before its body is read, and the client, still sending, reads that answer (the server
reads the rest away before it closes) instead of a connection reset."""

from __future__ import annotations

import http.client
import re
import socket
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import psutil
import pytest

from gateway.dev.gatewayprocess import GatewayProcess
from gateway.dev.tritonserver import TritonServer, throttled
from gateway.shared.keyfiles import hash_key

from helpers import uploadstorm
from helpers.support import chelsea_jpeg, coffee_png

pytestmark = pytest.mark.alone  # it times or loads the machine: run with nothing beside it

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


def _head(port: int, path: str, content_type: str, body: bytes) -> bytes:
    """The answer's head to a POST whose whole body is written first."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
    return answer.split(b"\r\n\r\n", 1)[0] + b"\r\n"


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


def test_a_refusal_from_the_headers_keeps_a_small_requests_connection_and_holds_its_retries(
    triton: TritonServer, spawn_gateway: Callable[..., GatewayProcess]
) -> None:
    """A small body refused unread is read away by the server: the connection stays (a new
    one for each retry cost twice the refusal: 0.31 ms of gateway CPU a refusal, 0.11 ms
    kept), and a retry sent on it at once is answered later each time. A large body still
    closes its connection (the server lingers to read it away)."""
    gateway = spawn_gateway(
        triton,
        GATEWAY_SERVER__MAX_IN_FLIGHT="1",
        GATEWAY_SERVER__QUEUE_SECONDS="0.4",
        GATEWAY_SERVER__ADAPTIVE__ENABLED="false",
        GATEWAY_SERVER__SHED_FROM_HEADERS="true",
    )
    text = b'{"texts": ["the film was a delight from start to finish"]}'
    stop = threading.Event()

    def flood() -> None:  # keeps a queue the slot cannot serve within the queue wait
        while not stop.is_set():
            _post(gateway.port, "/classify", "application/json", text, timeout=10)

    threads = [threading.Thread(target=flood, daemon=True) for _ in range(12)]
    with throttled(triton):
        for thread in threads:
            thread.start()
        try:
            time.sleep(2.0)  # completions seen: the gateway knows how fast the queue moves
            connection = http.client.HTTPConnection("127.0.0.1", gateway.port, timeout=10)
            refused: list[tuple[float, str | None]] = []
            sock = None
            deadline = time.monotonic() + 8
            while len(refused) < 4 and time.monotonic() < deadline:
                started = time.monotonic()
                connection.request(
                    "POST", "/classify", body=text, headers={"content-type": "application/json"}
                )
                answer = connection.getresponse()
                answer.read()
                if sock is None:
                    sock = connection.sock
                assert connection.sock is sock  # the same connection, every time
                took = time.monotonic() - started
                if answer.status == 503 and took < 0.3:
                    refused.append((took, answer.getheader("connection")))
                elif answer.status == 503:  # admitted, then refused after the queue wait:
                    refused.clear()  # not a refusal from the headers, so not held; start again
            connection.close()
            large = _head(gateway.port, "/classify", "image/jpeg", b"\xff\xd8\xff" + bytes(200 * 1024))
        finally:
            stop.set()
    print(f"refusals on one connection (seconds, Connection): {refused}; a large body: {large[:60]!r}")
    assert len(refused) == 4, refused
    assert all(header is None for _, header in refused)  # kept alive
    # the retries that came at once waited longer each time (10, 20, 40 ms at least)
    for (took, _), least in zip(refused[1:], (0.01, 0.02, 0.04), strict=True):
        assert took >= least, refused
    assert large.startswith(b"HTTP/1.1 503")
    assert b"\r\nconnection: close\r\n" in large.lower()
    for thread in threads:
        thread.join(timeout=15)


def _body_bytes_read(gateway: GatewayProcess, key: str) -> float:
    """The request bytes the gateway has read on /classify (gateway_request_body_bytes)."""
    metrics = httpx.get(f"{gateway.url}/metrics", headers={"authorization": f"Bearer {key}"}, timeout=5)
    found = re.search(r'^gateway_request_body_bytes_sum\{route="/classify"\} (\S+)$', metrics.text, re.M)
    assert found, metrics.text[:300]
    return float(found.group(1))


def test_three_hundred_uploads_at_once_are_refused_from_their_headers_beyond_what_is_served(
    triton: TritonServer, spawn_gateway: Callable[..., GatewayProcess], tmp_path: Path
) -> None:
    """Issue 54's storm: 300 8-image uploads sent at once to the default gateway. Nothing
    waits for a slot when their heads arrive (all are uploading), so the rule on the queue
    let every one in and each 503 came after its body and the queue wait (a median of 0.7
    to 2.8 s, measured from outside). Counting a key's own uploads, those beyond what the
    gateway serves within the wait are refused from their headers. (Anonymous uploads are
    never counted: tests/api/test_expect_continue_api.py, strangers' silent uploads.)"""
    keys = tmp_path / "keys"
    keys.write_text(f"uploader {hash_key('uploader-key')}\n")
    # the 60 admitted are 480 images for a CPU Triton: with another process keeping a core
    # busy their median took 6.7 s and 16 passed the 10 s deadline (504); what is measured
    # here is the refusal, so the deadline is longer than that work
    gateway = spawn_gateway(
        triton,
        GATEWAY_AUTH__KEYS_FILE=str(keys),
        GATEWAY_AUTH__METRICS_READERS='["uploader"]',
        GATEWAY_TRITON__TIMEOUT_SECONDS="19",
    )
    content_type, body = _multipart([chelsea_jpeg()] * 8)
    head = (
        f"POST /classify HTTP/1.1\r\nHost: 127.0.0.1:{gateway.port}\r\nContent-Type: {content_type}\r\n"
        f"Authorization: Bearer uploader-key\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    for _ in range(4):  # the gateway has seen its queue move
        warm = httpx.post(
            f"{gateway.url}/classify",
            content=body,
            headers={"content-type": content_type, "authorization": "Bearer uploader-key"},
            timeout=30,
        )
        assert warm.status_code == 200, warm.text

    read_before = _body_bytes_read(gateway, "uploader-key")
    stormed = uploadstorm.storm(gateway.port, head, body, 300)
    answers = [(answer.status, answer.seconds) for answer in stormed]
    read_late = [answer.read_seconds for answer in stormed if answer.status.startswith(b"HTTP/1.1 503")]
    read = _body_bytes_read(gateway, "uploader-key") - read_before
    statuses = Counter(status for status, _ in answers)
    refused = sorted(seconds for status, seconds in answers if status.startswith(b"HTTP/1.1 503"))
    served = sorted(seconds for status, seconds in answers if status == b"HTTP/1.1 200 OK")
    median = statistics.median(refused) if refused else float("nan")
    print(
        f"300 uploads at once: {dict(statuses)}; 503 median {median * 1000:.0f} ms "
        f"(p10 {refused[len(refused) // 10] * 1000:.0f} ms, p90 {refused[int(0.9 * len(refused))] * 1000:.0f} ms); 200 median "
        f"{statistics.median(served) * 1000:.0f} ms; the 503s as this client read them: median "
        f"{statistics.median(read_late) * 1000:.0f} ms"
    )
    assert set(statuses) <= {b"HTTP/1.1 200 OK", b"HTTP/1.1 503 Service Unavailable"}, statuses
    assert served
    assert len(refused) >= 150
    # about the limit read their bodies, and what completes within the queue wait (before:
    # all 300, and every 503 came after its body and the queue wait: a median of 0.42-0.52 s
    # here; then the limit and a second limit's worth, 128: 503 p10/p90 124-147/310-362 ms;
    # now 64: 81/181-237 ms, read by an asyncio client whose 300 tasks pushing bodies read
    # each status line late. Timed by the kernel's stamps (helpers.uploadstorm) on
    # 2026-11-29 (six runs): median 78-144 ms, p10 31-109 ms, p90 122-485 ms, the client reading each
    # as it came. The gateway answers a refused head in 0.3-0.5 ms of its loop (the access
    # log's times), between the admitted uploads' heads, bodies and calls: the 240th
    # refusal comes 100 ms after the first, and later when an admitted body's work runs
    # between them). 2026-12-03: a collection of the oldest generation paused the loop for
    # 61 ms in the middle of a storm; with the start frozen and connections no longer in
    # reference cycles (gateway.serving.collector), 16 storms interleaved with the code
    # before: medians 23-55 ms (the median of them 33) against 29-229 ms (51). A refusal
    # on a new connection costs the loop 240-390 us under uvloop, three quarters of it the
    # socket's accept, reads, write and close)
    print(f"bodies read: {read / len(body):.0f} of 300")
    assert read <= 1.2 * 64 * len(body), f"{read / len(body):.0f} bodies read"
