"""The gateway's errors: one hierarchy, each class with its RFC 9457 problem members.

Every error a client can see is a :class:`GatewayError`; each class has a stable
``type`` slug, an HTTP status and a title::

    GatewayError (500 internal)
    ├── ClientError (4xx: the request is at fault; logged as a warning)
    │   ├── MalformedRequestError      400 malformed-request   bad JSON, multipart or base64
    │   ├── NotFoundError              404 not-found           no such route
    │   │   ├── UnknownModelError      404 not-found           no such model or version (Triton's text)
    │   │   └── BadVersionError        404 not-found           a version that is not a number
    │   ├── NotServedError             400 not-served          shared memory, trace and log settings
    │   │   └── ControlNotServedError  403 not-served          repository control (/admin's)
    │   ├── MethodNotAllowedError      405 method-not-allowed
    │   ├── UnauthorizedError          401 unauthorized        no or unknown API key (+ WWW-Authenticate)
    │   ├── ForbiddenError             403 forbidden           a known caller without the right (/metrics)
    │   ├── RequestTimeoutError        408 request-timeout     the body did not arrive in time
    │   ├── ConflictError              409 conflict            not possible in the model's state (admin)
    │   │   └── ModelLoadError         409 model-load-failed   Triton could not load the model (admin)
    │   ├── RateLimitedError           429 rate-limited        the key's rate is spent (+ Retry-After)
    │   ├── QuotaExceededError         429 quota-exceeded      the key's day or month quota is spent
    │   ├── PayloadTooLargeError       413 payload-too-large   body, image bytes or count caps
    │   │   └── ImageTooLargeError     413 image-too-large     pixel, side or frame caps
    │   ├── UnsupportedMediaTypeError  415 unsupported-media-type   Content-Type not accepted
    │   │   └── UnsupportedImageFormatError 415 unsupported-image-format  sniffed format
    │   └── InvalidInputError          422 invalid-input       well-formed but invalid
    │       ├── InvalidImageError      422 invalid-image       rejected by the model's preprocess
    │       └── WrongInputKindError    422 wrong-input-kind    texts sent to an image model, or the reverse
    ├── ServiceUnavailableError (503: the gateway sheds load; + Retry-After)
    │   ├── OverloadedError            503 overloaded          too many requests in flight
    │   │   └── BodyBudgetError        503 overloaded          the body bytes in flight are spent
    │   ├── ShuttingDownError          503 shutting-down       draining before exit
    │   ├── NotReadyError              503 not-ready           /readyz: Triton or a default model is not ready
    │   └── SharedStateUnavailableError 503 shared-state-unavailable  Redis down and its policy refuses
    ├── UpstreamError (5xx: Triton is at fault; logged with details, never shown)
    │   ├── TritonFailureError         502 triton-failure
    │   ├── TritonUnavailableError     503 triton-unavailable  (+ Retry-After)
    │   └── TritonTimeoutError         504 triton-timeout
    └── ConfigurationError             the gateway cannot start as configured (never an HTTP answer)

Rendering (problem+json responses, handlers, OpenAPI declarations) is the HTTP side's:
:mod:`gateway.http.problems`. Bodies never echo the client's input, Triton's messages or a stack trace (a model name
or version in Triton's own texts, which its clients read, only when it is made of a model
name's characters: :func:`quoted`); the one exception is ModelLoadError, answered on the admin surface only, which quotes Triton's
reason to the operator who asked for the load.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection
from typing import Any

PROBLEM_MEDIA_TYPE = "application/problem+json"
TYPE_PREFIX = "urn:triton-gateway:problem:"


class GatewayError(Exception):
    """Base of every error the gateway reports; unexpected ones become a bare 500."""

    # Class-level defaults; an instance may narrow its status (see _on_http_exception).
    status: int = 500
    slug: str = "internal"
    title: str = "Internal error"
    # What a client (or operator) should do about it: the problem types reference
    # (docs/reference/errors.md) is generated from these.
    advice: str = "Retry later; operators: the gateway's log has the error with the request id."
    # The gRPC door's code for it, by name, where the HTTP status's closest code is not
    # Triton's (None: gateway.rpc.service derives it from the status).
    rpc_code: str | None = None

    def __init__(
        self,
        detail: str,
        *,
        input_index: int | None = None,
        errors: list[dict[str, Any]] | None = None,
        headers: dict[str, str] | None = None,
        extensions: dict[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        self.input_index = input_index
        self.errors = errors
        self.headers = headers or {}
        if retry_after is not None:
            # the one place Retry-After is written: whole seconds, at least 1 (RFC 9110)
            self.headers["Retry-After"] = str(max(1, math.ceil(retry_after)))
        self.extensions = extensions or {}  # RFC 9457 extension members (say, /readyz's checks)

    def at(self, index: int) -> GatewayError:
        """Name the input (0-based, in request order) this error is about."""
        self.input_index = index
        return self

    def problem(
        self, request_id: str | None, instance: str | None, trace_id: str | None = None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "type": TYPE_PREFIX + self.slug,
            "title": self.title,
            "status": self.status,
            "detail": self.detail,
        }
        if instance:
            body["instance"] = instance
        if request_id:
            body["request_id"] = request_id
        if trace_id:
            body["trace_id"] = trace_id
        if self.input_index is not None:
            body["input_index"] = self.input_index
        if self.errors:
            body["errors"] = self.errors
        return {**self.extensions, **body}


class ClientError(GatewayError):
    """The request is at fault (4xx)."""

    status = 400
    slug = "bad-request"
    advice = "Fix the request as the `detail` says."
    title = "Bad request"


class MalformedRequestError(ClientError):
    """The body is not well-formed: bad JSON, multipart or base64."""

    status = 400
    slug = "malformed-request"
    advice = "Send valid JSON, multipart with `file` parts, or valid base64."
    title = "Malformed request"


class NotFoundError(ClientError):
    """No such route."""

    status = 404
    slug = "not-found"
    advice = "Check the path; for `/models/{model}/...`, list the catalog with `GET /models`."
    title = "Not found"


# A name the gateway may quote back (Triton's own messages quote it, and its clients
# read them): a model name's characters only; anything else is left out of the text.
_QUOTABLE = re.compile(r"[A-Za-z0-9_.\-]{1,128}")


def quoted(name: str) -> str:
    return f"'{name}'" if _QUOTABLE.fullmatch(name) else "(a name the gateway does not repeat)"


class UnknownModelError(NotFoundError):
    """No such model, or no such version of it, among those the gateway exposes; the text
    is Triton's (``Request for unknown model: 'x' is not found``), which its clients read."""

    def __init__(self, name: str, version: str = "") -> None:
        named = f" version {version}" if version and version.isdigit() and len(version) < 20 else ""
        super().__init__(f"Request for unknown model: {quoted(name)}{named} is not found")


