"""The Open Inference Protocol's extensions on /v2, with the fake transport: model
configuration with what stays private removed, statistics of exposed models only, the
server's list of extensions, every parameter passed, refused by name or owned, and
compressed bodies (the cap on what they expand to). Against Triton and its real
clients (tritonclient, perf_analyzer): tests/integration/test_oip_clients.py."""

from __future__ import annotations

import gzip
import json
import zlib

import pytest
from fastapi.testclient import TestClient

from helpers.support import FakeBackend, small_png

TEXT_INFER = {
    "inputs": [
        {"name": "TEXT", "shape": [1, 1], "datatype": "BYTES", "data": ["a text"]},
        {"name": "TOP_K", "shape": [1, 1], "datatype": "INT32", "data": [1]},
    ]
}


def test_server_metadata_lists_exactly_the_extensions_served(client: TestClient) -> None:
    assert client.get("/v2").json()["extensions"] == [
        "binary_tensor_data",
        "classification",
        "model_configuration",
        "statistics",
    ]


def test_a_configuration_hides_the_ensembles_steps_and_what_names_files_or_models(client: TestClient) -> None:
    answer = client.get("/v2/models/text_classifier/config")
    assert answer.status_code == 200, answer.text
    config = answer.json()
    assert config["name"] == "text_classifier"
    assert config["platform"] == "ensemble"
    assert config["ensemble_scheduling"] == {"step": []}  # the steps and their wiring stay private
    assert config["parameters"] == {
        "gateway_task": {"string_value": "text-classification"}
    }  # no labels_model
    assert client.get("/v2/models/text_classifier/versions/1/config").status_code == 200
    for hidden in ("text_classifier.pre", "text_labels", "nope"):
        assert client.get(f"/v2/models/{hidden}/config").status_code == 404
    assert client.get("/v2/models/text_classifier/versions/x/config").status_code == 404


def test_statistics_cover_the_exposed_models_only(client: TestClient) -> None:
    everything = client.get("/v2/models/stats")
    assert everything.status_code == 200, everything.text
    assert {s["name"] for s in everything.json()["model_stats"]} == {"image_classifier", "text_classifier"}
    one = client.get("/v2/models/image_classifier/stats").json()["model_stats"]
    assert [s["name"] for s in one] == ["image_classifier"]
    assert client.get("/v2/models/image_classifier/versions/1/stats").status_code == 200
    assert client.get("/v2/models/text_labels/stats").status_code == 404


@pytest.mark.parametrize(
    ("where", "parameter", "value", "reason"),
    [
        ("request", "sequence_id", 7, "stateless"),
        ("request", "sequence_start", True, "stateless"),
        ("request", "sequence_end", True, "stateless"),
        ("request", "priority", 1, "priorities are not passed on"),
        ("request", "timeout", 1000, "owns the deadline"),
        ("request", "my_custom", "x", "passes none"),
        ("input", "shared_memory_region", "region", "shared memory"),
        ("input", "shared_memory_byte_size", 4, "shared memory"),
        ("input", "shared_memory_offset", 0, "shared memory"),
        ("output", "shared_memory_region", "region", "shared memory"),
        ("output", "shared_memory_byte_size", 4, "shared memory"),
    ],
)
def test_every_parameter_the_gateway_does_not_pass_on_is_refused_by_name(
    client: TestClient, backend: FakeBackend, where: str, parameter: str, value: object, reason: str
) -> None:
    body = json.loads(json.dumps(TEXT_INFER))
    if where == "request":
        body["parameters"] = {parameter: value}
    elif where == "input":
        body["inputs"][0]["parameters"] = {parameter: value}
    else:
        body["outputs"] = [{"name": "LABELS", "parameters": {parameter: value}}]
    calls = len(backend.calls)
    answer = client.post("/v2/models/text_classifier/infer", json=body)
    assert answer.status_code == 400, answer.text
    assert repr(parameter) in answer.json()["error"]
    assert reason in answer.json()["error"]
    assert len(backend.calls) == calls  # nothing reached Triton


