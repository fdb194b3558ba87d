"""Clients of other servers through the gateway, on the real stack: the official `openai`
package (embeddings, both encodings; models; errors as it raises them; `client.post` to
/v1/classify) and the request shapes of vLLM's (`POST /classify`) and SGLang's
(`POST /v1/classify`) documented classification examples. The embeddings are compared
with Triton's own answer for the same texts; the classes with the gateway's own /classify."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import tritonclient.http as tritonhttp

from gateway.dev.tritonserver import TritonServer
from gateway.settings import Settings
from gateway.shared.keyfiles import hash_key

from helpers.triton_fixtures import gateway_settings

TEXTS = ["The striker scored twice in the final.", "The central bank raised interest rates again."]
# vLLM's examples/online_serving/openai_classification_client.py and SGLang's docs send these
PROMPTS = ["Hello, my name is", "The capital of France is", "The future of AI is"]


def _triton_embeddings(triton: TritonServer, texts: list[str]) -> np.ndarray:
    client = tritonhttp.InferenceServerClient(f"{triton.host}:{triton.http_port}")
    tensor = tritonhttp.InferInput("TEXT", [len(texts), 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[t.encode()] for t in texts], dtype=np.object_))
    result = client.infer("text_embedder", [tensor])
    array: np.ndarray | None = result.as_numpy("EMBEDDING")
    assert array is not None
    return array


@pytest.fixture
def gateway_url(
    triton: TritonServer, serve_gateway: Callable[[Settings], httpx.Client], tmp_path: Path
) -> str:
    keys = tmp_path / "keys"
    keys.write_text(f"app {hash_key('client-secret')}\n")
    return str(serve_gateway(gateway_settings(triton, auth={"keys_file": keys})).base_url).rstrip("/")


def test_openai_embeddings_in_both_encodings_are_tritons_own(triton: TritonServer, gateway_url: str) -> None:
    client = openai.OpenAI(base_url=f"{gateway_url}/v1", api_key="client-secret")
    direct = _triton_embeddings(triton, TEXTS)
    asked = client.embeddings.create(model="text_embedder", input=TEXTS)  # the package asks for base64
    floats = client.embeddings.create(model="text_embedder", input=TEXTS[0], encoding_format="float")
    assert asked.model == "text_embedder"
    assert [item.index for item in asked.data] == [0, 1]
    np.testing.assert_allclose(np.array([item.embedding for item in asked.data]), direct, atol=1e-6)
    # one text alone or in a batch of two: the same to float32 rounding
    np.testing.assert_allclose(np.array(floats.data[0].embedding), direct[0], atol=1e-6)
    assert len(floats.data[0].embedding) == 384

    listed = [model.id for model in client.models.list()]
    assert "text_embedder" in listed
    assert "text_classifier" in listed
    assert "image_classifier" not in listed  # these routes serve texts only


def test_openai_errors_are_raised_as_the_package_raises_them(gateway_url: str) -> None:
    with pytest.raises(openai.AuthenticationError) as denied:
        openai.OpenAI(base_url=f"{gateway_url}/v1", api_key="wrong").embeddings.create(
            model="text_embedder", input="x"
        )
    assert denied.value.status_code == 401
    client = openai.OpenAI(base_url=f"{gateway_url}/v1", api_key="client-secret", max_retries=0)
    with pytest.raises(openai.NotFoundError) as unknown:
        client.embeddings.create(model="no-such-model", input="x")
    assert "no such embedding model" in unknown.value.message
    with pytest.raises(openai.UnprocessableEntityError) as empty:
        client.embeddings.create(model="text_embedder", input=[])
    body: Any = empty.value.body
    assert body["code"] == "invalid-input"  # OpenAI's error object, the package unwrapped it
    with pytest.raises(openai.UnprocessableEntityError):
        client.embeddings.create(model="text_embedder", input="x", dimensions=3)


def _check_classes(answer: dict[str, Any], own: dict[str, Any], count: int) -> None:
    assert answer["object"] == "list"
    assert answer["model"] == "text_classifier"
    assert isinstance(answer["created"], int)
    assert answer["usage"]["prompt_tokens"] == 0
    assert [item["index"] for item in answer["data"]] == list(range(count))
    for item, result in zip(answer["data"], own["results"], strict=True):
        assert item["num_classes"] == len(item["probs"])
        best = max(range(item["num_classes"]), key=lambda i: item["probs"][i])
        assert item["label"] == result["predictions"][0]["label"]
        assert item["probs"][best] == pytest.approx(result["predictions"][0]["score"])
        assert sum(item["probs"]) == pytest.approx(1.0, abs=1e-4)  # softmax over every class


def test_vllm_and_sglang_classification_examples_get_every_class(gateway_url: str) -> None:
    headers = {"Authorization": "Bearer client-secret"}
    own = httpx.post(
        f"{gateway_url}/models/text_classifier/classify",
        json={"texts": PROMPTS, "top_k": 20},
        headers=headers,
        timeout=60,
    ).json()
    # vLLM: POST /classify {"model", "input": [...]}
    vllm = httpx.post(
        f"{gateway_url}/classify",
        json={"model": "text_classifier", "input": PROMPTS},
        headers=headers,
        timeout=60,
    )
    assert vllm.status_code == 200, vllm.text
    _check_classes(vllm.json(), own, len(PROMPTS))
    # SGLang / Dynamo: POST /v1/classify, one string
    sglang = httpx.post(
        f"{gateway_url}/v1/classify",
        json={"model": "text_classifier", "input": PROMPTS[0]},
        headers=headers,
        timeout=60,
    )
    assert sglang.status_code == 200, sglang.text
    # (one text alone, or batched with others: the same scores to float32 rounding)
    assert sglang.json()["data"][0]["probs"] == pytest.approx(vllm.json()["data"][0]["probs"], abs=1e-5)
    # the openai package's generic call, as those projects' docs show for their extra routes
    client = openai.OpenAI(base_url=f"{gateway_url}/v1", api_key="client-secret")
    posted = client.post("/classify", body={"model": "text_classifier", "input": PROMPTS}, cast_to=object)
    assert isinstance(posted, dict)
    assert [item["label"] for item in posted["data"]] == [item["label"] for item in vllm.json()["data"]]


def test_classification_errors_are_openai_errors_on_v1(gateway_url: str) -> None:
    headers = {"Authorization": "Bearer client-secret"}
    for body, status, code in (
        ({"model": "nope", "input": "x"}, 404, "not-found"),
        ({"model": "image_classifier", "input": "x"}, 422, "wrong-input-kind"),  # as on /classify
        ({"model": "text_classifier", "input": []}, 422, "invalid-input"),
        ({"model": "text_classifier", "input": [1, 2]}, 422, "invalid-input"),
        ({"model": "text_classifier"}, 422, "invalid-input"),
    ):
        answer = httpx.post(f"{gateway_url}/v1/classify", json=body, headers=headers, timeout=60)
        assert answer.status_code == status, (body, answer.text)
        error = answer.json()["error"]
        assert error["code"] == code
        assert error["message"]
        assert error["type"] == ("not_found_error" if status == 404 else "invalid_request_error")
    # bare /classify keeps the gateway's problem details, and refuses a vLLM body with top_k
    mixed = httpx.post(
        f"{gateway_url}/classify?top_k=2", json={"model": "text_classifier", "input": "x"}, headers=headers
    )
    assert mixed.status_code == 422
    assert mixed.headers["content-type"] == "application/problem+json"
