"""Settings read the environment and refuse unsafe values."""

from __future__ import annotations

import typing
from collections.abc import Iterator

import annotated_types
import pytest
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from gateway.settings import Settings


def test_defaults() -> None:
    settings = Settings()
    assert settings.triton.url == "127.0.0.1:8001"
    assert settings.image.max_bytes == 8 * 1024 * 1024
    assert settings.image.max_pixels == 40_000_000
    assert settings.default_top_k == 5
    assert settings.max_json_body_bytes > settings.max_body_bytes * 4 // 3


def test_nested_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_TRITON__URL", "triton:8001")
    monkeypatch.setenv("GATEWAY_TRITON__TIMEOUT_SECONDS", "2.5")
    monkeypatch.setenv("GATEWAY_IMAGE__MAX_IMAGES", "4")
    settings = Settings()
    assert settings.triton.url == "triton:8001"
    assert settings.triton.timeout_seconds == 2.5
    assert settings.image.max_images == 4


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("GATEWAY_IMAGE__MAX_BYTES", "0"),
        ("GATEWAY_IMAGE__MAX_PIXELS", "-1"),
        ("GATEWAY_TRITON__TIMEOUT_SECONDS", "0"),
        ("GATEWAY_MAX_TOP_K", "5000"),
        ("GATEWAY_DEFAULT_TOP_K", "0"),
        ("GATEWAY_TRITON__URL", "no port here"),
        ("GATEWAY_IMAGE_MODEL_VERSION", "latest"),
    ],
)
def test_unsafe_values_are_refused(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError):
        Settings()


def test_inconsistent_values_are_refused() -> None:
    with pytest.raises(ValidationError):
        Settings(default_top_k=10, max_top_k=5)
    with pytest.raises(ValidationError):
        Settings(max_body_bytes=1024)  # smaller than one image


def _numeric_fields(model: type[BaseModel], prefix: str = "") -> Iterator[tuple[str, FieldInfo]]:
    for name, field in model.model_fields.items():
        kind = field.annotation
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            yield from _numeric_fields(kind, f"{prefix}{name}.")
        elif kind in (int, float) or (
            set(typing.get_args(kind)) & {int, float} and type(None) in typing.get_args(kind)
        ):
            yield f"{prefix}{name}", field


def test_every_numeric_setting_is_bounded_both_ways() -> None:
    """Every limit is a number with a range: a setting added without its bounds fails here
    (before 2026-12-02 five had no upper bound: the image caps and the log's file size)."""
    unbounded = [
        name
        for name, field in _numeric_fields(Settings)
        if not any(isinstance(bound, (annotated_types.Le, annotated_types.Lt)) for bound in field.metadata)
        or not any(isinstance(bound, (annotated_types.Ge, annotated_types.Gt)) for bound in field.metadata)
    ]
    assert unbounded == []
