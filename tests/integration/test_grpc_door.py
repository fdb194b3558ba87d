"""The gRPC door (GATEWAY_GRPC__PORT) with clients nobody here wrote, on the real stack:
NVIDIA's tritonclient.grpc (sync and aio) compared call for call with Triton's own gRPC
endpoint; keys, limits and refusals as gRPC status codes; the metrics labelled by RPC; and
perf_analyzer -i grpc on both shipped models."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as tritongrpc
import tritonclient.grpc.aio as tritongrpc_aio
from tritonclient.utils import InferenceServerException

from gateway.dev.tritonserver import TritonServer, free_port
from gateway.settings import Settings
from gateway.shared.keyfiles import hash_key

from helpers.support import chelsea_jpeg, perf_analyzer_run
from helpers.triton_fixtures import gateway_settings

KEY = {"authorization": "Bearer client-secret"}
TEXTS = ["The striker scored twice in the final.", "The central bank raised interest rates again."]


@pytest.fixture
def door(
    triton: TritonServer, serve_gateway: Callable[[Settings], httpx.Client], tmp_path: Path
) -> tuple[str, httpx.Client]:
    """A gateway with keys (one limited to 2 requests/s) and its gRPC door: (door address, HTTP client)."""
    keys = tmp_path / "keys"
    keys.write_text(
        f"app {hash_key('client-secret')}\nslow {hash_key('slow-secret')} 1 2\n"
        f"texts {hash_key('text-secret')} models=text_*\n"
    )
    port = free_port()
    settings = gateway_settings(
        triton, auth={"keys_file": keys, "protect_metrics": False}, grpc={"port": port, "host": "127.0.0.1"}
    )
    http = serve_gateway(settings)
    return f"127.0.0.1:{port}", http


def _text_inputs(module: Any = tritongrpc) -> list[Any]:
    text = module.InferInput("TEXT", [len(TEXTS), 1], "BYTES")
    text.set_data_from_numpy(np.array([[t.encode()] for t in TEXTS], dtype=np.object_))
    top_k = module.InferInput("TOP_K", [len(TEXTS), 1], "INT32")
    top_k.set_data_from_numpy(np.array([[3]] * len(TEXTS), dtype=np.int32))
    return [text, top_k]


def _image_inputs(body: bytes) -> list[Any]:
    image = tritongrpc.InferInput("IMAGE", [1, 1], "BYTES")
    image.set_data_from_numpy(np.array([[body]], dtype=np.object_))
    top_k = tritongrpc.InferInput("TOP_K", [1, 1], "INT32")
    top_k.set_data_from_numpy(np.array([[5]], dtype=np.int32))
    return [image, top_k]


def _same(mine: Any, theirs: Any) -> None:
    for name in ("LABELS", "CLASS_IDS"):
        assert mine.as_numpy(name).tolist() == theirs.as_numpy(name).tolist(), name
    np.testing.assert_allclose(mine.as_numpy("SCORES"), theirs.as_numpy("SCORES"), atol=1e-5)


def test_tritonclient_grpc_gets_tritons_answers_through_the_door(
    door: tuple[str, httpx.Client], triton: TritonServer
) -> None:
    address, http = door
    mine = tritongrpc.InferenceServerClient(address)
    theirs = tritongrpc.InferenceServerClient(triton.grpc_url)
    assert mine.is_server_live(headers=KEY)
    assert mine.is_server_ready(headers=KEY)
    assert mine.is_model_ready("text_classifier", headers=KEY)
    # the name Triton's clients check, and the version of the Triton behind the door
    assert mine.get_server_metadata(headers=KEY).name == "triton"
    assert mine.get_server_metadata(headers=KEY).version == theirs.get_server_metadata().version
    meta = mine.get_model_metadata("text_classifier", headers=KEY)
    direct_meta = theirs.get_model_metadata("text_classifier")
    assert [(i.name, i.datatype) for i in meta.inputs] == [(i.name, i.datatype) for i in direct_meta.inputs]
    assert [(o.name, o.datatype) for o in meta.outputs] == [(o.name, o.datatype) for o in direct_meta.outputs]
    config = mine.get_model_config("text_classifier", headers=KEY).config
    assert config.name == "text_classifier"
    assert not config.ensemble_scheduling.step  # the steps stay private, as on /v2
    stats = mine.get_inference_statistics("text_classifier", headers=KEY)
    assert [s.name for s in stats.model_stats] == ["text_classifier"]

    _same(
        mine.infer("text_classifier", _text_inputs(), headers=KEY),
        theirs.infer("text_classifier", _text_inputs()),
    )
    jpeg = chelsea_jpeg()
    _same(
        mine.infer("image_classifier", _image_inputs(jpeg), headers=KEY),
        theirs.infer("image_classifier", _image_inputs(jpeg)),
    )

    # the aio client, too
    async def aio() -> Any:
        client = tritongrpc_aio.InferenceServerClient(address)
        try:
            return await client.infer("text_classifier", _text_inputs(tritongrpc_aio), headers=KEY)
        finally:
            await client.close()

    _same(asyncio.run(aio()), theirs.infer("text_classifier", _text_inputs()))
    metrics = http.get("/metrics").text
    assert 'route="/inference.GRPCInferenceService/ModelInfer"' in metrics
    assert (
        'method="GRPC",model="text_classifier",route="/inference.GRPCInferenceService/ModelInfer",status="200"'
        in metrics
    )


def _code(call: Callable[[], object]) -> str:
    with pytest.raises(InferenceServerException) as caught:
        call()
    return str(caught.value.status())


def test_refusals_are_grpc_status_codes(door: tuple[str, httpx.Client]) -> None:
    address, _ = door
    client = tritongrpc.InferenceServerClient(address)
    assert _code(lambda: client.infer("text_classifier", _text_inputs())) == "StatusCode.UNAUTHENTICATED"
    wrong = {"authorization": "Bearer nope"}
    assert _code(lambda: client.is_server_live(headers=wrong)) == "StatusCode.UNAUTHENTICATED"
    assert _code(lambda: client.infer("no_such_model", _text_inputs(), headers=KEY)) == "StatusCode.NOT_FOUND"
    assert _code(lambda: client.infer("text_tokenize", _text_inputs(), headers=KEY)) == "StatusCode.NOT_FOUND"
    bad_k = _text_inputs()
    bad_k[1].set_data_from_numpy(np.array([[0]] * len(TEXTS), dtype=np.int32))
    assert _code(lambda: client.infer("text_classifier", bad_k, headers=KEY)) == "StatusCode.INVALID_ARGUMENT"
    corrupt = b"\xff\xd8\xff" + b"not a jpeg" * 10
    assert (
        _code(lambda: client.infer("image_classifier", _image_inputs(corrupt), headers=KEY))
        == "StatusCode.INVALID_ARGUMENT"
    )
    assert _code(lambda: client.load_model("text_classifier", headers=KEY)) == "StatusCode.PERMISSION_DENIED"
    assert _code(lambda: client.get_system_shared_memory_status(headers=KEY)) == "StatusCode.UNIMPLEMENTED"
    # the key's rate (1/s, burst 2): the third call at once is RESOURCE_EXHAUSTED
    slow = {"x-api-key": "slow-secret"}
    codes = []
    for _ in range(4):
        try:
            client.is_server_live(headers=slow)
            codes.append("OK")
        except InferenceServerException as exc:
            codes.append(str(exc.status()))
    assert codes[:2] == ["OK", "OK"]
    assert "StatusCode.RESOURCE_EXHAUSTED" in codes[2:]


def test_a_model_outside_the_keys_list_is_a_model_that_does_not_exist(door: tuple[str, httpx.Client]) -> None:
    address, _ = door
    client = tritongrpc.InferenceServerClient(address)
    texts = {"x-api-key": "text-secret"}
    assert client.infer("text_classifier", _text_inputs(), headers=texts).as_numpy("LABELS").shape[0] == 2
    for name in ("image_classifier", "no_such_model"):
        with pytest.raises(InferenceServerException) as refused:
            client.infer(name, _image_inputs(b"\xff\xd8\xff"), headers=texts)
        assert str(refused.value.status()) == "StatusCode.NOT_FOUND"
        assert refused.value.message() == f"Request for unknown model: '{name}' is not found"
        assert not client.is_model_ready(name, headers=texts)
        with pytest.raises(InferenceServerException) as metadata:
            client.get_model_metadata(name, headers=texts)
        assert str(metadata.value.status()) == "StatusCode.NOT_FOUND"
    everything = client.get_inference_statistics(headers=texts, as_json=True)["model_stats"]
    assert all(s["name"].startswith("text_") for s in everything), everything  # text_* only
    assert client.is_model_ready("image_classifier", headers=KEY)  # a key with no list sees it


def test_a_client_deadline_shorter_than_the_call_is_deadline_exceeded(door: tuple[str, httpx.Client]) -> None:
    address, _ = door
    client = tritongrpc.InferenceServerClient(address)
    texts = tritongrpc.InferInput("TEXT", [64, 1], "BYTES")
    texts.set_data_from_numpy(
        np.array([[f"text number {i} ".encode() * 50] for i in range(64)], dtype=np.object_)
    )
    top_k = tritongrpc.InferInput("TOP_K", [64, 1], "INT32")
    top_k.set_data_from_numpy(np.array([[1]] * 64, dtype=np.int32))
    code = _code(lambda: client.infer("text_classifier", [texts, top_k], headers=KEY, client_timeout=0.001))
    assert code == "StatusCode.DEADLINE_EXCEEDED"


@pytest.mark.parametrize("model", ["image_classifier", "text_classifier"])
def test_perf_analyzer_over_grpc_runs_through_the_door(
    triton: TritonServer, serve_gateway: Callable[[Settings], httpx.Client], tmp_path: Path, model: str
) -> None:
    port = free_port()
    http = serve_gateway(gateway_settings(triton, grpc={"port": port, "host": "127.0.0.1"}))
    before = sum(s["inference_count"] for s in http.get(f"/v2/models/{model}/stats").json()["model_stats"])
    started = time.monotonic()
    throughput = perf_analyzer_run(f"127.0.0.1:{port}", model, tmp_path, protocol="grpc")
    after = sum(s["inference_count"] for s in http.get(f"/v2/models/{model}/stats").json()["model_stats"])
    print(
        f"perf_analyzer -i grpc through the door, {model} ({time.monotonic() - started:.0f} s):",
        *throughput,
        sep="\n  ",
    )
    assert len(throughput) == 2
    assert after - before >= 10


def test_the_grpc_health_service_answers_without_a_key(door: tuple[str, httpx.Client]) -> None:
    """What Kubernetes' gRPC probes call (grpc.health.v1): SERVING while the models are
    ready, with no key, for the server (""), the inference service, and (the message is
    never read: anyone may send one, and gRPC would take it whole) any other name."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    address, _ = door
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("", "inference.GRPCInferenceService", "nope"):
            answer = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert answer.status == health_pb2.HealthCheckResponse.SERVING, service
        watch = stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=10)
        assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
        watch.cancel()