class BadVersionError(NotFoundError):
    """A model version that is not a number: 404 on HTTP (no such route, as Triton
    answers), INVALID_ARGUMENT on gRPC with Triton's text."""

    rpc_code = "INVALID_ARGUMENT"

    def __init__(self, version: str) -> None:
        super().__init__(
            f"failed to get model version from specified version string {quoted(version)}, "
            "version should be an integral value > 0"
        )


class NotServedError(ClientError):
    """A part of Triton's protocol the gateway does not serve (shared memory, trace and log
    settings): UNIMPLEMENTED on gRPC."""

    status = 400
    slug = "not-served"
    rpc_code = "UNIMPLEMENTED"
    advice = (
        "Send the tensors in the request; control models through /admin (the detail says what is not served)."
    )
    title = "Not served"


class ControlNotServedError(NotServedError):
    """Triton's repository control, which the gateway leaves to its admin surface (/admin):
    a permission it does not give, PERMISSION_DENIED on gRPC."""

    status = 403
    rpc_code = "PERMISSION_DENIED"


class MethodNotAllowedError(ClientError):
    """The route exists but not for this method."""

    status = 405
    slug = "method-not-allowed"
    advice = "Use the method the API reference gives for that route."
    title = "Method not allowed"


class UnauthorizedError(ClientError):
    """No API key, or one the gateway does not know."""

    status = 401
    slug = "unauthorized"
    advice = "Send a valid key as `Authorization: Bearer <key>` or `X-API-Key`."
    title = "Unauthorized"


