"""A third input kind, registered the way docs/development.md says (a Kind of its own and
its entry in the registry), is catalogued, listed in /models and served on /v2 with its
own checks, with no change to the routes, the plane, the catalog or the dispatcher. The
only other file a kind of its own needs is its /classify request fields (bodies and
schemas), which /v2 does not use."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import pytest
from fastapi.testclient import TestClient

from gateway.app import create_app
from gateway.errors import InvalidInputError
from gateway.serving import kinds
from gateway.serving.kinds.base import Caps, CapsReader, Kind, classifications
from gateway.serving.payload import ClassifyInput
from gateway.settings import Settings
from gateway.triton.backend import Classification, InferResult, ModelConfig
from gateway.triton.tensors import Tensor

from helpers.support import FakeBackend

TASK = "audio-classification"


class AudioKind(Kind):
    """Audio clips: WAV bytes only (checked by their RIFF header)."""

    task = TASK
    noun = "clip"
    accepts = ("audio/wav",)
    oip_inputs = frozenset({"AUDIO"})

    def caps(self, config: ModelConfig, parameters: Mapping[str, str], settings: Settings) -> Caps:
        return CapsReader(config.name, parameters).caps(settings, config.max_batch_size or 1, None, {})

    def count(self, payload: ClassifyInput) -> int:
        return 0  # no /classify transport of its own in this test

    def check(self, payload: ClassifyInput, caps: Caps) -> None:  # pragma: no cover - /v2 only here
        raise AssertionError

    def calls(self, payload: ClassifyInput, top_k: int, caps: Caps) -> list[list[Tensor]]:  # pragma: no cover
        raise AssertionError

    def invalid(self) -> InvalidInputError:
        return InvalidInputError("the audio model rejected the clip")

    def results(self, answers: Sequence[InferResult]) -> list[Classification]:  # pragma: no cover
        return [row for answer in answers for row in classifications(answer)]

    def check_tensor(self, tensor: Tensor, caps: Caps) -> Tensor:
        for element in tensor.array.reshape(-1):
            if not bytes(element).startswith(b"RIFF"):
                raise InvalidInputError("a clip must be WAV (RIFF) bytes")
        return tensor


@pytest.fixture
def audio(monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    monkeypatch.setitem(kinds.KINDS, TASK, AudioKind())  # the registry entry
    backend = FakeBackend()
    backend.models["sounds"] = ModelConfig(
        "sounds", "python", 8, {"gateway_task": TASK, "max_top_k": "5"}, ("IMAGE", "TOP_K")
    )
    app = create_app(Settings(), backend_factory=lambda *_: backend)
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


def test_a_third_kind_is_catalogued_and_listed(audio: TestClient) -> None:
    models = {m["name"]: m for m in audio.get("/models").json()["models"]}
    assert models["sounds"]["task"] == TASK
    assert models["sounds"]["accepts"] == ["audio/wav"]
    assert models["sounds"]["caps"]["max_top_k"] == 5


def test_it_is_served_on_v2_with_its_own_check(audio: TestClient, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(AudioKind, "oip_inputs", frozenset({"IMAGE"}))  # the fake's BYTES input
    body = {"inputs": [
        {"name": "IMAGE", "shape": [1, 1], "datatype": "BYTES", "data": ["not a wav"]},
        {"name": "TOP_K", "shape": [1, 1], "datatype": "INT32", "data": [1]}]}  # fmt: skip
    refused = audio.post("/v2/models/sounds/infer", json=body)
    assert refused.status_code == 422, refused.text
    assert "WAV (RIFF)" in refused.json()["detail"]
    body["inputs"][0]["data"] = ["RIFF1234WAVEfmt "]
    assert audio.post("/v2/models/sounds/infer", json=body).status_code == 200