def test_calls_past_the_doors_cap_are_refused_at_once(
    triton: TritonServer, serve_gateway: Callable[[Settings], httpx.Client]
) -> None:
    """gRPC reads a whole message before a call starts: the door runs at most
    max_concurrent_calls at once (memory: that many messages), the rest hear
    RESOURCE_EXHAUSTED at once. Triton is stopped so the first calls stay in flight."""
    port = free_port()
    serve_gateway(
        gateway_settings(triton, grpc={"port": port, "host": "127.0.0.1", "max_concurrent_calls": 2})
    )

    async def calls() -> list[str]:
        client = tritongrpc_aio.InferenceServerClient(f"127.0.0.1:{port}")
        await client.is_server_live()  # the channel is up before the burst

        async def one() -> str:
            try:
                await client.infer("text_classifier", _text_inputs(tritongrpc_aio), client_timeout=20)
                return "OK"
            except InferenceServerException as exc:
                return str(exc.status())

        burst = [asyncio.create_task(one()) for _ in range(5)]
        await asyncio.sleep(0.5)
        refused = [task.result() for task in burst if task.done()]
        triton.send_signal(signal.SIGCONT)
        answers = await asyncio.gather(*burst)
        await client.close()
        return [*refused, "|", *answers]

    triton.send_signal(signal.SIGSTOP)
    try:
        codes = asyncio.run(calls())
    finally:
        triton.send_signal(signal.SIGCONT)
    early, answers = codes[: codes.index("|")], codes[codes.index("|") + 1 :]
    # the three past the cap were refused at once, while the two admitted waited on Triton
    # (they end as Triton's answer or the gateway's Triton timeout, never as a refusal)
    assert early == ["StatusCode.RESOURCE_EXHAUSTED"] * 3, codes
    assert answers.count("StatusCode.RESOURCE_EXHAUSTED") == 3, codes