class ForbiddenError(ClientError):
    """A known caller asked for what its key does not allow (``/metrics`` to a key that is
    not one of ``auth.metrics_readers``)."""

    status = 403
    slug = "forbidden"
    title = "Forbidden"


class RequestTimeoutError(ClientError):
    """The client did not send its body within the body read timeout."""

    status = 408
    slug = "request-timeout"
    advice = "Send the body faster, or a smaller one; check the client's network."
    title = "Request timeout"


class ConflictError(ClientError):
    """The operation is not possible in the model's current state (admin surface)."""

    status = 409
    slug = "conflict"
    advice = "Bring the model into the state the operation needs (load it, load that version) and retry."
    title = "Conflict"


class ModelLoadError(ConflictError):
    """Triton could not load the model; the loaded one, if any, keeps serving."""

    slug = "model-load-failed"
    advice = "Read Triton's reason in `detail`, fix the model's files or config, load again."
    title = "Model load failed"


class RateLimitedError(ClientError):
    """The API key has spent its request rate; retry after the given delay."""

    status = 429
    slug = "rate-limited"
    advice = "Wait `Retry-After` seconds; ask for a higher rate if this is regular."
    title = "Too many requests"


class TooManyConnectionsError(ClientError):
    """The caller's address holds ``server.max_connections_per_address`` of the door's
    connections already: this one is answered at once and closed."""

    status = 429
    slug = "too-many-connections"
    advice = "Reuse connections (keep-alive) instead of opening more; behind a proxy, raise the bound."
    title = "Too many connections"


class QuotaExceededError(ClientError):
    """The API key has spent its quota (requests or images) for the day or month."""

    status = 429
    slug = "quota-exceeded"
    advice = "Wait `Retry-After` seconds, until the period resets; ask for a larger quota."
    title = "Quota exceeded"


class PayloadTooLargeError(ClientError):
    """A size or count cap was exceeded: body, image bytes, images per request."""

    status = 413
    slug = "payload-too-large"
    advice = "Send fewer or smaller inputs; the caps are in `GET /models` (`caps`)."
    title = "Payload too large"


class HeadTooLargeError(ClientError):
    """A request's head (request line and headers) is larger than ``server.max_head_bytes``:
    answered before the head ends, and the connection closed."""

    status = 431
    slug = "head-too-large"
    advice = "Send fewer or shorter headers (cookies, tokens) and a shorter URL."
    title = "Request header fields too large"


class ImageTooLargeError(PayloadTooLargeError):
    """An image's header declares more pixels, a longer side or more frames than allowed."""

    slug = "image-too-large"
    advice = "Downscale the image before sending it; the model's caps are in `GET /models`."
    title = "Image too large"


class UnsupportedMediaTypeError(ClientError):
    """The Content-Type is not one /classify accepts."""

    status = 415
    slug = "unsupported-media-type"
    advice = "Use multipart, JSON or a raw image Content-Type."
    title = "Unsupported media type"


class UnsupportedImageFormatError(UnsupportedMediaTypeError):
    """The bytes (sniffed, not the declared type) are not an accepted image format."""

    slug = "unsupported-image-format"
    advice = "Convert to a format the model takes (`GET /models`: `formats`)."
    title = "Unsupported image format"


class InvalidInputError(ClientError):
    """Well-formed but invalid: empty input, bad top_k, NaN, wrong types."""

    status = 422
    slug = "invalid-input"
    advice = "Fix the field `detail` names (`input_index` says which input)."
    title = "Invalid input"


class InvalidImageError(InvalidInputError):
    """The image passed the header checks but the model's preprocessing could not decode it."""

    slug = "invalid-image"
    advice = "Re-encode the image (it is likely truncated or corrupt); other inputs were not affected."
    title = "Invalid image"


