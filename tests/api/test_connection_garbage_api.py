"""A connection, once closed, is freed by reference counting: nothing of the gateway's,
uvicorn's or the frameworks' is left in a reference cycle for the garbage collector.

Each such cycle is kept until a collection walks it, and a walk of the oldest generation
pauses the event loop for as long as what it walks: an upload storm of 300 connections
left 7,621 objects in cycles (each connection's protocol and the wrapper of its transport
referring to each other, and a multipart parser holding its reader's methods), 6 after.
The test server runs asyncio's own loop, whose socket transports are in a cycle of their
own (7 objects a connection, asyncio's, not counted here; uvloop's, which serves in
production, are not)."""

from __future__ import annotations

import gc
import json
import socket
import struct
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from gateway.app import create_app
from gateway.http.protocol import HeaderTimeoutProtocol
from gateway.serving.admission import Admission
from gateway.serving.refusal import Refusals
from gateway.settings import Settings
from gateway.shared.keyfiles import hash_key

from helpers.rawload import request_bytes
from helpers.sockets import read_answer
from helpers.support import FakeBackend, ServedApp, chelsea_jpeg

OURS = ("gateway", "uvicorn", "starlette", "fastapi", "python_multipart", "httptools")
KEY = {"x-api-key": "plain-secret"}
BOUNDARY = "garbage-boundary"
MULTIPART = (
    (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="a.jpg"\r\n'
        "Content-Type: image/jpeg\r\n\r\n"
    ).encode()
    + chelsea_jpeg()
    + f"\r\n--{BOUNDARY}--\r\n".encode()
)
OIP = {"inputs": [{"name": "TEXT", "shape": [1, 1], "datatype": "BYTES", "data": ["x"]}]}

# name: (path, headers, content type, body, the status expected)
CASES: dict[str, tuple[str, dict[str, str], str, bytes, int]] = {
    "text": ("/classify", KEY, "application/json", b'{"text": "The striker scored."}', 200),
    "no key": ("/classify", {}, "application/json", b'{"text": "x"}', 401),
    "unknown model": ("/models/nope/classify", KEY, "application/json", b'{"text": "x"}', 404),
    "malformed JSON": ("/classify", KEY, "application/json", b'{"text": ', 400),
    "multipart": ("/classify", KEY, f"multipart/form-data; boundary={BOUNDARY}", MULTIPART, 200),
    "OIP door": ("/v2/models/text_classifier/infer", KEY, "application/json", json.dumps(OIP).encode(), 422),
}


@pytest.fixture
def served(tmp_path: Path) -> Iterator[ServedApp]:
    keys = tmp_path / "keys"
    keys.write_text(f"plain {hash_key('plain-secret')}\n")
    settings = Settings(auth={"keys_file": keys, "metrics_readers": []})
    app = ServedApp(create_app(settings, backend_factory=lambda *_: FakeBackend()), settings).start()
    yield app
    app.stop()


def _post(url: str, path: str, headers: dict[str, str], content_type: str, body: bytes) -> int:
    """One request on a connection of its own, read to its close; the status."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
        sock.sendall(
            request_bytes(url, path, body, {**headers, "content-type": content_type, "connection": "close"})
        )
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return int(answer.split(b" ", 2)[1])


def _left_in_cycles(
    served: ServedApp, path: str, headers: dict[str, str], content_type: str, body: bytes
) -> tuple[set[int], Counter[str]]:
    """The statuses of 10 requests, each on its own connection, and what of ours they
    left for the collector (by type), with the collector off while they ran."""
    _post(served.url, path, headers, content_type, body)  # what a first request builds once
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)  # what a collection finds is kept in gc.garbage, to be named
    try:
        statuses = {_post(served.url, path, headers, content_type, body) for _ in range(10)}
        time.sleep(0.2)  # (the server's loop is another thread's: its last callbacks run)
        gc.collect()
        left = Counter(
            type(found).__module__ + "." + type(found).__qualname__
            for found in gc.garbage
            if type(found).__module__.startswith(OURS)
            or type(getattr(found, "__self__", None)).__module__.startswith(OURS)
        )
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    return statuses, left


@pytest.mark.parametrize("case", CASES)
def test_a_closed_connection_leaves_nothing_of_ours_to_the_collector(served: ServedApp, case: str) -> None:
    path, headers, content_type, body, status = CASES[case]
    statuses, left = _left_in_cycles(served, path, headers, content_type, body)
    assert statuses == {status}
    assert not left, left


def test_a_refusal_from_the_head_leaves_nothing_of_ours_to_the_collector(
    served: ServedApp, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(Refusals, "refuses", lambda self, tenant=None: True)
    monkeypatch.setattr(Admission, "limit", property(lambda self: 0))
    statuses, left = _left_in_cycles(served, *CASES["text"][:4])
    assert statuses == {503}
    assert not left, left


def _reset_after_answer(url: str) -> None:
    """A request on a connection kept alive, its answer read, then the connection reset by
    the client (a zero linger), as a proxy purging its idle connections resets them."""
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=10)
    try:
        sock.sendall(b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n")
        status, _ = read_answer(sock)
        assert status == b"HTTP/1.1 200 OK", status
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    finally:
        sock.close()


def test_a_connection_its_client_resets_is_freed_at_once(served: ServedApp) -> None:
    """uvicorn cancels its keep-alive timer only when a connection closes cleanly: each one
    its client reset after an answer was held, with its request's scope and cycle, until
    the timer fired (``server.keep_alive_seconds``, 5 s): 10 of 10 here, before."""
    for _ in range(10):
        _reset_after_answer(served.url)
    time.sleep(0.3)  # (the server's loop is another thread's: it sees the resets)
    gc.collect()  # (asyncio's own transports are cycles; uvloop's, in production, are not)
    held = [found for found in gc.get_objects() if isinstance(found, HeaderTimeoutProtocol)]
    assert held == [], f"{len(held)} connections reset by their clients are still held"
