"""Every error of the gateway's hierarchy, through the gRPC door's status map: each has a
code that means what its HTTP status means (a client's fault is never INTERNAL or
UNKNOWN, a shortage is retryable), and the errors that name Triton's own code get it."""

from __future__ import annotations

import inspect

import grpc
import pytest

from gateway import errors
from gateway.errors import GatewayError
from gateway.rpc.service import STATUS_CODES, grpc_code

# What a client may do about each kind of code.
RETRYABLE = {
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.DEADLINE_EXCEEDED,
}
SERVER_FAULT = {grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN}


def _every_error() -> list[type[GatewayError]]:
    return [
        cls
        for _, cls in inspect.getmembers(errors, inspect.isclass)
        if issubclass(cls, GatewayError) and cls.__module__ == errors.__name__
    ]


def _instance(cls: type[GatewayError]) -> GatewayError:
    """An instance, whatever its constructor asks for (a name, a version, a detail)."""
    parameters = [
        p
        for p in inspect.signature(cls.__init__).parameters.values()
        if p.name != "self" and p.kind is p.POSITIONAL_OR_KEYWORD and p.default is p.empty
    ]
    return cls(*["1" for _ in parameters])


def test_the_walk_finds_the_whole_hierarchy() -> None:
    names = {cls.__name__ for cls in _every_error()}
    assert {
        "GatewayError",
        "UnknownModelError",
        "BadVersionError",
        "NotServedError",
        "BodyBudgetError",
    } <= names
    assert len(names) >= 25


@pytest.mark.parametrize("cls", _every_error(), ids=lambda cls: cls.__name__)
def test_every_error_has_a_code_that_means_its_status(cls: type[GatewayError]) -> None:
    error = _instance(cls)
    code = grpc_code(error)
    if error.rpc_code is not None:
        assert code is grpc.StatusCode[error.rpc_code]
        return
    assert error.status in STATUS_CODES, f"{cls.__name__}: {error.status} has no gRPC code"
    if 400 <= error.status < 500:
        assert code not in SERVER_FAULT, f"{cls.__name__}: a client's fault as {code.name}"
    if error.status in (429, 503, 504):
        assert code in RETRYABLE, f"{cls.__name__}: a shortage as {code.name}"
    if error.status in (500, 502):
        assert code in SERVER_FAULT


def test_the_errors_with_tritons_own_codes() -> None:
    assert grpc_code(errors.BadVersionError("abc")) is grpc.StatusCode.INVALID_ARGUMENT
    assert grpc_code(errors.UnknownModelError("x")) is grpc.StatusCode.NOT_FOUND
    assert grpc_code(errors.NotServedError("shared memory")) is grpc.StatusCode.UNIMPLEMENTED
    assert grpc_code(errors.BodyBudgetError("spent")) is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert grpc_code(errors.OverloadedError("full")) is grpc.StatusCode.UNAVAILABLE


def test_tritons_texts_quote_a_name_only_when_it_is_a_names() -> None:
    assert (
        errors.UnknownModelError("simple", "9").detail
        == "Request for unknown model: 'simple' version 9 is not found"
    )
    assert errors.UnknownModelError("wrong_model_name").detail == (
        "Request for unknown model: 'wrong_model_name' is not found"
    )
    hostile = errors.UnknownModelError("<script>alert(1)</script>")
    assert "<script>" not in hostile.detail
    assert hostile.detail.startswith("Request for unknown model")
    assert "'abc'" in errors.BadVersionError("abc").detail
    assert "\n" not in errors.BadVersionError("a\nb").detail
