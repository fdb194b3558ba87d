"""The catalog, read from a fake transport: what is exposed, what a model takes, how it
follows models coming and going."""

from __future__ import annotations

import asyncio
import logging

import pytest

from gateway.errors import NotFoundError, WrongInputKindError
from gateway.serving.catalog import Catalog
from gateway.serving.kinds import KINDS
from gateway.settings import ImageLimits, Settings, TextLimits
from gateway.triton.backend import ModelConfig

from helpers.support import FakeBackend, fake_repository


def read(settings: Settings, backend: FakeBackend) -> Catalog:
    catalog = Catalog(settings, backend)
    asyncio.run(catalog.refresh())
    return catalog


def test_only_models_with_a_gateway_task_are_exposed_and_never_their_steps() -> None:
    backend = FakeBackend()
    # a step that declares a task all the same is still a step
    pre = backend.models["image_classifier.pre"]
    backend.models[pre.name] = ModelConfig(
        pre.name, pre.platform, 32, {**pre.parameters, "gateway_task": "image-classification"}
    )
    names = [entry.name for entry in read(Settings(), backend).entries()]
    assert names == ["image_classifier", "text_classifier"]


def test_expose_and_hide_patterns() -> None:
    backend = FakeBackend()
    backend.models["image_classifier_b"] = ModelConfig(
        "image_classifier_b", "ensemble", 8, {"gateway_task": "image-classification"}, ("IMAGE", "TOP_K")
    )
    backend.models["text_other"] = ModelConfig(
        "text_other", "ensemble", 8, {"gateway_task": "text-classification"}, ("TEXT", "TOP_K")
    )
    catalog = read(Settings(expose=["image_*"], hide=["*_b"]), backend)
    # the defaults are always exposed; of the others, what the patterns say
    assert [entry.name for entry in catalog.entries()] == ["image_classifier", "text_classifier"]
    for hidden in ("image_classifier_b", "text_other"):
        with pytest.raises(NotFoundError):
            catalog.get(hidden)
    assert [e.name for e in read(Settings(), backend).entries()] == [
        "image_classifier",
        "image_classifier_b",
        "text_classifier",
        "text_other",
    ]


def test_caps_come_from_the_models_configuration_and_settings_only_narrow() -> None:
    catalog = read(
        Settings(image=ImageLimits(max_pixels=1_000_000), text=TextLimits(max_texts=8)), FakeBackend()
    )
    image = catalog.get("image_classifier")
    assert image.caps.limits.max_pixels == 1_000_000  # narrowed
    assert image.caps.limits.max_side == 16_384  # the model's
    assert image.caps.max_top_k == 20
    assert catalog.get("text_classifier").caps.max_inputs == 8


def test_a_setting_that_would_widen_is_refused_with_a_clear_message(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, "gateway.catalog")
    catalog = read(Settings(image=ImageLimits(max_pixels=90_000_000), max_top_k=50), FakeBackend())
    image = catalog.get("image_classifier")
    assert image.caps.limits.max_pixels == 40_000_000  # the model's cap holds
    assert image.caps.max_top_k == 20
    assert any(
        "GATEWAY_IMAGE__MAX_PIXELS=90000000 would widen image_classifier's max_pixels" in r.message
        for r in caplog.records
    )
    assert any("GATEWAY_MAX_TOP_K=50" in note for note in image.caps.notes)


def test_a_model_that_is_not_ready_is_listed_as_such_and_one_gone_is_404() -> None:
    backend = FakeBackend()
    catalog = read(Settings(), backend)
    backend.unloaded.add("text_classifier")
    asyncio.run(catalog.refresh())
    # still catalogued (Triton answers its requests 503), in the state Triton reports
    assert catalog.get("text_classifier").state == "unloaded"
    del backend.models["text_classifier"]
    asyncio.run(catalog.refresh())
    with pytest.raises(NotFoundError):
        catalog.get("text_classifier")


def test_triton_down_keeps_the_last_catalog() -> None:
    backend = FakeBackend()
    catalog = read(Settings(), backend)
    backend.live = False
    asyncio.run(catalog.refresh())
    assert catalog.get("image_classifier").ready


def test_the_default_must_be_of_the_kind_sent() -> None:
    catalog = read(Settings(image_model="text_classifier"), FakeBackend())
    with pytest.raises(WrongInputKindError):
        catalog.default(KINDS["image-classification"])


def test_an_unknown_task_is_not_exposed(caplog: pytest.LogCaptureFixture) -> None:
    backend = FakeBackend(models={**fake_repository()})
    backend.models["audio"] = ModelConfig("audio", "python", 1, {"gateway_task": "audio-classification"})
    catalog = read(Settings(), backend)
    assert catalog.find("audio") is None
    assert any("audio-classification" in r.message for r in caplog.records)