def test_the_parameters_the_gateway_honours_pass(client: TestClient) -> None:
    body = {**TEXT_INFER, "parameters": {"binary_data_output": False},
            "outputs": [{"name": "LABELS", "parameters": {"binary_data": False}}]}  # fmt: skip
    answer = client.post("/v2/models/text_classifier/infer", json=body)
    assert answer.status_code == 200, answer.text
    assert "LABELS" in [o["name"] for o in answer.json()["outputs"]]


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_a_compressed_body_answers_as_the_plain_one(client: TestClient, encoding: str) -> None:
    plain = json.dumps(TEXT_INFER).encode()
    packed = gzip.compress(plain) if encoding == "gzip" else zlib.compress(plain)
    expected = client.post("/v2/models/text_classifier/infer", content=plain).json()["outputs"]
    answer = client.post(
        "/v2/models/text_classifier/infer", content=packed, headers={"content-encoding": encoding}
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["outputs"] == expected
    texts = gzip.compress(json.dumps({"texts": ["one", "two"]}).encode())
    classify = client.post("/classify", content=texts,
                           headers={"content-type": "application/json", "content-encoding": "gzip"})  # fmt: skip
    assert classify.status_code == 200, classify.text
    assert len(classify.json()["results"]) == 2


def test_a_zip_bomb_is_a_413_while_it_expands(client: TestClient) -> None:
    bomb = gzip.compress(b"{" + b" " * (64 * 2**20) + b"}", compresslevel=9)  # 64 MiB of spaces
    assert len(bomb) < 100_000
    for path, kind in (
        ("/v2/models/text_classifier/infer", "application/json"),
        ("/classify", "application/json"),
    ):
        answer = client.post(path, content=bomb, headers={"content-type": kind, "content-encoding": "gzip"})
        assert answer.status_code == 413, answer.text
        # the cap on decompressed bytes, or the cheaper bound on bytes outside strings
        detail = answer.json()["detail"]
        assert "decompresses to over" in detail or "outside its strings" in detail


def test_corrupt_cut_and_unknown_encodings_are_clear_errors(client: TestClient) -> None:
    plain = json.dumps(TEXT_INFER).encode()
    route = "/v2/models/text_classifier/infer"
    packed = bytearray(gzip.compress(plain))
    packed[12] ^= 0xFF  # a flipped byte in the deflate stream
    corrupt = client.post(route, content=bytes(packed), headers={"content-encoding": "gzip"})
    assert corrupt.status_code == 400
    assert "corrupt" in corrupt.json()["detail"]
    cut = client.post(route, content=gzip.compress(plain)[:-12], headers={"content-encoding": "gzip"})
    assert cut.status_code == 400
    assert "cut short" in cut.json()["detail"]
    brotli = client.post(route, content=plain, headers={"content-encoding": "br"})
    assert brotli.status_code == 415
    assert "'br'" in brotli.json()["detail"]
    image = client.post("/classify", content=gzip.compress(small_png()),
                        headers={"content-type": "image/png", "content-encoding": "gzip"})  # fmt: skip
    assert image.status_code == 200, image.text  # every transport is decoded alike


def test_v2_answers_are_gzip_when_asked_and_other_routes_untouched(client: TestClient) -> None:
    body = {**TEXT_INFER, "inputs": [
        {"name": "TEXT", "shape": [64, 1], "datatype": "BYTES", "data": [f"text number {i}" for i in range(64)]},
        {"name": "TOP_K", "shape": [64, 1], "datatype": "INT32", "data": [1] * 64}]}  # fmt: skip
    answer = client.post("/v2/models/text_classifier/infer", json=body, headers={"accept-encoding": "gzip"})
    assert answer.status_code == 200
    assert answer.headers["content-encoding"] == "gzip"
    assert len(answer.json()["outputs"][0]["data"]) == 64  # httpx decompressed it
    plain = client.post(
        "/v2/models/text_classifier/infer", json=body, headers={"accept-encoding": "identity"}
    )
    assert "content-encoding" not in plain.headers
    classify = client.post(
        "/classify", json={"texts": [f"text {i}" for i in range(64)]}, headers={"accept-encoding": "gzip"}
    )
    assert "content-encoding" not in classify.headers


@pytest.mark.parametrize("count", [0, -1, True, "3", 1001])
def test_a_classification_that_is_not_a_class_count_is_refused(client: TestClient, count: object) -> None:
    body = {**TEXT_INFER, "outputs": [{"name": "LABELS", "parameters": {"classification": count}}]}
    answer = client.post("/v2/models/text_classifier/infer", json=body)
    assert answer.status_code == 422, answer.text
    assert "classification must be 1 to 1000 classes" in answer.json()["error"]
