"""The gRPC door draws on the body budget HTTP uses, and knows its caller before it reads
a message: a crowd of large ModelInfer calls cannot take the gateway's memory past the
budget, and an anonymous one costs nothing but its refusal. Measured on a gateway process
of its own (its RSS sampled every few milliseconds), in front of the real Triton."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import grpc
import numpy as np
import psutil
import pytest
from tritonclient.grpc import service_pb2

from gateway.dev.gatewayprocess import GatewayProcess
from gateway.dev.tritonserver import TritonServer, free_port
from gateway.shared.keyfiles import hash_key
from gateway.triton.tensors import encode_bytes

pytestmark = pytest.mark.alone  # it times or loads the machine: run with nothing beside it

MiB = 1024 * 1024
BUDGET = 256 * MiB
KEY = (("authorization", "Bearer client-secret"),)
SERVICE = "/inference.GRPCInferenceService/"
INFER = SERVICE + "ModelInfer"
HEAD_SECONDS = 2.0  # the request head's deadline (server.header_timeout_seconds); the body's stays 30 s


def _message(size: int) -> bytes:
    """A serialized ModelInferRequest carrying one text of ``size`` bytes (raw contents)."""
    request = service_pb2.ModelInferRequest(model_name="text_classifier")
    text = request.inputs.add(name="TEXT", datatype="BYTES", shape=[1, 1])
    del text
    top_k = request.inputs.add(name="TOP_K", datatype="INT32", shape=[1, 1])
    del top_k
    request.raw_input_contents.append(encode_bytes([b"a" * size]))
    request.raw_input_contents.append(np.array([[3]], dtype="<i4").tobytes())
    return bytes(request.SerializeToString())


class Peak:
    """The highest RSS of ``pid`` seen while sampling."""

    def __init__(self, pid: int) -> None:
        self.process = psutil.Process(pid)
        self.baseline = self.process.memory_info().rss
        self.highest = self.baseline
        self._stop = threading.Event()

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.highest = max(self.highest, self.process.memory_info().rss)
            time.sleep(0.002)

    @contextmanager
    def watching(self) -> Iterator[Peak]:
        thread = threading.Thread(target=self._sample, daemon=True)
        thread.start()
        try:
            yield self
        finally:
            time.sleep(0.5)  # what was still being read
            self._stop.set()
            thread.join()

    @property
    def rise(self) -> int:
        return self.highest - self.baseline


def _flood(
    address: str,
    message: bytes,
    calls: int,
    channels: int,
    metadata: tuple[tuple[str, str], ...],
    method: str = INFER,
    compression: grpc.Compression = grpc.Compression.NoCompression,
) -> list[str]:
    """``calls`` concurrent ModelInfer calls of ``message`` over ``channels`` connections:
    the status code each ended with."""
    options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    pipes = [
        grpc.insecure_channel(address, options=options, compression=compression) for _ in range(channels)
    ]
    try:
        for pipe in pipes:
            grpc.channel_ready_future(pipe).result(timeout=10)
        stubs = [pipe.unary_unary(method) for pipe in pipes]  # bytes in, bytes out

        def one(index: int) -> str:
            try:
                stubs[index % channels](message, metadata=metadata, timeout=60)
                return "OK"
            except grpc.RpcError as error:
                return str(error.code())

        with ThreadPoolExecutor(calls) as pool:
            return list(pool.map(one, range(calls)))
    finally:
        for pipe in pipes:
            pipe.close()


def _door(
    triton: TritonServer, spawn_gateway: Callable[..., GatewayProcess], tmp_path: Path, **settings: str
) -> tuple[str, GatewayProcess]:
    """A gateway with three keys, this file's budget and head deadline: its gRPC address."""
    keys = tmp_path / "keys"
    keys.write_text(
        f"app {hash_key('client-secret')}\nother {hash_key('other-secret')}\n"
        f"slow {hash_key('slow-secret')} 0.01 1\n"  # one request, then one every 100 s
    )
    port = free_port()
    gateway = spawn_gateway(
        triton,
        GATEWAY_AUTH__KEYS_FILE=str(keys),
        GATEWAY_GRPC__PORT=str(port),
        GATEWAY_GRPC__HOST="127.0.0.1",
        GATEWAY_SERVER__MAX_BODY_BYTES_IN_FLIGHT=str(BUDGET),
        GATEWAY_SERVER__HEADER_TIMEOUT_SECONDS=str(HEAD_SECONDS),
        **settings,
    )
    return f"127.0.0.1:{port}", gateway


