"""NVIDIA's client examples (the ``src/python/examples`` of triton-inference-server/client),
their calls reproduced with ``tritonclient`` against Triton itself and through the gateway
(both doors), with Triton's ``simple`` model and the raw image network exposed through
``GATEWAY_V2_MODELS``: what the examples check must hold on both, the same way.

- ``simple_{grpc,http}_health_metadata.py``: health, the server's name (``triton``), a
  model's metadata and configuration, and the text of an unknown model's refusal;
- ``simple_{grpc,http}_infer_client.py`` and their ``aio`` twins: inference, the inference
  statistics (the http aio client reads them, and the configuration, unzipped), and an
  unknown model's refusal ("Request for unknown model" at the start of its message);
- ``image_client.py -c 3``: Triton's classification extension on an exposed model;
- the streaming examples (``ModelStreamInfer``) and the shared-memory ones: refused with a
  code and a message that say so, counted, never a traceback in the gateway's log;
- Triton's codes where the examples and Triton's own tests look: an unknown model, a
  version that is not a number, raw and typed contents mixed.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import shutil
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.grpc.aio as tgrpc_aio
import tritonclient.http as thttp
import tritonclient.http.aio as thttp_aio
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from gateway.dev.tritonserver import TritonServer, free_port

from helpers.support import ServedApp
from helpers.triton_fixtures import REPOSITORY, gateway_settings, start_triton

# Triton's `simple` model (its examples' model): OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1.
SIMPLE_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        answers = []
        for request in requests:
            a = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            b = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            answers.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("OUTPUT0", a + b), pb_utils.Tensor("OUTPUT1", a - b)]))
        return answers
"""
SIMPLE_CONFIG = """
name: "simple"
backend: "python"
max_batch_size: 8
input [
  { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
  { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] }
]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""
MODEL = "simple"
EXPOSED = ["simple", "image_model"]


class Endpoints:
    """Triton's and the gateway's addresses, for each protocol."""

    def __init__(
        self, triton: TritonServer, gateway_http: str, gateway_grpc: str, http: httpx.Client
    ) -> None:
        self.direct = {"http": f"127.0.0.1:{triton.http_port}", "grpc": triton.grpc_url}
        self.gateway = {"http": gateway_http, "grpc": gateway_grpc}
        self.http = http  # the gateway's own HTTP client (metrics)

    def both(self, protocol: str) -> list[tuple[str, str]]:
        return [("triton", self.direct[protocol]), ("gateway", self.gateway[protocol])]


@pytest.fixture(scope="module")
def endpoints(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Endpoints]:
    from gateway.app import create_app

    folder = tmp_path_factory.mktemp("examples")
    repository = folder / "repository"
    shutil.copytree(REPOSITORY, repository, ignore=shutil.ignore_patterns("*.stamp", "__pycache__"))
    (repository / MODEL / "1").mkdir(parents=True)
    (repository / MODEL / "1" / "model.py").write_text(SIMPLE_MODEL)
    (repository / MODEL / "config.pbtxt").write_text(SIMPLE_CONFIG)
    triton = start_triton(repository, folder / "triton")
    port = free_port()
    settings = gateway_settings(triton, v2_models=EXPOSED, grpc={"port": port, "host": "127.0.0.1"})
    served = ServedApp(create_app(settings), settings).start()
    try:
        with httpx.Client(base_url=served.url, timeout=30) as http:
            yield Endpoints(triton, served.url.removeprefix("http://"), f"127.0.0.1:{port}", http)
    finally:
        served.stop()
        triton.kill()


def _simple_inputs(module: Any) -> list[Any]:
    """The examples' inputs: 0..15 and a row of ones (simple_*_infer_client.py)."""
    a = np.expand_dims(np.arange(16, dtype=np.int32), 0)
    b = np.ones((1, 16), dtype=np.int32)
    inputs = [module.InferInput("INPUT0", [1, 16], "INT32"), module.InferInput("INPUT1", [1, 16], "INT32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def _check_simple(result: Any) -> None:
    a = np.arange(16, dtype=np.int32)
    assert result.as_numpy("OUTPUT0").tolist() == [(a + 1).tolist()]
    assert result.as_numpy("OUTPUT1").tolist() == [(a - 1).tolist()]


def _message(call: Callable[[], object]) -> tuple[str, str]:
    with pytest.raises(InferenceServerException) as caught:
        call()
    return str(caught.value.status()), caught.value.message() or ""


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_the_health_and_metadata_example_passes_on_both(endpoints: Endpoints, protocol: str) -> None:
    """simple_{grpc,http}_health_metadata.py, call for call."""
    module = tgrpc if protocol == "grpc" else thttp
    for where, url in endpoints.both(protocol):
        client = module.InferenceServerClient(url)
        assert client.is_server_live(headers={"test": "1", "dummy": "2"}), where
        assert client.is_server_ready(), where
        assert client.is_model_ready(MODEL), where
        server = client.get_server_metadata()
        assert (server.name if protocol == "grpc" else server["name"]) == "triton", where
        metadata = client.get_model_metadata(MODEL, headers={"test": "1", "dummy": "2"})
        assert (metadata.name if protocol == "grpc" else metadata["name"]) == MODEL, where
        _, message = _message(lambda c=client: c.get_model_metadata("wrong_model_name"))  # type: ignore[misc]
        assert "Request for unknown model" in message, (where, message)
        config = client.get_model_config(MODEL)
        assert (config.config.name if protocol == "grpc" else config["name"]) == MODEL, where


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_the_infer_example_passes_on_both(endpoints: Endpoints, protocol: str) -> None:
    """simple_{grpc,http}_infer_client.py: an inference, with and without the outputs
    named, and a wrong model's message."""
    module = tgrpc if protocol == "grpc" else thttp
    for where, url in endpoints.both(protocol):
        client = module.InferenceServerClient(url)
        outputs = [module.InferRequestedOutput("OUTPUT0"), module.InferRequestedOutput("OUTPUT1")]
        _check_simple(client.infer(MODEL, _simple_inputs(module), outputs=outputs))
        _check_simple(client.infer(MODEL, _simple_inputs(module)))
        _status, message = _message(lambda c=client: c.infer("wrong_model_name", _simple_inputs(module)))  # type: ignore[misc]
        assert message.startswith("Request for unknown model"), (where, message)


def test_the_aio_examples_read_statistics_and_configuration_on_both(endpoints: Endpoints) -> None:
    """simple_http_aio_infer_client.py and simple_grpc_aio_infer_client.py: the http aio
    client reads a configuration and statistics answer as plain JSON (it unzips inference
    answers only), so the gateway compresses only those."""

    async def run(url: str, grpc_url: str) -> None:
        http = thttp_aio.InferenceServerClient(url)
        rpc = tgrpc_aio.InferenceServerClient(grpc_url)
        try:
            outputs = [thttp_aio.InferRequestedOutput("OUTPUT0"), thttp_aio.InferRequestedOutput("OUTPUT1")]
            _check_simple(
                await http.infer(
                    MODEL,
                    _simple_inputs(thttp_aio),
                    outputs=outputs,
                    request_compression_algorithm="gzip",
                    response_compression_algorithm="gzip",
                )
            )
            statistics = await http.get_inference_statistics(model_name=MODEL)
            assert len(statistics["model_stats"]) == 1
            assert (await http.get_model_config(MODEL))["name"] == MODEL
            with pytest.raises(InferenceServerException) as wrong:
                await http.infer("wrong_model_name", _simple_inputs(thttp_aio))
            assert (wrong.value.message() or "").startswith("Request for unknown model"), (
                wrong.value.message()
            )
            _check_simple(await rpc.infer(MODEL, _simple_inputs(tgrpc_aio)))
            assert (await rpc.get_model_config(MODEL)).config.name == MODEL
        finally:
            await http.close()
            await rpc.close()

    for (where, url), (_, grpc_url) in zip(endpoints.both("http"), endpoints.both("grpc"), strict=True):
        try:
            asyncio.run(run(url, grpc_url))
        except Exception as exc:
            raise AssertionError(f"{where}: {exc!r}") from exc


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_the_image_examples_classification_extension_answers_as_triton(
    endpoints: Endpoints, protocol: str
) -> None:
    """image_client.py -c 3: the top classes of an exposed network's output, as
    ``score:index`` strings Triton computes."""
    module = tgrpc if protocol == "grpc" else thttp
    pixels = np.random.default_rng(7).random((1, 3, 224, 224), dtype=np.float32)
    answers = []
    for _, url in endpoints.both(protocol):
        client = module.InferenceServerClient(url)
        image = module.InferInput("input", [1, 3, 224, 224], "FP32")
        image.set_data_from_numpy(pixels)
        result = client.infer(
            "image_model", [image], outputs=[module.InferRequestedOutput("logits", class_count=3)]
        )
        answers.append(result.as_numpy("logits").tolist())
    assert answers[0] == answers[1]
    assert len(answers[1][0]) == 3
    assert all(item.count(b":") >= 1 for item in answers[1][0])


def test_a_stream_answers_each_message_as_triton_does(
    endpoints: Endpoints, caplog: pytest.LogCaptureFixture
) -> None:
    """The streaming examples' calls (start_stream, async_stream_infer): each message an
    inference, answered in order on the stream, on both; a message the gateway refuses (a
    sequence, which it does not keep) answered with its error while the stream goes on."""
    caplog.set_level(logging.INFO)
    for where, url in endpoints.both("grpc"):
        client = tgrpc.InferenceServerClient(url)
        results: queue.Queue[tuple[Any, Any]] = queue.Queue()
        client.start_stream(callback=lambda result, error, q=results: q.put((result, error)))
        for index in range(3):
            client.async_stream_infer(MODEL, _simple_inputs(tgrpc), request_id=str(index))
        answers = [results.get(timeout=30) for _ in range(3)]
        if where == "gateway":
            client.async_stream_infer(MODEL, _simple_inputs(tgrpc), request_id="seq", sequence_id=7)
            refused = results.get(timeout=30)
            client.async_stream_infer(MODEL, _simple_inputs(tgrpc), request_id="after")
            after = results.get(timeout=30)
        client.stop_stream()
        assert [error for _, error in answers] == [None] * 3, where
        assert sorted(result.get_response().id for result, _ in answers) == ["0", "1", "2"], where
        for result, _ in answers:
            _check_simple(result)
    assert refused[0] is None
    assert "stateless" in (refused[1].message() or ""), refused[1].message()
    assert after[1] is None
    _check_simple(after[0])
    _assert_counted(endpoints, "ModelStreamInfer", caplog, reason=None)


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_shared_memory_and_repository_calls_are_refused_clearly_and_counted(
    endpoints: Endpoints, protocol: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    module = tgrpc if protocol == "grpc" else thttp
    client = module.InferenceServerClient(endpoints.gateway[protocol])
    status, message = _message(client.get_system_shared_memory_status)
    assert status == ("StatusCode.UNIMPLEMENTED" if protocol == "grpc" else "400"), status
    assert "does not serve shared memory" in message
    status, message = _message(lambda: client.get_cuda_shared_memory_status())
    assert "does not serve shared memory" in message
    status, message = _message(lambda: client.load_model(MODEL))
    assert status == ("StatusCode.PERMISSION_DENIED" if protocol == "grpc" else "403"), status
    assert "admin surface" in message
    if protocol == "grpc":
        _assert_counted(endpoints, "SystemSharedMemoryStatus", caplog)


def _assert_counted(
    endpoints: Endpoints, method: str, caplog: pytest.LogCaptureFixture, reason: str | None = "not-served"
) -> None:
    route = f"/inference.GRPCInferenceService/{method}"
    metrics = endpoints.http.get("/metrics").text
    assert f'route="{route}"' in metrics, f"{method} is not counted"
    if reason is not None:
        assert f'reason="{reason}"' in metrics
    assert [r for r in caplog.records if getattr(r, "route", None) == route], "no access-log line"
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info], (
        "a traceback was logged"
    )


def _raw_code(address: str, request: Any) -> tuple[grpc.StatusCode, str]:
    with grpc.insecure_channel(address) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        try:
            stub.ModelInfer(request, timeout=30)
        except grpc.RpcError as error:
            return error.code(), error.details() or ""
    return grpc.StatusCode.OK, ""


def _simple_request(version: str = "", model: str = MODEL, mixed: bool = False) -> Any:
    request = service_pb2.ModelInferRequest(model_name=model, model_version=version)
    for name in ("INPUT0", "INPUT1"):
        tensor = request.inputs.add(name=name, datatype="INT32", shape=[1, 16])
        if mixed and name == "INPUT0":
            tensor.contents.int_contents.extend(range(16))
        request.raw_input_contents.append(np.arange(16, dtype=np.int32).tobytes())
    return request


@pytest.mark.parametrize(
    ("case", "request_of"),
    [
        ("unknown model", lambda: _simple_request(model="wrong_model_name")),
        ("unknown version", lambda: _simple_request(version="9")),
        ("version not a number", lambda: _simple_request(version="abc")),
        ("raw and typed contents mixed", lambda: _simple_request(mixed=True)),
    ],
)
def test_tritons_codes_and_texts_where_clients_look(
    endpoints: Endpoints, case: str, request_of: Callable[[], Any]
) -> None:
    triton_code, triton_text = _raw_code(endpoints.direct["grpc"], request_of())
    code, text = _raw_code(endpoints.gateway["grpc"], request_of())
    assert code == triton_code, (case, code, triton_code)
    # Triton's text up to where it names its own internals (stol's details)
    assert text.split(" (details")[0].split(",")[0] == triton_text.split(" (details")[0].split(",")[0], (
        text,
        triton_text,
    )
