"""The Open Inference Protocol (/v2) through the gateway, on the real stack: Triton's own
HTTP client (``tritonclient.http``, binary tensors by default) and plain JSON requests
(what curl sends) work unchanged for both ensembles; models off the allow-list do not
exist; every invalid tensor is a 4xx from the gateway, never a Triton error."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import tritonclient.http as tritonhttp
from tritonclient.utils import InferenceServerException

from helpers.support import ServedApp, chelsea_jpeg, random_bytes


@pytest.fixture
def client(gateway: ServedApp) -> Iterator[tritonhttp.InferenceServerClient]:
    triton = tritonhttp.InferenceServerClient(gateway.url.removeprefix("http://"), network_timeout=60)
    yield triton
    triton.close()


def image_inputs(images: list[bytes], top_k: int = 3, binary: bool = True) -> list[tritonhttp.InferInput]:
    image = tritonhttp.InferInput("IMAGE", [len(images), 1], "BYTES")
    image.set_data_from_numpy(np.array([[i] for i in images], dtype=np.object_), binary_data=binary)
    k = tritonhttp.InferInput("TOP_K", [len(images), 1], "INT32")
    k.set_data_from_numpy(np.full((len(images), 1), top_k, dtype=np.int32), binary_data=binary)
    return [image, k]


def test_tritonclient_http_works_unchanged_for_the_image_ensemble(
    client: tritonhttp.InferenceServerClient, http: httpx.Client
) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("image_classifier")
    metadata = client.get_model_metadata("image_classifier")
    assert {i["name"] for i in metadata["inputs"]} == {"IMAGE", "TOP_K"}
    result = client.infer("image_classifier", image_inputs([chelsea_jpeg()]))  # binary in and out
    labels = [label.decode() for label in result.as_numpy("LABELS")[0]]
    scores = result.as_numpy("SCORES")[0]
    assert len(labels) == 3
    assert list(scores) == sorted(scores, reverse=True)
    # the same answer as /classify gives for the same photo
    classify = http.post("/classify", files={"file": ("cat.jpg", chelsea_jpeg())}, params={"top_k": 3}).json()
    assert labels == [p["label"] for p in classify["results"][0]["predictions"]]


def test_tritonclient_http_works_for_the_text_ensemble_in_json_too(
    client: tritonhttp.InferenceServerClient,
) -> None:
    texts = ["The striker scored twice in the final.", "Parliament passed the budget."]
    text = tritonhttp.InferInput("TEXT", [2, 1], "BYTES")
    text.set_data_from_numpy(np.array([[t.encode()] for t in texts], dtype=np.object_), binary_data=False)
    k = tritonhttp.InferInput("TOP_K", [2, 1], "INT32")
    k.set_data_from_numpy(np.full((2, 1), 2, dtype=np.int32), binary_data=False)
    outputs = [tritonhttp.InferRequestedOutput("LABELS", binary_data=False)]
    result = client.infer("text_classifier", [text, k], outputs=outputs)
    labels = result.as_numpy("LABELS")  # JSON outputs: tritonclient gives str
    assert labels.shape == (2, 2)
    assert str(labels[0][0]) == "sports"
    assert str(labels[1][0]) == "politics"
    assert result.as_numpy("SCORES") is None  # only what was asked for


def test_a_plain_json_request_as_curl_sends_it(http: httpx.Client) -> None:
    body = {
        "inputs": [
            {
                "name": "TEXT",
                "shape": [1, 1],
                "datatype": "BYTES",
                "data": ["Whisk the eggs and fold in the flour."],
            },
            {"name": "TOP_K", "shape": [1, 1], "datatype": "INT32", "data": [1]},
        ]
    }
    response = http.post("/v2/models/text_classifier/infer", json=body)
    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["model_name"] == "text_classifier"
    outputs = {o["name"]: o for o in answer["outputs"]}
    assert outputs["LABELS"]["shape"] == [1, 1]
    assert isinstance(outputs["SCORES"]["data"][0], float)
    assert http.get("/v2/models/text_classifier/versions/1/ready").status_code == 200
    assert http.get("/v2/models/text_classifier/versions/99/ready").status_code == 404  # no such version
    assert http.get("/v2/models/text_classifier/versions/latest").status_code == 404
    # the same request path as /classify: counted under the route template, with the model
    metrics = http.get("/metrics").text
    assert 'route="/v2/models/{model_name}/infer"' in metrics
    assert http.get("/v2").json()["extensions"] == [
        "binary_tensor_data",
        "classification",
        "model_configuration",
        "statistics",
    ]


def test_models_off_the_allow_list_do_not_exist(
    client: tritonhttp.InferenceServerClient, http: httpx.Client
) -> None:
    # an ensemble's step and an unknown name (text_embedder, an embedding model, is on the
    # one allow-list of non-classifier models: served on /v1/embeddings and /v2 alike)
    for name in ("image_model", "text_tokenize", "no_such_model"):
        assert http.get(f"/v2/models/{name}").status_code == 404
        assert http.get(f"/v2/models/{name}/ready").status_code == 404
        response = http.post(f"/v2/models/{name}/infer", json={"inputs": []})
        assert response.status_code == 404
        assert response.json()["error"] == response.json()["detail"]  # the OIP's error shape too
    with pytest.raises(
        InferenceServerException, match="Request for unknown model: 'image_model' is not found"
    ):
        client.get_model_metadata("image_model")  # Triton's own text, which its clients read


def binary_request(inputs: list[dict[str, object]], tensors: list[bytes]) -> tuple[bytes, dict[str, str]]:
    header = json.dumps({"inputs": inputs}).encode()
    return header + b"".join(tensors), {"Inference-Header-Content-Length": str(len(header))}


def bytes_tensor(*elements: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(e)) + e for e in elements)


TEXT = {"name": "TEXT", "shape": [1, 1], "datatype": "BYTES", "data": ["hello"]}
TOP_K = {"name": "TOP_K", "shape": [1, 1], "datatype": "INT32", "data": [2]}


@pytest.mark.parametrize(
    ("case", "inputs", "status"),
    [
        ("wrong datatype", [TEXT, {**TOP_K, "datatype": "FP32", "data": [2.0]}], 422),
        ("wrong rank", [TEXT, {**TOP_K, "shape": [1]}], 422),
        ("fixed dimension", [TEXT, {**TOP_K, "shape": [1, 2], "data": [1, 2]}], 422),
        ("count mismatch", [{**TEXT, "shape": [2, 1]}, TOP_K], 422),
        ("missing input", [TEXT], 422),
        (
            "unknown input",
            [TEXT, TOP_K, {"name": "X" * 5000, "shape": [1], "datatype": "INT32", "data": [1]}],
            422,
        ),
        ("input twice", [TEXT, TOP_K, TOP_K], 422),
        ("top_k out of range", [TEXT, {**TOP_K, "data": [10_000]}], 422),
        ("int out of INT32", [TEXT, {**TOP_K, "data": [2**40]}], 422),
        ("empty text", [{**TEXT, "data": ["   "]}, TOP_K], 422),
        ("text over the cap", [{**TEXT, "data": ["word " * 5000]}, TOP_K], 413),
        (
            "batch over the cap",
            [
                {**TEXT, "shape": [500, 1], "data": ["a"] * 500},
                {**TOP_K, "shape": [500, 1], "data": [1] * 500},
            ],
            413,
        ),
        ("data not a list of strings", [{**TEXT, "data": [1]}, TOP_K], 422),
        ("negative dimension", [{**TEXT, "shape": [-1, 1]}, TOP_K], 422),
    ],
)
def test_invalid_text_tensors_are_refused_before_triton(
    http: httpx.Client, case: str, inputs: list[dict[str, object]], status: int
) -> None:
    response = http.post("/v2/models/text_classifier/infer", json={"inputs": inputs})
    assert response.status_code == status, (case, response.text)
    # the protocol's media type, with its `error` beside the problem members
    assert response.headers["content-type"] == "application/json"
    assert response.json()["error"] == response.json()["detail"]
    assert "X" * 100 not in response.text  # the client's names are never echoed


def test_invalid_binary_and_image_tensors_are_refused_before_triton(http: httpx.Client) -> None:
    image: dict[str, object] = {"name": "IMAGE", "shape": [1, 1], "datatype": "BYTES"}
    top_k: dict[str, object] = {"name": "TOP_K", "shape": [1, 1], "datatype": "INT32", "data": [3]}
    cases = [
        # not an image: the same check as /classify
        (
            binary_request(
                [{**image, "parameters": {"binary_data_size": 4100}}, top_k], [bytes_tensor(random_bytes())]
            ),
            415,
        ),
        # the size runs past the body
        (
            binary_request(
                [{**image, "parameters": {"binary_data_size": 10**6}}, top_k], [bytes_tensor(b"x")]
            ),
            422,
        ),
        # an element's length runs past its data
        (
            binary_request(
                [{**image, "parameters": {"binary_data_size": 8}}, top_k], [struct.pack("<I", 99) + b"abcd"]
            ),
            422,
        ),
        # bytes no input claims
        (
            binary_request(
                [{**image, "parameters": {"binary_data_size": 5}}, top_k], [bytes_tensor(b"x"), b"extra"]
            ),
            422,
        ),
    ]
    for (body, headers), status in cases:
        response = http.post("/v2/models/image_classifier/infer", content=body, headers=headers)
        assert response.status_code == status, response.text
    broken = http.post(
        "/v2/models/image_classifier/infer",
        content=b'{"inputs": [',
        headers={"Inference-Header-Content-Length": "5"},
    )
    assert broken.status_code == 400
    for header in ("-1", "abc", "999999"):
        bad = http.post(
            "/v2/models/image_classifier/infer",
            content=b"{}",
            headers={"Inference-Header-Content-Length": header},
        )
        assert bad.status_code == 400, header


def test_a_good_photo_in_binary_through_httpx_matches_tritonclient(http: httpx.Client) -> None:
    photo = chelsea_jpeg()
    body, headers = binary_request(
        [
            {
                "name": "IMAGE",
                "shape": [1, 1],
                "datatype": "BYTES",
                "parameters": {"binary_data_size": len(photo) + 4},
            },
            {"name": "TOP_K", "shape": [1, 1], "datatype": "INT32", "parameters": {"binary_data_size": 4}},
        ],
        [bytes_tensor(photo), struct.pack("<i", 2)],
    )
    response = http.post("/v2/models/image_classifier/infer", content=body, headers=headers)
    assert response.status_code == 200, response.text
    answer = response.json()  # JSON outputs: none were asked in binary
    labels = {o["name"]: o for o in answer["outputs"]}["LABELS"]
    assert labels["shape"] == [1, 2]