@pytest.fixture
def door(
    triton: TritonServer, spawn_gateway: Callable[..., GatewayProcess], tmp_path: Path
) -> tuple[str, GatewayProcess]:
    return _door(triton, spawn_gateway, tmp_path)


def test_64_calls_of_40_mib_raise_the_rss_by_no_more_than_the_budget(
    door: tuple[str, GatewayProcess],
) -> None:
    """64 keyed calls at once, each 40 MiB (under the door's message cap and its call
    cap), on four connections: before the fix the gateway's RSS rose by 5.9 GiB."""
    address, gateway = door
    message = _message(40 * MiB)
    peak = Peak(gateway.process.pid)
    with peak.watching():
        codes = _flood(address, message, calls=64, channels=4, metadata=KEY)
    # each call is refused: the budget spent (RESOURCE_EXHAUSTED, before its message is
    # read) or, once read, the text too long (INVALID_ARGUMENT); never a reset or a 5xx
    assert set(codes) <= {"StatusCode.RESOURCE_EXHAUSTED", "StatusCode.INVALID_ARGUMENT"}, codes
    assert "StatusCode.RESOURCE_EXHAUSTED" in codes, codes
    assert "StatusCode.INVALID_ARGUMENT" in codes, codes  # some were read: the budget is not zero
    assert peak.rise <= BUDGET, f"RSS rose {peak.rise / MiB:.0f} MiB; codes {codes}"
    assert gateway.process.poll() is None


def test_an_anonymous_call_is_refused_before_its_message_is_read(door: tuple[str, GatewayProcess]) -> None:
    address, gateway = door
    message = _message(40 * MiB)
    peak = Peak(gateway.process.pid)
    with peak.watching():
        codes = _flood(address, message, calls=32, channels=2, metadata=())
    assert codes == ["StatusCode.UNAUTHENTICATED"] * 32
    # 32 x 40 MiB sent, none read: what gRPC buffers before the refusal (its flow-control
    # window) is all they cost
    assert peak.rise < 64 * MiB, f"RSS rose {peak.rise / MiB:.0f} MiB"


def test_64_anonymous_metadata_and_config_calls_of_40_mib_are_not_read(
    door: tuple[str, GatewayProcess],
) -> None:
    """Every method reads its message only once the caller is known: before, only the
    inferences did, and 8 anonymous ModelMetadata calls naming a 40 MiB model took the
    gateway from 105 to 533 MiB."""
    address, gateway = door
    big = service_pb2.ModelMetadataRequest(name="a" * (40 * MiB)).SerializeToString()
    config = service_pb2.ModelConfigRequest(name="a" * (40 * MiB)).SerializeToString()
    peak = Peak(gateway.process.pid)
    with peak.watching(), ThreadPoolExecutor(2) as pool:
        metadata = pool.submit(_flood, address, big, 32, 2, (), SERVICE + "ModelMetadata")
        configs = pool.submit(_flood, address, config, 32, 2, (), SERVICE + "ModelConfig")
        codes = metadata.result() + configs.result()
    assert codes == ["StatusCode.UNAUTHENTICATED"] * 64, codes
    assert peak.rise < 64 * MiB, f"RSS rose {peak.rise / MiB:.0f} MiB"


