"""The attack suite: what one client can send, against the real gateway process and a
real Triton, measured as the client sees it (answer, time to answer), with the gateway's
/livez latency during the attack and its RSS. Each case failed on ee5cad7 (issue 32's
table: 9 s and +2 GiB for an 80 KB gzip body, 503s for everyone behind silent Expect
clients, a 64 MiB admin body read before its 401, a metric series per invented version,
a 500 for a Latin-1 digit, +694 MiB for a crowd of uploads).

The figures each test prints are the ones the reliability page quotes."""

from __future__ import annotations

import contextlib
import gzip
import itertools
import json
import os
import re
import select
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gateway.dev.gatewayprocess import GatewayProcess
from gateway.dev.tritonserver import TritonServer, free_port
from gateway.settings import MiB
from gateway.shared.keyfiles import hash_key

from helpers.procfs import cpu_seconds, rss_mib

pytestmark = [pytest.mark.attack, pytest.mark.alone]  # alone: it times the gateway

# ATTACK_GATEWAY_CODE=<a checkout> runs the gateway from another commit's code (say a git
# worktree of ee5cad7): how the suite was shown to fail before the fixes.
OTHER_CODE = os.environ.get("ATTACK_GATEWAY_CODE")


def code_env() -> tuple[Path | None, dict[str, str]]:
    if not OTHER_CODE:
        return None, {}
    return Path(OTHER_CODE), {"PYTHONPATH": OTHER_CODE}


CLIENT_KEY = "an-attacker-with-a-valid-key"
PROMETHEUS_KEY = "prometheus-scrapes-with-this"
ADMIN_KEY = "an-operator"
IN_FLIGHT = 4
BUDGET = 96 * MiB


class Watch:
    """While an attack runs: /livez's latency every 10 ms and the gateway's peak RSS."""

    def __init__(self, gateway: GatewayProcess) -> None:
        self.gateway = gateway
        self.latencies: list[float] = []
        self.peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(base_url=self.gateway.url, timeout=30) as probe:
            while not self._stop.is_set():
                started = time.monotonic()
                probe.get("/livez").raise_for_status()
                self.latencies.append(time.monotonic() - started)
                self.peak = max(self.peak, rss_mib(self.gateway.process.pid))
                time.sleep(0.01)

    def __enter__(self) -> Watch:
        self.before = rss_mib(self.gateway.process.pid)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        time.sleep(0.05)
        self._stop.set()
        self._thread.join(timeout=30)

    @property
    def worst_ms(self) -> float:
        return max(self.latencies) * 1000

    @property
    def rise_mib(self) -> float:
        return self.peak - self.before


PROBE = """
import sys, time, httpx
worst = 0.0
with httpx.Client(base_url=sys.argv[1], timeout=30) as probe:
    while sys.stdin.readable():
        started = time.monotonic()
        probe.get("/livez").raise_for_status()
        worst = max(worst, time.monotonic() - started)
        print(worst, flush=True)
        time.sleep(0.01)
"""


class ProcessProbe:
    """/livez latency from a process of its own (the test's threads share one GIL: a probe
    among 60 upload threads measures the client, not the gateway)."""

    def __init__(self, gateway: GatewayProcess) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-c", PROBE, gateway.url], stdout=subprocess.PIPE, text=True
        )
        self.worst_ms = 0.0

    def __enter__(self) -> ProcessProbe:
        assert self._process.stdout is not None
        self._process.stdout.readline()  # it is probing
        return self

    def __exit__(self, *exc: object) -> None:
        self._process.terminate()
        out, _ = self._process.communicate(timeout=30)
        lines = [line for line in out.splitlines() if line.strip()]
        self.worst_ms = float(lines[-1]) * 1000 if lines else 0.0


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("keys")
    api, admin = folder / "api-keys", folder / "admin-keys"
    api.write_text(f"attacker {hash_key(CLIENT_KEY)}\nprometheus {hash_key(PROMETHEUS_KEY)}\n")
    admin.write_text(f"operator {hash_key(ADMIN_KEY)}\n")
    return api, admin


