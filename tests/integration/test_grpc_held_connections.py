"""The gRPC door keeps every connection under a deadline no byte extends, as the HTTP door
does (tests/integration/test_held_connections.py): a socket that never finishes its
handshake is closed at the head's deadline, one that finished it and opens no call is
closed at its idle bound whatever frames it sends, and the door holds at most
``grpc.max_connections`` at once, so sixteen held anonymous sockets bound what they take
and leave a keyed client served once the bound has passed. Before, a socket that sent
nothing was held 120 s (gRPC's handshake default), one that sent the HTTP/2 preface for
good, and there was no cap on how many."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from gateway.dev.gatewayprocess import GatewayProcess
from gateway.dev.tritonserver import TritonServer, free_port
from gateway.shared.keyfiles import hash_key

from helpers.h2flood import header_flood, rapid_reset
from helpers.procfs import rss_mib
from helpers.sockets import closed_within

pytestmark = pytest.mark.alone  # it times or loads the machine: run with nothing beside it

HEAD = 3.0
IDLE = 4.0
CONNECTIONS = 16
KEY = "client-secret"
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
SETTINGS = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # an empty SETTINGS frame
SETTINGS_ACK = b"\x00\x00\x00\x04\x01\x00\x00\x00\x00"
PING = b"\x00\x00\x08\x06\x00\x00\x00\x00\x00" + b"12345678"


@pytest.fixture
def door(
    triton: TritonServer, spawn_gateway: Callable[..., GatewayProcess], tmp_path: Path
) -> tuple[str, GatewayProcess]:
    keys = tmp_path / "keys"
    keys.write_text(f"app {hash_key(KEY)}\n")
    port = free_port()
    gateway = spawn_gateway(
        triton,
        GATEWAY_AUTH__KEYS_FILE=str(keys),
        GATEWAY_GRPC__PORT=str(port),
        GATEWAY_GRPC__MAX_CONNECTIONS=str(CONNECTIONS),
        GATEWAY_GRPC__IDLE_SECONDS=str(IDLE),
        GATEWAY_SERVER__HEADER_TIMEOUT_SECONDS=str(HEAD),
    )
    return f"127.0.0.1:{port}", gateway


def _connect(address: str, sends: bytes) -> socket.socket:
    host, port = address.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    if sends:
        sock.sendall(sends)
    return sock


@pytest.mark.parametrize(
    "sends", [b"", PREFACE[:8], PREFACE], ids=["nothing", "part-of-the-preface", "preface-without-settings"]
)
def test_a_socket_that_never_finishes_its_handshake_is_closed_at_the_heads_deadline(
    door: tuple[str, GatewayProcess], sends: bytes
) -> None:
    sock = _connect(door[0], sends)
    try:
        closed = closed_within(sock, HEAD + 5)
        assert closed is not None, f"still open {HEAD + 5:.0f} s on (head deadline {HEAD} s)"
        assert closed <= HEAD + 1.5, closed
    finally:
        sock.close()


def test_a_connection_that_opens_no_call_is_closed_at_its_idle_bound_whatever_it_sends(
    door: tuple[str, GatewayProcess],
) -> None:
    """The preface and SETTINGS (the handshake done), then a PING every half second: no
    call, so no byte keeps it past the idle bound (a PING flood may end it sooner)."""
    sock = _connect(door[0], PREFACE + SETTINGS + SETTINGS_ACK)
    try:
        closed = closed_within(sock, IDLE + 6, every=0.5, frame=PING)
        assert closed is not None, f"still open {IDLE + 6:.0f} s on (idle bound {IDLE} s)"
        assert closed <= IDLE + 2.0, closed
    finally:
        sock.close()


def _live(address: str) -> bool:
    client = grpcclient.InferenceServerClient(address)
    try:
        return bool(client.is_server_live(headers={"authorization": f"Bearer {KEY}"}, client_timeout=5))
    except InferenceServerException:
        return False
    finally:
        client.close()


def test_sixteen_held_anonymous_connections_leave_a_keyed_client_served(
    door: tuple[str, GatewayProcess],
) -> None:
    address = door[0]
    assert _live(address)
    time.sleep(0.5)  # that call's connection closed with its client
    held = [_connect(address, PREFACE + SETTINGS + SETTINGS_ACK) for _ in range(CONNECTIONS)]
    try:
        time.sleep(0.5)
        # the door holds no more than its cap: a 17th connection is closed at once
        assert not _live(address), f"a connection past the cap of {CONNECTIONS} was served"
        time.sleep(IDLE + 1.5)
        assert _live(address), "a keyed client was not served once the held sockets' bound had passed"
        still_open = sum(1 for sock in held if closed_within(sock, 0.3) is None)
        assert still_open == 0, f"{still_open} of {CONNECTIONS} held sockets are still open"
    finally:
        for sock in held:
            sock.close()


WATCH = "/grpc.health.v1.Health/Watch"
CHECK = "/grpc.health.v1.Health/Check"


def _small_door(
    triton: TritonServer, spawn_gateway: Callable[..., GatewayProcess], tmp_path: Path, **settings: str
) -> str:
    """A gateway whose gRPC door runs 16 calls at once, with one key; its address."""
    keys = tmp_path / "keys"
    keys.write_text(f"app {hash_key(KEY)}\n")
    port = free_port()
    spawn_gateway(
        triton,
        GATEWAY_AUTH__KEYS_FILE=str(keys),
        GATEWAY_GRPC__PORT=str(port),
        GATEWAY_GRPC__MAX_CONCURRENT_CALLS="16",
        **settings,
    )
    return f"127.0.0.1:{port}"


def test_anonymous_health_watches_hold_no_more_than_their_share_of_the_calls(
    triton: TritonServer, spawn_gateway: Callable[..., GatewayProcess], tmp_path: Path
) -> None:
    """Anyone may call the health service, and ``Watch`` is a stream that stays open: on a
    door of 16 calls, 16 anonymous watches held every call slot and a keyed client was
    refused (RESOURCE_EXHAUSTED) for as long as they stayed. Now at most
    ``grpc.max_health_watches`` (4 here) are open at once, the rest refused at once, and a
    probe's ``Check`` is still answered beside them."""
    address = _small_door(triton, spawn_gateway, tmp_path, GATEWAY_GRPC__MAX_HEALTH_WATCHES="4")
    channel = grpc.insecure_channel(address)
    watch = channel.unary_stream(WATCH, request_serializer=None, response_deserializer=None)
    held, refused = [], []
    try:
        for _ in range(16):
            stream = watch(b"", timeout=60)
            try:
                next(stream)  # the status: the stream is open
                held.append(stream)
            except grpc.RpcError as error:
                refused.append(error.code())
        assert _live(address), f"a keyed client was refused beside {len(held)} anonymous health watches"
        assert len(held) == 4, (len(held), refused)
        assert set(refused) == {grpc.StatusCode.RESOURCE_EXHAUSTED}, refused
        check = channel.unary_unary(CHECK, request_serializer=None, response_deserializer=None)
        assert check(b"", timeout=5) == b"\x08\x01"  # SERVING: watches never refuse a probe
    finally:
        for stream in held:
            stream.cancel()
        channel.close()