def test_a_keyed_non_inference_message_is_capped_small(door: tuple[str, GatewayProcess]) -> None:
    """A known caller's ModelMetadata naming a 1 MiB model is refused (read under the body
    budget, never parsed)."""
    address, _ = door
    big = service_pb2.ModelMetadataRequest(name="a" * MiB).SerializeToString()
    assert _flood(address, big, 2, 2, KEY, SERVICE + "ModelMetadata") == ["StatusCode.INVALID_ARGUMENT"] * 2
    small = service_pb2.ModelMetadataRequest(name="text_classifier").SerializeToString()
    assert _flood(address, small, 2, 2, KEY, SERVICE + "ModelMetadata") == ["OK"] * 2


def test_anonymous_health_checks_are_answered_without_their_message(door: tuple[str, GatewayProcess]) -> None:
    """A health check is anyone's, and gRPC takes a message whole, up to the door's largest,
    once a handler reads it. So the health service never reads its message: 64 anonymous
    checks naming a 40 MiB service are answered (the door's status) and RSS rises
    < 64 MiB. Before (bcdd884), with at most two read at once, all were read, refused
    INVALID_ARGUMENT once taken in, and 16 of them took the gateway from 110 to a 670 MiB
    peak (by hand): a read given up on is still taken in by gRPC."""
    from grpc_health.v1 import health_pb2

    address, gateway = door
    check = health_pb2.HealthCheckRequest(service="x" * (40 * MiB)).SerializeToString()
    peak = Peak(gateway.process.pid)
    with peak.watching():
        codes = _flood(address, check, 64, 4, (), "/grpc.health.v1.Health/Check")
    assert codes == ["OK"] * 64, codes
    assert peak.rise < 64 * MiB, f"RSS rose {peak.rise / MiB:.0f} MiB"


def test_compressed_messages_are_refused_before_they_are_inflated(door: tuple[str, GatewayProcess]) -> None:
    """gzip makes 40 MiB of one letter 40 KB on the wire, and gRPC inflates a message whole
    before the door sees it; a health check is anyone's and is read. So compressed
    messages are refused (UNIMPLEMENTED) unless ``grpc.compressed_messages`` is on. Before
    (e44cb20), 16 such anonymous health checks took the gateway from 283 to 847 MiB (by
    hand), each refused only once inflated, and 8 keyed ModelMetadata calls +212 MiB."""
    from grpc_health.v1 import health_pb2

    address, gateway = door
    check = health_pb2.HealthCheckRequest(service="x" * (40 * MiB)).SerializeToString()
    named = service_pb2.ModelMetadataRequest(name="a" * (40 * MiB)).SerializeToString()
    gzip = grpc.Compression.Gzip
    peak = Peak(gateway.process.pid)
    with peak.watching(), ThreadPoolExecutor(2) as pool:
        checks = pool.submit(_flood, address, check, 32, 2, (), "/grpc.health.v1.Health/Check", gzip)
        metadata = pool.submit(_flood, address, named, 16, 2, KEY, SERVICE + "ModelMetadata", gzip)
        codes = checks.result() + metadata.result()
    assert codes == ["StatusCode.UNIMPLEMENTED"] * 48, codes
    assert peak.rise < 64 * MiB, f"RSS rose {peak.rise / MiB:.0f} MiB"


def test_compressed_messages_are_taken_where_allowed(
    triton: TritonServer, spawn_gateway: Callable[..., GatewayProcess], tmp_path: Path
) -> None:
    """With ``GATEWAY_GRPC__COMPRESSED_MESSAGES=true``, as Triton takes them: a gzip
    ModelMetadata call is answered."""
    address, _ = _door(triton, spawn_gateway, tmp_path, GATEWAY_GRPC__COMPRESSED_MESSAGES="true")
    named = service_pb2.ModelMetadataRequest(name="text_classifier").SerializeToString()
    codes = _flood(address, named, 2, 1, KEY, SERVICE + "ModelMetadata", grpc.Compression.Gzip)
    assert codes == ["OK"] * 2, codes


