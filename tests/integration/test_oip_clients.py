"""Clients nobody here wrote, against Triton direct and then through the gateway's /v2, on
the real stack: NVIDIA's tritonclient (server metadata, model configuration, statistics,
compressed requests and answers) and perf_analyzer (both shipped models, real JPEG and
text input); a gzip bomb is a 413 with the gateway's memory flat (measured)."""

from __future__ import annotations

import gzip
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import numpy as np
import psutil
import pytest
import tritonclient.http as tritonhttp

from gateway.dev.gatewayprocess import GatewayProcess
from gateway.dev.tritonserver import TritonServer
from gateway.serving.exposure import PRIVATE_FIELDS
from gateway.settings import Settings

from helpers.support import ServedApp, chelsea_jpeg, perf_analyzer_run


@pytest.fixture
def through_gateway(gateway: ServedApp) -> Iterator[tritonhttp.InferenceServerClient]:
    client = tritonhttp.InferenceServerClient(gateway.url.removeprefix("http://"), network_timeout=60)
    yield client
    client.close()


@pytest.fixture
def direct(triton: TritonServer) -> Iterator[tritonhttp.InferenceServerClient]:
    client = tritonhttp.InferenceServerClient(f"127.0.0.1:{triton.http_port}", network_timeout=60)
    yield client
    client.close()


def test_server_metadata_lists_what_the_gateway_serves(
    through_gateway: tritonhttp.InferenceServerClient, direct: tritonhttp.InferenceServerClient
) -> None:
    metadata = through_gateway.get_server_metadata()
    assert metadata["extensions"] == [
        "binary_tensor_data",
        "classification",
        "model_configuration",
        "statistics",
    ]
    # Triton's name, which its clients check, and its version; the gateway beside them
    assert metadata["name"] == "triton"
    assert metadata["version"] == direct.get_server_metadata()["version"]
    assert metadata["gateway"]["name"] == "triton-gateway"


@pytest.mark.parametrize("model", ["image_classifier", "text_classifier"])
def test_get_model_config_answers_as_triton_does_less_what_stays_private(
    through_gateway: tritonhttp.InferenceServerClient, direct: tritonhttp.InferenceServerClient, model: str
) -> None:
    mine, theirs = through_gateway.get_model_config(model), direct.get_model_config(model)
    assert mine["ensemble_scheduling"] == {"step": []}  # Triton's lists the hidden steps
    assert theirs["ensemble_scheduling"]["step"]
    for field in PRIVATE_FIELDS - {"ensemble_scheduling"}:
        assert field not in mine
    kept = {
        k: v
        for k, v in theirs.items()
        if k not in PRIVATE_FIELDS and k not in ("ensemble_scheduling", "parameters")
    }
    assert {k: v for k, v in mine.items() if k in kept} == kept  # numbers as numbers, like Triton's
    assert set(mine["parameters"]) == {"gateway_task"}  # labels_model named a hidden model


def test_get_inference_statistics_answers_for_exposed_models(
    through_gateway: tritonhttp.InferenceServerClient, http: httpx.Client
) -> None:
    text = {"text": "The striker scored twice in the final."}
    assert http.post("/classify", json=text).status_code == 200
    (stats,) = through_gateway.get_inference_statistics("text_classifier")["model_stats"]
    assert stats["name"] == "text_classifier"
    assert isinstance(stats["inference_count"], int)
    assert stats["inference_count"] >= 1
    assert stats["inference_stats"]["success"]["count"] >= 1
    everything = {s["name"] for s in through_gateway.get_inference_statistics()["model_stats"]}
    # the catalog's classifiers and the allow-listed embedding model, never text_tokenize and the like
    assert everything == {"image_classifier", "text_classifier", "text_embedder"}


def _image_inputs() -> list[tritonhttp.InferInput]:
    image = tritonhttp.InferInput("IMAGE", [1, 1], "BYTES")
    image.set_data_from_numpy(np.array([[chelsea_jpeg()]], dtype=np.object_))
    top_k = tritonhttp.InferInput("TOP_K", [1, 1], "INT32")
    top_k.set_data_from_numpy(np.array([[3]], dtype=np.int32))
    return [image, top_k]


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_a_compressed_request_answers_as_the_plain_one(
    through_gateway: tritonhttp.InferenceServerClient, algorithm: str
) -> None:
    plain = through_gateway.infer("image_classifier", _image_inputs())
    packed = through_gateway.infer("image_classifier", _image_inputs(), request_compression_algorithm=algorithm,
                                   response_compression_algorithm="gzip")  # fmt: skip
    for name in ("LABELS", "SCORES", "CLASS_IDS"):
        assert packed.as_numpy(name).tolist() == plain.as_numpy(name).tolist()


def test_a_gzip_bomb_is_a_413_with_the_gateways_memory_flat(
    triton: TritonServer, spawn_gateway: Callable[..., GatewayProcess]
) -> None:
    gateway = spawn_gateway(triton)
    process = psutil.Process(gateway.process.pid)
    expands_to = 512 * 2**20  # 512 MiB of JSON whitespace, about 0.5 MiB on the wire
    bomb = gzip.compress(b"{" + b" " * (expands_to - 2) + b"}", compresslevel=9)
    route = f"{gateway.url}/v2/models/text_classifier/infer"
    headers = {"content-type": "application/json", "content-encoding": "gzip"}
    plain = {"inputs": [{"name": "TEXT", "shape": [1, 1], "datatype": "BYTES", "data": ["warm up"]},
                        {"name": "TOP_K", "shape": [1, 1], "datatype": "INT32", "data": [1]}]}  # fmt: skip
    for _ in range(3):  # warm: the route, the codec and the allocator have run once
        assert (
            httpx.post(
                route, content=gzip.compress(json.dumps(plain).encode()), headers=headers, timeout=30
            ).status_code
            == 200
        )
    before = process.memory_info().rss
    peak = before
    for _ in range(5):
        answer = httpx.post(route, content=bomb, headers=headers, timeout=60)
        assert answer.status_code == 413, answer.text
        peak = max(peak, process.memory_info().rss)
    grown = (peak - before) / 2**20
    cap = Settings().max_json_body_bytes / 2**20
    print(f"gzip bomb: {len(bomb) / 2**20:.2f} MiB on the wire, {expands_to / 2**20:.0f} MiB expanded: "
          f"413 five times, gateway RSS {before / 2**20:.0f} MiB before, +{grown:.1f} MiB at most "
          f"(the body cap: {cap:.0f} MiB)")  # fmt: skip
    assert grown < 2 * cap  # what the cap lets in (and its one join), never the expanded bytes


@pytest.mark.parametrize("model", ["image_classifier", "text_classifier"])
def test_perf_analyzer_runs_unchanged_through_the_gateway(
    gateway: ServedApp, tmp_path: Path, model: str, http: httpx.Client
) -> None:
    before = sum(s["inference_count"] for s in http.get(f"/v2/models/{model}/stats").json()["model_stats"])
    started = time.monotonic()
    throughput = perf_analyzer_run(gateway.url.removeprefix("http://"), model, tmp_path)
    after = sum(s["inference_count"] for s in http.get(f"/v2/models/{model}/stats").json()["model_stats"])
    print(
        f"perf_analyzer through the gateway, {model} ({time.monotonic() - started:.0f} s):",
        *throughput,
        sep="\n  ",
    )
    assert len(throughput) == 2
    assert after - before >= 10  # real inferences reached Triton through the gateway