def test_anonymous_health_checks_that_never_send_their_message_hold_no_call_slots(
    triton: TritonServer, spawn_gateway: Callable[..., GatewayProcess], tmp_path: Path
) -> None:
    """A health ``Check`` is anyone's: one whose message never came once held a call slot
    for the 5 s its read could take, so 16 of them, opened again as each ended, took every
    call of a 16-call door (a keyed client and a probe's ``Check`` refused,
    RESOURCE_EXHAUSTED). Now the health service never reads its message: the 16 are
    answered at once, and the keyed client and the probe are served beside them."""
    address = _small_door(triton, spawn_gateway, tmp_path)
    assert _live(address)
    stop = threading.Event()

    def nothing() -> Iterator[bytes]:
        stop.wait()  # the message never comes
        yield from ()

    channel = grpc.insecure_channel(address)
    stalled = channel.stream_unary(CHECK, request_serializer=None, response_deserializer=None)
    held = [stalled.future(nothing(), timeout=30) for _ in range(16)]
    try:
        answers = [call.result(timeout=5) for call in held]
        assert answers == [b"\x08\x01"] * 16  # SERVING, each without its message
        assert _live(address), "a keyed client was refused beside 16 held health checks"
        probe = grpc.insecure_channel(address)
        try:
            check = probe.unary_unary(CHECK, request_serializer=None, response_deserializer=None)
            assert check(b"", timeout=1) == b"\x08\x01"  # SERVING, within a Kubernetes probe's 1 s
        finally:
            probe.close()
    finally:
        stop.set()
        for call in held:
            call.cancel()
        channel.close()


FLOODING = CONNECTIONS - 4