def test_an_idle_call_leaves_another_key_served(door: tuple[str, GatewayProcess]) -> None:
    """A key that opens ModelInfer and sends nothing holds what reading one message
    needs (twice the largest), not four times it: before, its reservation (175 MiB of
    256) left every other key's call RESOURCE_EXHAUSTED until the idle one timed out."""
    address, _ = door
    options = [("grpc.max_send_message_length", -1)]
    idle_channel = grpc.insecure_channel(address, options=options)
    release = threading.Event()

    def nothing() -> Iterator[bytes]:
        release.wait(20)
        return
        yield b""

    idle = idle_channel.stream_unary(INFER).future(nothing(), metadata=KEY, timeout=30)
    try:
        time.sleep(1.0)  # the idle call has reserved its room
        with grpc.insecure_channel(address) as channel:
            started = time.monotonic()
            answer = channel.unary_unary(INFER)(
                _message(64), metadata=(("authorization", "Bearer other-secret"),), timeout=5
            )
            took = time.monotonic() - started
        assert answer, "an answer"
        assert took < 1.0, f"served in {took:.2f} s"
        assert not idle.done()  # still holding
    finally:
        release.set()
        idle.cancel()
        idle_channel.close()


def test_a_model_scoped_message_never_sent_ends_at_the_heads_deadline(
    door: tuple[str, GatewayProcess],
) -> None:
    """A key that opens ModelMetadata and sends nothing is answered DEADLINE_EXCEEDED at
    the request head's deadline, not the body's: the message is a head's size (64 KiB at
    most). Before, the call (and the room reserved for its read) waited the body's 30 s."""
    address, _ = door
    release = threading.Event()

    def nothing() -> Iterator[bytes]:
        release.wait(40)
        return
        yield b""

    with grpc.insecure_channel(address) as channel:
        started = time.monotonic()
        call = channel.stream_unary(SERVICE + "ModelMetadata").future(nothing(), metadata=KEY, timeout=40)
        try:
            with pytest.raises(grpc.RpcError) as ended:
                call.result(timeout=20)  # (before: still waiting, a FutureTimeoutError)
        finally:
            release.set()
            call.cancel()
        took = time.monotonic() - started
    assert ended.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED, ended.value
    assert HEAD_SECONDS <= took < HEAD_SECONDS + 5, f"ended after {took:.1f} s"


def test_a_stream_over_its_rate_is_read_no_further(door: tuple[str, GatewayProcess]) -> None:
    """A key at one request per 100 s sends 12 messages of 8 MiB on one
    ModelStreamInfer: the first is answered, the second is refused before it is read and
    ends the stream (RESOURCE_EXHAUSTED, with retry-after); before, all 12 were read and
    parsed, 11 then refused one by one."""
    address, gateway = door
    message = _message(8 * MiB)
    sent = 0

    def messages() -> Iterator[bytes]:
        nonlocal sent
        for _ in range(12):
            sent += 1
            yield message

    options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    answers: list[bytes] = []
    peak = Peak(gateway.process.pid)
    with peak.watching(), grpc.insecure_channel(address, options=options) as channel:
        stream = channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")
        call = stream(messages(), metadata=(("authorization", "Bearer slow-secret"),), timeout=30)
        with pytest.raises(grpc.RpcError) as ended:
            answers.extend(call)
    assert ended.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, ended.value
    trailing = dict(ended.value.trailing_metadata() or ())
    assert "retry-after" in trailing, trailing
    assert len(answers) == 1, len(answers)
    # the first was read and checked (its 8 MiB text is refused for its length), not refused for the rate
    first = service_pb2.ModelStreamInferResponse.FromString(answers[0]).error_message
    assert "characters" in first, first
    # two messages read at most (the answered one, and what gRPC took of the next)
    assert peak.rise < 4 * 8 * MiB * 2, f"RSS rose {peak.rise / MiB:.0f} MiB"
