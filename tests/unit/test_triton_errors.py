"""Triton failures map to gateway errors by gRPC status code; the one message the
mapping reads is the Python backend's own "stub is being replaced" (transient: 503)."""

from __future__ import annotations

import grpc
import pytest
from tritonclient.utils import InferenceServerException

from gateway.errors import (
    GatewayError,
    InvalidImageError,
    TritonFailureError,
    TritonTimeoutError,
    TritonUnavailableError,
)
from gateway.triton.client import STATUS_ERRORS, map_status, map_triton_error, status_code


@pytest.mark.parametrize(
    ("status", "expected", "http"),
    [
        ("StatusCode.INVALID_ARGUMENT", InvalidImageError, 422),
        ("StatusCode.UNAVAILABLE", TritonUnavailableError, 503),
        ("StatusCode.NOT_FOUND", TritonUnavailableError, 503),
        ("StatusCode.RESOURCE_EXHAUSTED", TritonUnavailableError, 503),
        ("StatusCode.DEADLINE_EXCEEDED", TritonTimeoutError, 504),
        ("StatusCode.INTERNAL", TritonFailureError, 502),
        ("StatusCode.UNKNOWN", TritonFailureError, 502),
        (None, TritonFailureError, 502),
    ],
)
def test_status_code_mapping(status: str | None, expected: type, http: int) -> None:
    error = map_triton_error(InferenceServerException("secret internal text", status=status), retry_after=7)
    assert type(error) is expected
    assert error.status == http
    assert "secret" not in error.detail


def test_unavailable_carries_retry_after() -> None:
    error = map_triton_error(InferenceServerException("x", status="StatusCode.UNAVAILABLE"), retry_after=7)
    assert error.headers["Retry-After"] == "7"


def test_message_text_does_not_change_the_mapping() -> None:
    misleading = InferenceServerException("Deadline Exceeded; unavailable", status="StatusCode.INTERNAL")
    assert type(map_triton_error(misleading, retry_after=1)) is TritonFailureError


@pytest.mark.parametrize(
    "message",
    [
        "Failed to process the request(s) for model 'image_preprocess_0_0', message: Stub process is not healthy.",
        "Failed to obtain the health mutex.",
    ],
)
def test_python_backend_stub_restart_is_unavailable(message: str) -> None:
    error = map_triton_error(InferenceServerException(message, status="StatusCode.INTERNAL"), retry_after=3)
    assert type(error) is TritonUnavailableError
    assert error.headers["Retry-After"] == "3"


@pytest.mark.parametrize("code", list(grpc.StatusCode), ids=lambda code: code.name)
def test_every_grpc_status_code_is_mapped(code: grpc.StatusCode) -> None:
    """A status code grpc adds cannot slip through unmapped (httpx's
    test_httpcore_all_exceptions_mapped is the model)."""
    assert code in STATUS_ERRORS
    error = map_status(code, "Triton's own words", retry_after=2)
    assert isinstance(error, GatewayError)
    assert 400 <= error.status < 600
    assert "Triton's own words" not in error.detail


def test_the_mapping_reads_the_enum_not_the_text() -> None:
    for code in grpc.StatusCode:
        exc = InferenceServerException("x", status=str(code))
        assert status_code(exc) is code
    assert (
        status_code(InferenceServerException("x", status="StatusCode.NEW_IN_GRPC_99"))
        is grpc.StatusCode.UNKNOWN
    )
