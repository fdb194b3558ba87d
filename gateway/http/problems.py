"""Errors as HTTP answers: RFC 9457 ``application/problem+json`` responses (the Open
Inference Protocol's ``application/json`` with ``error`` on ``/v2``), one log line per
refusal, the app's exception handlers, and the OpenAPI declarations of the problems
routes can give, rendered from the error classes themselves (type, title and status can
never disagree with what is sent)."""

from __future__ import annotations

import functools
import logging
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from gateway.errors import (
    PROBLEM_MEDIA_TYPE,
    ClientError,
    ConflictError,
    ForbiddenError,
    GatewayError,
    ImageTooLargeError,
    InvalidImageError,
    InvalidInputError,
    MalformedRequestError,
    MethodNotAllowedError,
    NotFoundError,
    RequestTimeoutError,
    ServiceUnavailableError,
    TritonFailureError,
    TritonTimeoutError,
    TritonUnavailableError,
    UnauthorizedError,
    UnsupportedImageFormatError,
    summarise_validation_errors,
)
from gateway.http.paths import on_oip_door, on_task_door
from gateway.observe.logs import Sampler
from gateway.observe.outcome import CLIENT_GONE
from gateway.observe.tracing import current_trace_id, record_problem

if TYPE_CHECKING:
    from gateway.observe.metrics import GatewayMetrics

# The logger keeps its name: operators filter on it.
logger = logging.getLogger("gateway.errors")


def request_id_of(request: Request) -> str | None:
    return getattr(request.state, "request_id", None)


def instance_of(request: Request) -> str | None:
    """The route template that matched (never the raw path, which is the client's input)."""
    path = getattr(request.scope.get("route"), "path", None)
    return path if isinstance(path, str) else None


def _where(request: Request) -> str:
    """Method and path for a log line, cut short: both are the client's input."""
    return f"{request.method[:16]} {request.url.path[:200]}"


# OpenAI's error types by status; any other 4xx is an invalid request, any 5xx a server error.
_OPENAI_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
    503: "service_unavailable_error",
}


def in_door_form(body: dict[str, Any], error: GatewayError, path: str) -> str:
    """``body`` (``error``'s problem) in the error form of the door ``path`` is on, and
    its media type: the Open Inference Protocol's on ``/v2`` (``error``, what tritonclient
    reads), OpenAI's on ``/v1/`` (as its clients, vLLM's and SGLang's parse it), else
    problem+json; the problem members stay alongside."""
    if on_oip_door(path):
        body["error"] = error.detail
        return "application/json"
    if on_task_door(path):
        body["error"] = {
            "message": error.detail,
            "type": _OPENAI_TYPES.get(
                error.status, "server_error" if error.status >= 500 else "invalid_request_error"
            ),
            "param": None,
            "code": error.slug,
        }
        return "application/json"
    return PROBLEM_MEDIA_TYPE


def problem_response(
    error: GatewayError, request: Request, headers: dict[str, str] | None = None
) -> JSONResponse:
    body = error.problem(request_id_of(request), instance_of(request), current_trace_id())
    record_problem(body["type"], error.status)
    media_type = in_door_form(body, error, request.url.path)
    merged = {**error.headers, **(headers or {})}
    return JSONResponse(body, status_code=error.status, headers=merged, media_type=media_type)


@functools.cache
def _refusals() -> Sampler:
    # per problem type: a flood of 401s or 404s writes 10 lines a second and a count
    return Sampler(per_second=10)


def log_problem(request: Request, exc: GatewayError) -> None:
    """One log line per refused request: 4xx and load shedding as warnings (at most 10 a
    second per problem type; the rest counted in the next line), Triton's and the
    gateway's own failures as errors with the cause's traceback."""
    if exc.status < 500 or isinstance(exc, ServiceUnavailableError):
        written, held = _refusals().admit(exc.slug)
        if written:
            more = f" ({held} more {exc.slug} refusals not logged)" if held else ""
            logger.warning("%s -> %d %s: %s%s", _where(request), exc.status, exc.slug, exc.detail, more)
        return
    if exc.status >= 500 and not isinstance(exc, ServiceUnavailableError):
        logger.error(
            "%s -> %d %s: %s",
            _where(request),
            exc.status,
            exc.slug,
            exc.detail,
            exc_info=exc.__cause__ or exc,
        )
    else:
        logger.warning("%s -> %d %s: %s", _where(request), exc.status, exc.slug, exc.detail)


async def gateway_error_response(request: Request, exc: Exception) -> JSONResponse:
    """The answer to a refusal: counted, logged, rendered (the handler of GatewayError)."""
    assert isinstance(exc, GatewayError)
    counted = isinstance(exc, ClientError | ServiceUnavailableError)
    if counted and (metrics := getattr(request.app.state, "gateway_metrics", None)):
        metrics.rejections.labels(exc.slug).inc()
    log_problem(request, exc)
    return problem_response(exc, request)