@pytest.fixture(scope="module")
def gateway(
    triton: TritonServer, keys: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[GatewayProcess]:
    api, admin = keys
    cwd, other = code_env()
    served = GatewayProcess.start(
        triton,
        tmp_path_factory.mktemp("attacked"),
        cwd=cwd,
        env={
            **other,
            "GATEWAY_AUTH__KEYS_FILE": str(api),
            "GATEWAY_ADMIN__KEYS_FILE": str(admin),
            "GATEWAY_SERVER__MAX_IN_FLIGHT": str(IN_FLIGHT),
            "GATEWAY_SERVER__MAX_BODY_BYTES_IN_FLIGHT": str(BUDGET),
        },
    ).wait("/readyz", timeout=60)
    yield served
    served.stop()


def unloaded_livez_ms(gateway: GatewayProcess) -> float:
    with httpx.Client(base_url=gateway.url) as probe:
        samples = []
        for _ in range(30):
            started = time.monotonic()
            probe.get("/livez")
            samples.append(time.monotonic() - started)
    return statistics.median(samples) * 1000


def authorized() -> dict[str, str]:
    return {"authorization": f"Bearer {CLIENT_KEY}"}


@pytest.mark.parametrize("route", ["/classify", "/v2/models/text_classifier/infer"])
def test_a_gzip_json_bomb_is_refused_without_stalling_or_filling_the_gateway(
    gateway: GatewayProcess, route: str
) -> None:
    """80 KB of gzip inflating to 40 MiB of nested arrays (before: 422 after 5.7-9.2 s,
    /livez stalled 9.6 s, RSS +2,069 MiB)."""
    inflated = b'{"texts": [' + b"[[[[]]]]," * (40 * MiB // 9) + b'"x"]}'
    bomb = gzip.compress(inflated, compresslevel=9)
    assert len(bomb) < 120_000
    resting = unloaded_livez_ms(gateway)
    with Watch(gateway) as watch, httpx.Client(base_url=gateway.url, timeout=60) as client:
        started = time.monotonic()
        answer = client.post(
            route,
            content=bomb,
            headers={**authorized(), "content-type": "application/json", "content-encoding": "gzip"},
        )
        took = time.monotonic() - started
    print(
        f"{route}: {len(bomb)} B gzip -> {answer.status_code} in {took * 1000:.0f} ms; /livez at rest "
        f"{resting:.1f} ms, worst during {watch.worst_ms:.1f} ms; RSS +{watch.rise_mib:.1f} MiB"
    )
    assert answer.status_code in (400, 413, 422), answer.text
    assert answer.headers["content-type"].startswith(("application/problem+json", "application/json"))
    assert took < 1.0
    # the bug froze /livez for 9.6 s; a shared CI machine has shown one 263 ms probe for a
    # bomb refused in 4 ms, so the bound leaves room for the machine and none for the bug
    assert watch.worst_ms < resting + 500
    assert watch.rise_mib < 64  # the JSON cap is 42.7 MiB; the scan never holds the body


def test_expect_clients_that_never_send_starve_nobody(gateway: GatewayProcess) -> None:
    """max_in_flight + 4 connections ask Expect: 100-continue and never send their bodies
    (before: 5 of 5 other clients got 503 while they waited)."""
    silent = []
    try:
        for _ in range(IN_FLIGHT + 4):
            sock = socket.create_connection(("127.0.0.1", gateway.port), timeout=10)
            sock.sendall(
                (
                    f"POST /classify HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {CLIENT_KEY}\r\n"
                    "Content-Type: image/png\r\nContent-Length: 1000000\r\nExpect: 100-continue\r\n\r\n"
                ).encode()
            )
            assert sock.recv(1024).startswith(b"HTTP/1.1 100 Continue")
            silent.append(sock)
        with httpx.Client(base_url=gateway.url, timeout=30, headers=authorized()) as client:
            statuses = [client.post("/classify", json={"text": f"a text, {i}"}).status_code for i in range(5)]
        print(f"{len(silent)} silent Expect clients; others' answers: {statuses}")
        assert statuses == [200] * 5
    finally:
        for sock in silent:
            sock.close()


def test_an_admin_body_is_not_read_before_the_caller_is_known(gateway: GatewayProcess) -> None:
    """PUT /admin with no key declaring 64 MiB: 401 at once, the body unread (before: the
    whole body read, with no cap or deadline, then 422)."""
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=5) as sock:
        started = time.monotonic()
        sock.sendall(
            b"PUT /admin/models/text_classifier/rollout HTTP/1.1\r\nHost: x\r\n"
            b"Content-Type: application/json\r\nContent-Length: 67108864\r\n\r\n"
        )
        head = sock.recv(4096)
        took = time.monotonic() - started
    print(f"PUT /admin, no key, 64 MiB declared: {head.split(b' ', 2)[1].decode()} in {took * 1000:.1f} ms")
    assert head.startswith(b"HTTP/1.1 401"), head[:200]
    assert took < 1.0
    with httpx.Client(base_url=gateway.url, timeout=30) as client:
        large = client.put(
            "/admin/models/text_classifier/rollout",
            content=b"{" + b" " * (1 * MiB) + b"}",
            headers={"authorization": f"Bearer {ADMIN_KEY}", "content-type": "application/json"},
        )
    assert large.status_code == 413  # a known operator's body has its own cap


def series(gateway: GatewayProcess, name: str) -> list[str]:
    text = httpx.get(
        f"{gateway.url}/metrics", headers={"authorization": f"Bearer {PROMETHEUS_KEY}"}, timeout=10
    ).text
    return [line for line in text.splitlines() if line.startswith(name)]


def test_invented_versions_are_404_and_mint_no_metric_series(gateway: GatewayProcess) -> None:
    """100 invented versions and a fullwidth digit (before: each a 503 after a Triton call,
    and a gateway_triton_request_duration_seconds series forever)."""
    with httpx.Client(base_url=gateway.url, timeout=30, headers=authorized()) as client:
        assert client.post("/classify", json={"text": "warm up the series"}).status_code == 200
        before = series(gateway, "gateway_triton_request_duration_seconds")
        versions = [str(9_123_456_700 + i) for i in range(100)] + [
            "%EF%BC%91",
            "1%0A",
        ]  # a fullwidth 1, "1\\n"
        statuses = {
            client.post(f"/models/text_classifier/versions/{v}/classify", json={"text": "hi"}).status_code
            for v in versions
        }
        statuses |= {
            client.get(f"/v2/models/text_classifier/versions/{v}/ready").status_code for v in versions[:5]
        }
    after = series(gateway, "gateway_triton_request_duration_seconds")
    print(
        f"{len(versions)} invented versions: answers {sorted(statuses)}; series {len(before)} -> {len(after)}"
    )
    assert statuses == {404}
    assert len(after) == len(before)
    assert not any("9123456" in line for line in after)


def raw_exchange(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
        return data


@pytest.mark.parametrize("shape", ["fields", "one-value", "one-value-ended"])
def test_a_head_of_300_mib_is_a_431_with_the_gateways_memory_flat(
    gateway: GatewayProcess, shape: str
) -> None:
    """One anonymous socket sends a head without end, up to 300 MiB: as 8 KB fields
    (``fields``), as one field's value (``one-value``), or as 32 MiB values each ended in
    the same send as the head (``one-value-ended``). It is answered 431 in problem+json
    once the head passes server.max_head_bytes (64 KiB), the rest is read away, not kept,
    and a head under the cap is served. (Before: httptools kept every header, the socket
    stayed open and the gateway's RSS rose 111 -> 477 MiB, and stayed there after the
    socket closed. Until 13746b4 one field's value was counted only once it ended, after
    the read that ended it: a value never ended grew unseen until the head's deadline, and
    a 50 MiB value ended in the same send was served, 200, the gateway +50 MiB.)"""
    line = b"X-Filler: " + b"a" * 8000 + b"\r\n"
    piece = {
        "fields": line * 64,
        "one-value": b"a" * (512 * 1024),
        "one-value-ended": b"GET /livez HTTP/1.1\r\nHost: x\r\nX-A: " + b"a" * (32 * MiB) + b"\r\n\r\n",
    }[shape]
    with Watch(gateway) as watch, socket.create_connection(("127.0.0.1", gateway.port), timeout=15) as sock:
        if shape != "one-value-ended":
            sock.sendall(b"GET /livez HTTP/1.1\r\nHost: x\r\n" + (b"X-A: " if shape == "one-value" else b""))
        sent = 0
        with contextlib.suppress(OSError):  # (the gateway stops reading past the linger bound)
            # as a client would: sending until an answer is there to read
            while sent < 300 * MiB and not select.select([sock], [], [], 0)[0]:
                sock.sendall(piece)
                sent += len(piece)
        answer = b""
        with contextlib.suppress(OSError):
            while chunk := sock.recv(65536):
                answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431 "), answer[:300]
    assert b"content-type: application/problem+json" in head.lower()
    assert json.loads(body)["type"].endswith(":head-too-large")
    assert sent < 300 * MiB, "no answer came while 300 MiB of head were sent"
    assert watch.rise_mib < 32, f"RSS rose {watch.rise_mib:.0f} MiB after {sent / MiB:.0f} MiB of head"
    under = raw_exchange(gateway.port, b"GET /livez HTTP/1.1\r\nHost: x\r\n" + line * 7 + b"\r\n")
    assert under.startswith(b"HTTP/1.1 200 "), under[:300]


def test_pipelined_requests_nobody_reads_leave_the_gateways_memory_flat(gateway: GatewayProcess) -> None:
    """50 anonymous sockets each send 256 KiB of pipelined `GET /livez` (8,192 requests)
    and read nothing: each connection is answered up to server.max_pipelined and closed,
    the rest never parsed. Before, uvicorn parsed and queued every request it was handed:
    the gateway went from 108 to 1,028 MiB, 1,140 MiB after the sockets closed."""
    request = b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n"
    pipelined = request * (256 * 1024 // len(request))
    sockets = []
    with Watch(gateway) as watch:
        try:
            for _ in range(50):
                sock = socket.create_connection(("127.0.0.1", gateway.port), timeout=10)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
                sockets.append(sock)
                with contextlib.suppress(OSError):
                    sock.sendall(pipelined)
            time.sleep(3.0)  # every answer the gateway will give is given
        finally:
            for sock in sockets:
                sock.close()
    print(f"50 x 256 KiB of pipelined requests read by nobody: RSS {watch.rise_mib:+.0f} MiB")
    assert watch.rise_mib < 32, f"RSS rose {watch.rise_mib:.0f} MiB"


def test_heads_of_twelve_thousand_fields_are_431s_that_cost_the_gateway_nothing(
    gateway: GatewayProcess,
) -> None:
    """50 anonymous heads of 12,000 five-byte fields (60 KB, under the head's size cap): a
    431 at the 101st field. Before, each was parsed, listed and read by every layer: 10.8
    ms of the gateway's CPU a request, against 0.6 ms for a plain one."""
    head = b"POST /classify HTTP/1.1\r\nHost: x\r\n" + b"a:b\r\n" * 12_000 + b"Content-Length: 0\r\n\r\n"
    pid = gateway.process.pid
    before = cpu_seconds(pid)
    statuses = set()
    for _ in range(50):
        with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as sock:
            with contextlib.suppress(OSError):
                sock.sendall(head)
            statuses.add(sock.recv(100)[:12])
    spent = (cpu_seconds(pid) - before) / 50
    print(f"heads of 12,000 fields: {statuses}, gateway CPU {spent * 1000:.2f} ms each")
    assert statuses == {b"HTTP/1.1 431"}, statuses
    assert spent < 0.003, f"{spent * 1000:.1f} ms of CPU a request"


def _chunked_until_answered(
    gateway: GatewayProcess, caller: str, first: bytes, block: bytes, limit: int
) -> tuple[int, bytes]:
    """A chunked /classify (keyed or anonymous): ``first``, then ``block`` after ``block``
    until an answer can be read or ``limit`` bytes are sent; what was sent, and all that
    was read until the connection ended."""
    head = b"POST /classify HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
    if caller == "keyed":
        head += b"Authorization: Bearer " + CLIENT_KEY.encode() + b"\r\n"
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as sock:
        sock.sendall(head + b"\r\n" + first)
        sent = 0
        with contextlib.suppress(OSError):  # (cut once refused)
            while sent < limit and not select.select([sock], [], [], 0)[0]:
                sock.sendall(block)
                sent += len(block)
        answer = b""
        with contextlib.suppress(OSError):
            while chunk := sock.recv(65536):  # to the end: the connection ends
                answer += chunk
    return sent, answer


@pytest.mark.parametrize("caller", ["anonymous", "keyed"])
def test_a_body_in_one_byte_chunks_is_refused_before_it_costs_the_gateway(
    gateway: GatewayProcess, caller: str
) -> None:
    """One socket sends a chunked /classify body in 1-byte chunks (6 bytes on the wire each)
    until an answer comes: it is a 400 (or the 401 given before the body) within the first
    kilobytes, the rest never parsed (now: about 1 MiB sent while the answer travels, CPU
    0.00 s). Before (483cb37), each chunk cost the parser a step: the 401 was read after 11.4
    MiB, the keyed 413 too, 0.75 and 0.65 s of the gateway's CPU (an anonymous socket kept
    on past its 401: 2.2 s for 49 MB, against 0.02 s for 53 MB sent in one piece)."""
    pid = gateway.process.pid
    before = cpu_seconds(pid)
    sent, answer = _chunked_until_answered(gateway, caller, b"", b"1\r\na\r\n" * 10_000, 60 * MiB)
    spent = cpu_seconds(pid) - before
    print(f"{caller}: {sent / MiB:.1f} MiB of 1-byte chunks sent, gateway CPU {spent:.2f} s, {answer[:12]!r}")
    status = answer[9:12]
    assert status in ({b"400", b"401"} if caller == "anonymous" else {b"400"}), answer[:300]
    assert sent < 8 * MiB, f"{sent / MiB:.0f} MiB sent before an answer"
    assert spent < 0.15, f"the gateway spent {spent:.2f} s of CPU on {sent / MiB:.1f} MiB of chunks"


@pytest.mark.parametrize("caller", ["anonymous", "keyed"])
def test_a_chunk_extension_without_end_is_refused_within_its_framing(
    gateway: GatewayProcess, caller: str
) -> None:
    """One chunk whose size line never ends (``2;`` and then an extension, 64 KiB at a
    time): none of it is body, so no body limit saw it. Now the keyed caller's 400 comes
    within a head's worth of framing (the anonymous one's 401 from its head, as before),
    then the connection closes lingering. Before (27a8352), the gateway read all 256 MiB
    (512 MiB in 0.6 s by hand) with no answer, its route waiting on a body that never came."""
    sent, answer = _chunked_until_answered(gateway, caller, b"2;name=", b"v" * 65536, 256 * MiB)
    print(f"{caller}: {sent / MiB:.1f} MiB of one chunk's extension sent, {answer[:12]!r}")
    assert answer[9:12] == (b"401" if caller == "anonymous" else b"400"), answer[:300]
    assert sent < 8 * MiB, f"{sent / MiB:.0f} MiB sent before an answer"


def _until_closed(sock: socket.socket) -> bytes:
    data = b""
    with contextlib.suppress(OSError):
        while chunk := sock.recv(65536):
            data += chunk
    return data


@pytest.mark.parametrize(
    "malformed",
    [
        b"FOO /livez HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /livez HTTP/1.1\r\nHost x\r\n\r\n",
        b"GET /livez HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
    ],
    ids=["unknown-method", "header-without-colon", "two-lengths"],
)
def test_a_malformed_request_on_a_kept_connection_is_answered_400_as_on_a_new_one(
    gateway: GatewayProcess, malformed: bytes
) -> None:
    """After an answer on a kept-alive connection, and pipelined behind a request: the
    malformed request is answered 400 in problem+json, after the answer before it. Before,
    the connection closed with no answer after a kept-alive answer (httpx: "Server
    disconnected without sending a response"), and pipelined, the 400 went out in place of
    the first request's answer, which was lost."""
    good = b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n"
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as sock:
        sock.sendall(good)
        first = b""
        while not first.endswith(b'{"status":"ok"}'):
            first += sock.recv(65536)
        sock.sendall(malformed)
        kept = _until_closed(sock)
    with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as sock:
        sock.sendall(good + malformed)
        pipelined = _until_closed(sock)
    for wire, answered in ((kept, first), (pipelined, b"")):
        print(f"{malformed!r}: {wire[:40]!r} ... {len(wire)} bytes")
        if not answered:  # the pipelined answer before the 400, whole
            answered, _, wire = wire.partition(b'{"status":"ok"}')
            assert answered.startswith(b"HTTP/1.1 200 "), answered
        head, _, body = wire.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400 "), wire[:300]
        assert b"application/problem+json" in head
        assert json.loads(body)["type"].endswith(":malformed-request")


def _pipelined_requests() -> dict[str, tuple[bytes, set[int] | None, bool]]:
    """What the pipelining fuzzer sends: each request, the statuses its answer may have
    (None: any), and whether its answer has a body to read (HEAD's has none)."""
    key = f"Authorization: Bearer {CLIENT_KEY}\r\n".encode()
    small, big = b'{"inputs":[]}', b"x" * 20_000
    text = json.dumps(
        {
            "inputs": [
                {"name": "TEXT", "datatype": "BYTES", "shape": [1, 1], "data": ["a fine day"]},
                {"name": "TOP_K", "datatype": "INT32", "shape": [1, 1], "data": [1]},
            ]
        }
    ).encode()

    def post(path: bytes, headers: bytes, body: bytes) -> bytes:
        length = b"Content-Length: %d\r\n" % len(body)
        return b"POST " + path + b" HTTP/1.1\r\nHost: x\r\n" + headers + length + b"\r\n" + body

    missing = b"/v2/models/nope/infer"
    return {
        "livez": (b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n", {200}, True),
        "head": (b"HEAD /livez HTTP/1.1\r\nHost: x\r\n\r\n", None, False),
        "infer": (post(b"/v2/models/text_classifier/infer", key, text), {200}, True),
        "missing-model": (post(missing, key, small), {404}, True),
        "missing-model-big": (post(missing, key, big), {404}, True),
        "expect-continue": (post(missing, key + b"Expect: 100-continue\r\n", small), {404}, True),
        "anonymous": (post(missing, b"", small), {401}, True),
        "anonymous-big": (post(missing, b"", big), {401}, True),
        "bad-key": (
            b"GET /v2/models/nope HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer no\r\n\r\n",
            {401},
            True,
        ),
        "chunked": (
            b"POST /v2/models/nope/infer HTTP/1.1\r\nHost: x\r\n"
            + key
            + b"Transfer-Encoding: chunked\r\n\r\n%x\r\n" % len(small)
            + small
            + b"\r\n0\r\n\r\n",
            {404},
            True,
        ),
        # offers to upgrade, served as HTTP/1.1 (curl --http2, Java's RestClient, Ktor)
        "h2c-infer": (post(b"/v2/models/text_classifier/infer", key + H2C_OFFER, text), {200}, True),
        "h2c-chunked": (
            b"POST /v2/models/nope/infer HTTP/1.1\r\nHost: x\r\n"
            + key
            + H2C_OFFER
            + b"Transfer-Encoding: chunked\r\n\r\n%x\r\n" % len(small)
            + small
            + b"\r\n0\r\n\r\n",
            {404},
            True,
        ),
        "websocket-offer": (
            b"GET /livez HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
            {200},
            True,
        ),
    }


H2C_OFFER = (
    b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n"
)


LAST_ON_A_CONNECTION = {
    "malformed": (b"FOO /livez HTTP/1.1\r\nHost: x\r\n\r\n", {400}, True),
    "two-lengths": (
        b"POST /livez HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n{}",
        {400},
        True,
    ),
    "close": (b"GET /livez HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", {200}, True),
    "many-chunks": (
        b"POST /v2/models/nope/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"1\r\na\r\n" * 200
        + b"0\r\n\r\n",
        {400, 401},
        True,
    ),
    "endless-extension": (
        b"POST /v2/models/nope/infer HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2;n="
        + b"v" * 100_000,
        {400, 401},
        True,
    ),
    "http/1.0": (b"GET /livez HTTP/1.0\r\nHost: x\r\n\r\n", {200}, True),
    "head-too-large": (b"GET /livez HTTP/1.1\r\nHost: x\r\nX-A: " + b"a" * 70_000 + b"\r\n\r\n", {431}, True),
}


def _answers(wire: bytes, bodied: list[bool]) -> list[int]:
    """The statuses of the whole answers at the start of ``wire`` (each framed by its
    Content-Length; one to a request whose answer has no body, by its head alone)."""
    statuses: list[int] = []
    at = 0
    for has_body in bodied:
        while wire.startswith(b"HTTP/1.1 1", at) and (interim := wire.find(b"\r\n\r\n", at)) >= 0:
            at = interim + 4  # (100 Continue: an interim answer)
        end = wire.find(b"\r\n\r\n", at)
        if end < 0:
            break
        head = wire[at:end].decode("latin-1").split("\r\n")
        fields = dict(line.lower().split(": ", 1) for line in head[1:])
        assert "transfer-encoding" not in fields, head  # (every answer here has a length)
        size = int(fields["content-length"]) if has_body else 0
        if len(wire) < end + 4 + size:
            break
        statuses.append(int(head[0].split(" ")[1]))
        at = end + 4 + size
    return statuses


def test_pipelined_requests_split_anywhere_are_each_answered_in_order(gateway: GatewayProcess) -> None:
    """Hypothesis writes sequences of requests sent on one connection back to back (kept
    alive, answers and refusals from the head, bodies answered before they were read,
    chunked, HEAD, a real inference, offers to upgrade), cut at random places with a pause at each cut, and
    at most one request that ends the connection, last: every request is answered once, in
    order, with its status, and nothing else is written. Before (72ac0dd), two requests
    then the head of a third and the start of its body in one piece: the first answer
    was taken for one given before its own body was read, and the two behind it were never
    answered (the connection closed at the keep-alive timeout; 24 of 400 random
    sequences). And a head past the cap pipelined behind a request under way closed the
    connection at once, that request's answer lost, and a chunked body past its bound so
    pipelined was answered 400 in place of the answer under way. A fixed budget of 120 examples, fixed
    seed."""
    from hypothesis import HealthCheck, given, seed, settings
    from hypothesis import strategies as st

    requests = _pipelined_requests()

    @seed(20261203)
    @settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(
        names=st.lists(st.sampled_from(sorted(requests)), min_size=1, max_size=5),
        last=st.one_of(st.none(), st.sampled_from(sorted(LAST_ON_A_CONNECTION))),
        cuts=st.lists(st.floats(0, 1), max_size=6),
    )
    def exchange(names: list[str], last: str | None, cuts: list[float]) -> None:
        sent = [requests[name] for name in names] + ([LAST_ON_A_CONNECTION[last]] if last else [])
        data = b"".join(request for request, _, _ in sent)
        points = sorted({0, len(data), *(int(cut * len(data)) for cut in cuts)})
        with socket.create_connection(("127.0.0.1", gateway.port), timeout=10) as sock:
            for start, end in itertools.pairwise(points):
                sock.sendall(data[start:end])
                time.sleep(0.005)
            wire = b""
            bodied = [has_body for _, _, has_body in sent]
            while len(_answers(wire, bodied)) < len(sent):
                chunk = sock.recv(65536)  # (a timeout fails the example: an answer never came)
                if not chunk:
                    break
                wire += chunk
            if last is not None:  # the connection ends after the last answer, nothing more
                wire += _until_closed(sock)
        statuses = _answers(wire, bodied)
        assert len(statuses) == len(sent), (names, last, wire[:2000])
        for status, (_, allowed, _), name in zip(statuses, sent, [*names, last or ""], strict=False):
            assert allowed is None or status in allowed, (name, status, names, last)
        if last is not None:
            assert wire.count(b"HTTP/1.1 ") - wire.count(b"HTTP/1.1 100 ") == len(sent), wire[-500:]

    exchange()


@pytest.mark.parametrize("value", [b"\xb2", b"\xef\xbc\x91", b"-1", b"99999999999999999999999", b"1e3"])
def test_no_header_a_client_can_send_is_a_5xx(gateway: GatewayProcess, value: bytes) -> None:
    """Inference-Header-Content-Length: a Latin-1 superscript two and its relatives (before:
    500 and an ERROR traceback for the superscript)."""
    body = json.dumps({"inputs": []}).encode()
    for name in (b"Inference-Header-Content-Length", b"Content-Length"):
        headers = {b"Content-Length": str(len(body)).encode(), name: value}
        lines = b"".join(k + b": " + v + b"\r\n" for k, v in headers.items())
        answer = raw_exchange(
            gateway.port,
            b"POST /v2/models/text_classifier/infer HTTP/1.1\r\nHost: x\r\n"
            + f"Authorization: Bearer {CLIENT_KEY}\r\n".encode()
            + lines
            + b"\r\n"
            + body,
        )
        status = int(answer.split(b" ", 2)[1]) if answer else 400  # a parser may just close
        assert 400 <= status < 500, answer[:300]


def test_a_jpeg_of_junk_does_not_hold_the_event_loop(gateway: GatewayProcess) -> None:
    """A 7 MiB JPEG whose header is junk after its magic bytes (before: Pillow walked the
    junk a byte at a time in Python, 0.43 s on the event loop for each such upload)."""
    body = b"\xff\xd8\xff" + bytes(7 * MiB - 3)
    resting = unloaded_livez_ms(gateway)
    with ProcessProbe(gateway) as probe, httpx.Client(base_url=gateway.url, timeout=60) as client:
        time.sleep(0.2)
        started = time.monotonic()
        answers = [
            client.post("/classify", content=body, headers={**authorized(), "content-type": "image/jpeg"})
            for _ in range(3)
        ]
        took = time.monotonic() - started
        time.sleep(0.2)
    print(
        f"3 junk JPEGs: {[a.status_code for a in answers]} in {took * 1000:.0f} ms; /livez worst {probe.worst_ms:.1f} ms"
    )
    assert [a.status_code for a in answers] == [422] * 3
    # the bug held the loop 430 ms per upload; the bound leaves room for a noisy machine
    assert probe.worst_ms < resting + 200


def test_a_crowd_of_uploads_is_bounded_by_the_body_budget(gateway: GatewayProcess) -> None:
    """60 concurrent 7 MiB raw uploads (before: RSS +415 MiB before any slot was taken):
    the bytes held stay within the budget (96 MiB here); the rest hear 503 + Retry-After
    before their bodies are read."""
    body = b"\xff\xd8\xff" + bytes(7 * MiB - 3)
    # each upload's status and Retry-After in one append: two lists appended from 60
    # threads paired a 422's missing Retry-After with another thread's 503 (a CI run)
    answers: list[tuple[int, str | None]] = []

    def upload() -> None:
        with httpx.Client(base_url=gateway.url, timeout=60, headers=authorized()) as client:
            try:
                answer = client.post("/classify", content=body, headers={"content-type": "image/jpeg"})
            except httpx.TransportError:
                answers.append((0, None))  # the gateway closed on an unread body: a refusal
                return
            answers.append((answer.status_code, answer.headers.get("retry-after")))

    with Watch(gateway) as watch, ProcessProbe(gateway) as probe:
        threads = [threading.Thread(target=upload) for _ in range(60)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
    statuses = [code for code, _ in answers]
    counts = {code: statuses.count(code) for code in sorted(set(statuses))}
    print(
        f"60 x 7 MiB uploads: {counts}; RSS +{watch.rise_mib:.0f} MiB; /livez from another process: "
        f"worst {probe.worst_ms:.0f} ms"
    )
    assert len(statuses) == 60
    assert all(code in (0, 400, 413, 422, 503) for code in statuses), counts
    assert 503 in statuses
    assert all(value is not None for code, value in answers if code == 503), answers
    assert watch.rise_mib < BUDGET / MiB + 96


def test_metrics_and_the_served_document_tell_an_anonymous_caller_nothing(gateway: GatewayProcess) -> None:
    with httpx.Client(base_url=gateway.url, timeout=10) as client:
        assert client.get("/metrics").status_code == 401
        paths = client.get("/openapi.json").json()["paths"]
    assert not [path for path in paths if path.startswith("/admin")]
    assert any(
        line.startswith('gateway_client_requests_total{client="attacker"')
        for line in series(gateway, "gateway_client")
    )


def test_serve_on_a_public_address_without_keys_refuses_to_start(triton: TritonServer) -> None:
    """The defaults: before, `serve` bound 0.0.0.0 with no keys and served anyone."""
    cwd, other = code_env()
    env = {"GATEWAY_TRITON__URL": triton.grpc_url, "PATH": "/usr/bin:/bin", **other}
    port = str(free_port())
    try:
        refused = subprocess.run(
            [sys.executable, "-m", "gateway", "serve", "--host", "0.0.0.0", "--port", port],
            capture_output=True, text=True, timeout=15, env=env, cwd=cwd,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail("serve started on 0.0.0.0 with no keys")
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert "GATEWAY_AUTH__KEYS_FILE" in refused.stderr
    assert "GATEWAY_AUTH__ALLOW_ANONYMOUS" in refused.stderr


def test_a_keys_file_with_nan_is_refused_at_start_with_its_line(triton: TritonServer, tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text(f"good {hash_key('a')} 5\nbad {hash_key('b')} nan\n")
    cwd, other = code_env()
    env = {
        "GATEWAY_TRITON__URL": triton.grpc_url,
        "GATEWAY_AUTH__KEYS_FILE": str(keys),
        "PATH": "/usr/bin:/bin",
        **other,
    }
    try:
        refused = subprocess.run(
            [sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1", "--port", str(free_port())],
            capture_output=True, text=True, timeout=15, env=env, cwd=cwd,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail("serve started with a nan rate in its keys file")
    assert refused.returncode == 1, refused.stderr[-2000:]
    assert re.search(rf"{re.escape(str(keys))}:2\b", refused.stderr), refused.stderr[-2000:]


def test_a_revocation_that_does_not_parse_fails_closed(triton: TritonServer, tmp_path: Path) -> None:
    """A keys file rewritten to revoke a key, with a typo: by default no key is accepted
    until the file parses (before: the old keys, the revoked one included, stayed)."""
    keys = tmp_path / "keys"
    keys.write_text(f"leaked {hash_key('leaked')}\nkept {hash_key('kept')}\n")
    cwd, other = code_env()
    served = GatewayProcess.start(
        triton,
        tmp_path,
        cwd=cwd,
        env={**other, "GATEWAY_AUTH__KEYS_FILE": str(keys), "GATEWAY_AUTH__RELOAD_SECONDS": "0.2"},
    ).wait()
    try:
        leaked = {"authorization": "Bearer leaked"}
        assert httpx.get(f"{served.url}/models", headers=leaked, timeout=10).status_code == 200
        keys.write_text(f"kept {hash_key('kept')} fast\n")  # the revocation, with a typo
        deadline = time.monotonic() + 10
        while httpx.get(f"{served.url}/models", headers=leaked, timeout=10).status_code != 401:
            assert time.monotonic() < deadline, "the leaked key still works"
            time.sleep(0.1)
        assert "not valid" in served.log.read_text()
        keys.write_text(f"kept {hash_key('kept')}\n")
        deadline = time.monotonic() + 10
        while (
            httpx.get(
                f"{served.url}/models", headers={"authorization": "Bearer kept"}, timeout=10
            ).status_code
            != 200
        ):
            assert time.monotonic() < deadline, "the fixed file was not taken"
            time.sleep(0.1)
        assert httpx.get(f"{served.url}/models", headers=leaked, timeout=10).status_code == 401
    finally:
        served.stop()


def _framed(header: bytes, binary: bytes, declared: str) -> tuple[bytes, dict[bytes, bytes]]:
    headers = {name.encode(): value.encode() for name, value in authorized().items()}
    return header + binary, {b"inference-header-content-length": declared.encode("latin-1"), **headers}


@pytest.fixture(scope="module")
def fuzz_client(gateway: GatewayProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway.url, timeout=30) as client:
        yield client


def test_the_v2_binary_framing_fuzzed_gets_no_5xx(fuzz_client: httpx.Client) -> None:
    """Hypothesis writes /v2 binary requests (header lengths, binary_data_size, shapes,
    datatypes, truncations) against the real stack: every answer a 2xx or a 4xx, none a
    5xx, and /livez still answers (a fixed budget of 150 examples, fixed seed)."""
    from hypothesis import HealthCheck, given, seed, settings
    from hypothesis import strategies as st

    shapes = st.lists(st.integers(-2, 70_000), min_size=0, max_size=4)
    tensor = st.fixed_dictionaries(
        {
            "name": st.sampled_from(["TEXT", "TOP_K", "CANDIDATE_LABELS", "NOPE"]),
            "datatype": st.sampled_from(["BYTES", "INT32", "FP32", "BOOL", "X"]),
            "shape": shapes,
        },
        optional={"parameters": st.fixed_dictionaries({"binary_data_size": st.integers(-5, 1 << 20)})},
    )

    @seed(20261124)
    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(
        inputs=st.lists(tensor, min_size=0, max_size=3),
        binary=st.binary(max_size=512),
        declared=st.one_of(
            st.none(),
            st.integers(-3, 4096).map(str),
            st.sampled_from(["\xb2", "1e2", "+12", "0x10", "\uff11".encode().decode("latin-1")]),
        ),
    )
    def exchange(inputs: list[dict[str, object]], binary: bytes, declared: str | None) -> None:
        header = json.dumps({"inputs": inputs}).encode()
        length = str(len(header)) if declared is None else declared
        body, headers = _framed(header, binary, length)
        answer = fuzz_client.post("/v2/models/text_classifier/infer", content=body, headers=headers)
        assert answer.status_code < 500 or answer.status_code == 503, answer.text[:300]

    exchange()
    assert fuzz_client.get("/livez").status_code == 200