class WrongInputKindError(InvalidInputError):
    """The model classifies another kind of input (texts sent to an image model, say)."""

    slug = "wrong-input-kind"
    advice = "Send images to an image model and texts to a text one (`GET /models`: `task`)."
    title = "Wrong input kind"


class ServiceUnavailableError(GatewayError):
    """The gateway itself refuses work for now (not Triton's fault); retry later."""

    status = 503
    slug = "service-unavailable"
    advice = "Retry after `Retry-After` seconds."
    title = "Service unavailable"


class OverloadedError(ServiceUnavailableError):
    """Every in-flight slot is taken and none freed within the queue wait."""

    slug = "overloaded"
    advice = "Retry after `Retry-After` seconds with backoff; add replicas if it is regular."
    title = "Overloaded"


class BodyBudgetError(OverloadedError):
    """The body bytes the gateway may hold at once are spent (``server.max_body_bytes_in_flight``):
    the same problem as any overload on HTTP; RESOURCE_EXHAUSTED on the gRPC door."""

    rpc_code = "RESOURCE_EXHAUSTED"


class ShuttingDownError(ServiceUnavailableError):
    """The gateway is draining before it exits; another replica should answer."""

    slug = "shutting-down"
    advice = "Retry: another replica answers (the load balancer takes this one out)."
    title = "Shutting down"


class NotReadyError(ServiceUnavailableError):
    """``/readyz``: this replica should not take traffic now (Triton, a default model, or
    the replica itself is not ready); the problem's ``checks`` say which."""

    slug = "not-ready"
    advice = "Operators: the `checks` say which part is not ready; clients are routed elsewhere."
    title = "Not ready"


class SharedStateUnavailableError(ServiceUnavailableError):
    """The shared state (Redis) does not answer and the policy (``redis.on_failure: refuse``)
    is to refuse rate-limited keys, or an admin change could not be shared."""

    slug = "shared-state-unavailable"
    advice = "Retry after `Retry-After`; operators: bring Redis back (the SharedStateDown alert)."
    title = "Shared state unavailable"


class UpstreamError(GatewayError):
    """Triton is at fault (5xx)."""

    status = 502
    slug = "upstream-error"
    advice = "Retry later; operators: check Triton's log."
    title = "Upstream error"


class TritonFailureError(UpstreamError):
    """Triton answered with an error that is not the client's fault."""

    status = 502
    slug = "triton-failure"
    advice = "Retry later; operators: Triton's log has the cause (the gateway logs it with the request id)."
    title = "Triton failed"


class TritonUnavailableError(UpstreamError):
    """Triton, or the model, cannot take requests now; retry later."""

    status = 503
    slug = "triton-unavailable"
    advice = "Retry after `Retry-After` seconds; operators: check Triton and the model's state."
    title = "Triton unavailable"


class TritonTimeoutError(UpstreamError):
    """Triton did not answer within the deadline."""

    status = 504
    slug = "triton-timeout"
    advice = "Retry later, with fewer inputs; operators: Triton is overloaded or hung."
    title = "Triton timed out"


class ConfigurationError(GatewayError):
    """The gateway or its local Triton cannot start as configured."""

    slug = "configuration"
    title = "Configuration error"


MAX_REPORTED_ERRORS = 5
_UNKNOWN_KEY = "<unknown key>"


def summarise_validation_errors(errors: list[Any], known_keys: Collection[str] = ()) -> list[dict[str, Any]]:
    """The first few Pydantic/FastAPI errors, with their locations but never the input.

    Locations keep list indices and the names in ``known_keys`` (the model's own fields,
    the query parameters); any other key is the client's and is not echoed.
    """

    def part(value: Any) -> str | int:
        if isinstance(value, int):
            return value
        text = str(value)
        return text if text in known_keys else _UNKNOWN_KEY

    return [
        {"loc": [part(p) for p in e.get("loc", ())], "msg": str(e.get("msg", ""))[:200]}
        for e in errors[:MAX_REPORTED_ERRORS]
    ]