@pytest.mark.quarantine
@pytest.mark.xfail(
    strict=False,
    reason="not held: gRPC's server (grpcio 1.85) keeps a header value of up to ~16 MiB whole while "
    "its CONTINUATION frames arrive, before its metadata limits (absolute_max_metadata_size 16 KiB "
    "changes nothing) or the door see the call; 12 connections x 12 MB took the door +159 and +165 MiB (two runs), "
    "held until the connection ages out (grpc.max_connection_age_seconds). Deployed behind the "
    "shipped HAProxy (HTTP/2 frontend) the flood is refused there (tests/e2e/test_load_balancer.py). "
    "Quarantined: make test-quarantine runs it (XPASS when it holds)",
)
def test_a_header_flood_straight_at_the_door_leaves_its_memory_flat(door: tuple[str, GatewayProcess]) -> None:
    """12 of the door's 16 connections each open a call whose header value grows by
    CONTINUATION frames to 12 MB and never ends: the door's RSS should not follow, and a
    keyed client on a 13th is served."""
    address, gateway = door
    before = rss_mib(gateway.process.pid)
    with header_flood(address, FLOODING, 12 * 1000 * 1000) as flood:
        time.sleep(1.0)
        rise = rss_mib(gateway.process.pid) - before
        served = _live(address)
    print(
        f"{FLOODING} x 12 MB header values straight at the door: {sum(flood.sent) / 1e6:.0f} MB sent, RSS {rise:+.0f} MiB"
    )
    assert served
    assert rise < 64, f"RSS {rise:+.0f} MiB"


def _keyed_beside_rapid_reset(
    address: str, gateway: GatewayProcess, connections: int, seconds: float
) -> tuple[list[float], list[str], float, int]:
    """A keyed ServerLive every 50 ms while ``connections`` rapid-reset floods run for
    ``seconds``: the waits of those answered, the codes of those refused, the door's RSS
    rise (MiB) and the streams the floods opened."""
    channel = grpc.insecure_channel(address)
    live = channel.unary_unary("/inference.GRPCInferenceService/ServerLive")
    metadata = (("authorization", f"Bearer {KEY}"),)
    waits: list[float] = []
    failures: list[str] = []
    try:
        assert live(b"", metadata=metadata, timeout=5) == b"\x08\x01"  # live: true
        before = rss_mib(gateway.process.pid)
        with contextlib.ExitStack() as floods:
            resets = [floods.enter_context(rapid_reset(address)) for _ in range(connections)]
            started = time.monotonic()
            while time.monotonic() - started < seconds:
                sent = time.monotonic()
                try:
                    live(b"", metadata=metadata, timeout=5)
                    waits.append(time.monotonic() - sent)
                except grpc.RpcError as error:
                    failures.append(str(error.code()))
                time.sleep(0.05)
            streams = sum(reset.streams for reset in resets)
        rise = rss_mib(gateway.process.pid) - before
    finally:
        channel.close()
    return sorted(waits), failures, rise, streams


def test_a_rapid_reset_flood_leaves_a_keyed_client_served(door: tuple[str, GatewayProcess]) -> None:
    """HTTP/2's rapid reset (CVE-2023-44487): one anonymous connection opens calls and resets
    each at once, as fast as it can write. gRPC counts a reset stream against the
    connection's streams until it is freed and refuses new ones past that before a handler
    runs (``grpc.http.overload_protection``, pinned in the door's options): a keyed client
    beside it is served throughout. Turned off by hand, a keyed client's calls timed out
    (118 of 119 in 10 s) and RSS rose +244 MiB."""
    address, gateway = door
    waits, failures, rise, streams = _keyed_beside_rapid_reset(address, gateway, 1, 4.0)
    p99 = waits[int(0.99 * (len(waits) - 1))] if waits else float("inf")
    print(
        f"rapid reset: {streams} streams in 4 s; keyed {len(waits)} served, p99 {p99 * 1000:.0f} ms; RSS {rise:+.0f} MiB"
    )
    assert streams > 20_000, "the flood did not get going"
    assert failures == [], failures
    assert p99 < 1.0, f"keyed p99 {p99:.2f} s"


@pytest.mark.quarantine
@pytest.mark.xfail(
    strict=False,
    reason="not held: grpcio 1.85's aio server keeps memory for each call it took before the "
    "client reset it (as grpc/grpc#43360 describes for failed batches): 4 anonymous connections "
    "of rapid reset for 30 s took a scratch gateway from 110 to 1,169 MiB, kept after they "
    "closed; a bare grpc.aio server with one handler grew 33 -> 200 MiB over 11 million streams. "
    "Behind the shipped HAProxy (http-reuse never) the replicas rose +11 to +23 MiB in 12 s "
    "(tests/e2e/test_load_balancer.py). Quarantined: make test-quarantine runs it (XPASS when it holds)",
)
def test_a_rapid_reset_flood_straight_at_the_door_leaves_its_memory_flat(
    door: tuple[str, GatewayProcess],
) -> None:
    """4 anonymous connections of rapid reset for 6 s: the door's RSS should not follow."""
    address, gateway = door
    waits, failures, rise, streams = _keyed_beside_rapid_reset(address, gateway, 4, 6.0)
    print(f"rapid reset x4: {streams} streams in 6 s; keyed {len(waits)} served; RSS {rise:+.0f} MiB")
    assert failures == [], failures
    assert rise < 64, f"RSS {rise:+.0f} MiB"