async def _on_validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    known = {"query", "path", "header", "body", "top_k"}
    error = InvalidInputError(
        "the request parameters are invalid", errors=summarise_validation_errors(list(exc.errors()), known)
    )
    return await gateway_error_response(request, error)


async def _on_http_exception(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    error: GatewayError
    if exc.status_code == 404:
        error = NotFoundError("there is no route at this path")
    elif exc.status_code == 405:
        error = MethodNotAllowedError("this method is not allowed on this route")
    elif 400 <= exc.status_code < 500:
        error = ClientError(HTTPStatus(exc.status_code).phrase)
        error.status = exc.status_code
    else:
        error = GatewayError(HTTPStatus(exc.status_code).phrase)
    return problem_response(error, request, headers=dict(exc.headers or {}))


async def _on_client_gone(request: Request, exc: Exception) -> Response:
    """The client went away while its body was read: nobody to answer, nothing to log
    (the request is counted as 499 by gateway.http.telemetry)."""
    return Response(status_code=CLIENT_GONE)


async def _on_unexpected(request: Request, exc: Exception) -> JSONResponse:
    logger.error("%s -> 500: unexpected error", _where(request), exc_info=exc)
    response = problem_response(GatewayError("the gateway failed unexpectedly"), request)
    if (request_id := request_id_of(request)) is not None:
        response.headers["X-Request-ID"] = request_id
    return response


def install_error_handlers(app: FastAPI, metrics: GatewayMetrics) -> None:
    # Handlers receive only the request: they find the metrics on the app.
    app.state.gateway_metrics = metrics
    app.add_exception_handler(GatewayError, gateway_error_response)
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(StarletteHTTPException, _on_http_exception)
    app.add_exception_handler(ClientDisconnect, _on_client_gone)
    app.add_exception_handler(Exception, _on_unexpected)


# Per status: what it means on the routes, and one example of it (an instance of the
# class that answers it).
_EXAMPLES: dict[int, tuple[str, GatewayError]] = {
    400: ("Malformed JSON, multipart or base64.", MalformedRequestError("the body is not valid JSON")),
    401: ("No key, or not one of the keys.", UnauthorizedError("send a valid API key")),
    403: (
        "A known caller without the right (/metrics: a key not in auth.metrics_readers).",
        ForbiddenError("this key may not read /metrics (auth.metrics_readers)"),
    ),
    404: (
        "No such model (not in the catalog, or not exposed).",
        NotFoundError("there is no such model"),
    ),
    408: (
        "The body did not arrive within the body read timeout.",
        RequestTimeoutError("the body did not arrive within 30 s"),
    ),
    409: (
        "Not possible in the model's state (reload of a model not loaded, pin to a version not ready), "
        "or Triton could not load the model (model-load-failed, with Triton's reason).",
        ConflictError("text_classifier version 3 is not ready in Triton"),
    ),
    413: (
        "Body, image bytes, image or text count, pixel, side or frame cap exceeded (the model's caps).",
        ImageTooLargeError("50000x50000 has a side over the 16384 pixel limit"),
    ),
    415: (
        "Content-Type not accepted, or the bytes are not an image format the model takes.",
        UnsupportedImageFormatError("the data is TIFF, which is not accepted; send JPEG, PNG, WEBP"),
    ),
    422: (
        "Well-formed but invalid: empty input, bad top_k, NaN, wrong types, an input of the wrong kind "
        "for the model (wrong-input-kind), or an image the model could not decode (invalid-image).",
        InvalidImageError("the model's preprocessing rejected the input (corrupt or truncated data)"),
    ),
    502: ("Triton failed.", TritonFailureError("Triton failed to process the request")),
    503: (
        "Triton or the model is unavailable (loading, unloaded), the gateway is overloaded or shutting "
        "down, or not ready; see Retry-After.",
        TritonUnavailableError("Triton or the model is not available"),
    ),
    504: ("Triton did not answer within the deadline.", TritonTimeoutError("Triton did not answer in time")),
}


def problem_responses(
    *statuses: int, media_type: str = PROBLEM_MEDIA_TYPE
) -> dict[int | str, dict[str, Any]]:
    """The responses of ``statuses``; ``media_type`` is what the routes answer errors in
    (the /v2 routes: application/json, the protocol's)."""
    responses: dict[int | str, dict[str, Any]] = {}
    for status in statuses:
        description, error = _EXAMPLES[status]
        example = error.problem("0f5c2d1e9b7a4c3d8e6f1a2b3c4d5e6f", "/classify")
        responses[status] = {
            "description": description,
            "content": {media_type: {"schema": {"$ref": "#/components/schemas/Problem"}, "example": example}},
        }
    return responses
