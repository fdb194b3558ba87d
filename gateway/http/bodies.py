"""Reading /classify bodies from the wire, with size caps enforced while reading.

Turns the three accepted transports (multipart, raw image bytes, JSON) into one
:class:`ClassifyInput`; what the bytes are worth is judged later by
:mod:`gateway.serving.validation`.
"""

from __future__ import annotations

import asyncio
import re
import zlib
from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

from pydantic import ValidationError
from starlette.requests import ClientDisconnect, Request
from starlette.types import Message, Receive, Scope

from gateway.errors import (
    InvalidInputError,
    MalformedRequestError,
    PayloadTooLargeError,
    RequestTimeoutError,
    UnsupportedMediaTypeError,
    summarise_validation_errors,
)
from gateway.http.budget import reservation_of
from gateway.http.multipart import FileParts, boundary_of
from gateway.http.schemas import ClassifyJSONRequest, classify_json_model
from gateway.serving.jsonguard import WHOLE_BYTES, JsonBounds, JsonScan, parse_scanned
from gateway.serving.payload import RAW_IMAGE_TYPES, ClassifyInput
from gateway.serving.refusal import UnreadBody
from gateway.serving.validation import (
    check_count,
    decode_base64_image,
    normalize_labels,
    normalize_text,
    parse_json_object,
    parse_json_value,
)
from gateway.serving.workers import CheckWorkers
from gateway.settings import Settings

ACCEPTED_TYPES = ("multipart/form-data", "application/json", *RAW_IMAGE_TYPES)
# Bounds the multipart parser itself; the image count cap is checked after parsing so
# that it answers 413 rather than the parser's generic error.
_MAX_PARTS = 1000


# The scope's key for the request's BodyArrival, which the server sets
# (gateway.http.protocol).
BODY_ARRIVED = "gateway.body_arrived"


class BodyArrival:
    """Whether a request's whole body has arrived, so that a receive returns it without
    waiting: a body that cannot stall needs no deadline, and its reader arms none (a loop
    timer a read). A flag, not a callable of the protocol's: the scope would hold the
    protocol, and the protocol the scope (a cycle left to the collector)."""

    __slots__ = ("done",)

    def __init__(self) -> None:
        self.done = False


# a body announced this small is read away after a refusal from the headers, keeping the
# connection (uvicorn drops a body the application did not read once it has answered)
SMALL_UNREAD_BYTES = 64 * 1024


def unread_body(request: Request) -> UnreadBody:
    """What the request's headers say of its body (gateway.serving.refusal.UnreadBody)."""
    return unread_body_of(request.scope)


def unread_body_of(scope: Scope) -> UnreadBody:
    """:func:`unread_body` from the scope's raw headers (before any framework runs)."""
    found = _header_map(scope)
    length = found.get(b"content-length")  # (httptools refuses a second one)
    # uvicorn waits to send 100 Continue when any Expect field asks it: so is it read here
    waits = b"expect" in found and any(
        name == b"expect" and value.strip().lower() == b"100-continue" for name, value in scope["headers"]
    )
    small = length is not None and length.isdigit() and int(length) <= SMALL_UNREAD_BYTES
    client = scope.get("client")  # (host, port): the connection
    return UnreadBody(waits, small, tuple(client) if client else None)


def header(request: Request, name: bytes) -> str | None:
    """The first value of a request header (``name`` lower case): what
    ``request.headers.get`` answers, from the request's map of them."""
    value = _header_map(request.scope).get(name)
    return None if value is None else value.decode("latin-1")


def _header_map(scope: Scope) -> dict[bytes, bytes]:
    """The raw header pairs as a map, each name's first value, made once a request (the
    refusal from the head and a /classify read five; a headers object scans its list for
    each). Nothing rewrites a scope's headers once the server has parsed them."""
    found: dict[bytes, bytes] | None = scope.get(_HEADER_MAP)
    if found is None:
        found = scope[_HEADER_MAP] = dict(reversed(scope.get("headers", ())))
    return found


_HEADER_MAP = "gateway.header_map"


def media_type(request: Request) -> str:
    return (header(request, b"content-type") or "").split(";", 1)[0].strip().lower()


# Content-Encoding -> zlib's wbits (gzip's header; deflate is zlib-wrapped, RFC 9110)
ENCODINGS = {"gzip": 31, "x-gzip": 31, "deflate": 15}


# A compressed body comes out in pieces of at most this many bytes, the event loop free
# between them: one 64 KiB chunk of a bomb would otherwise inflate to 64 MiB in one call.
INFLATE_PIECE = 256 * 1024


class _Inflater:
    """Decompresses a body a piece at a time, counting what it produced against ``limit``:
    a small body that would expand past the cap (a zip bomb) is refused while it is being
    decompressed, and no call produces more than :data:`INFLATE_PIECE` bytes."""

    def __init__(self, encoding: str, limit: int) -> None:
        self.encoding = encoding
        self.limit = limit
        self.produced = 0
        self._decoder: Any = None
        self._input = b""
        self._full = False  # the last piece filled its size: zlib may hold more output

    @property
    def busy(self) -> bool:
        """Whether input pushed so far may still give output."""
        return bool(self._input) or self._full

    def push(self, chunk: bytes) -> None:
        if self._decoder is None and chunk:
            wbits = ENCODINGS[self.encoding]
            # a raw deflate stream (no zlib header), as some clients send: accepted too
            if wbits == 15 and not (chunk[0] & 0x0F == 8 and int.from_bytes(chunk[:2]) % 31 == 0):
                wbits = -15
            self._decoder = zlib.decompressobj(wbits)
        self._input = chunk

    def piece(self) -> bytes:
        if self._decoder is None:
            return b""
        try:
            out: bytes = self._decoder.decompress(self._input, INFLATE_PIECE)
        except zlib.error as exc:
            raise MalformedRequestError(f"the {self.encoding} body is corrupt") from exc
        self._input = self._decoder.unconsumed_tail
        self._full = len(out) == INFLATE_PIECE
        self.produced += len(out)
        if self.produced > self.limit:
            raise PayloadTooLargeError(
                f"the body decompresses to over the {self.limit} byte limit for this content type"
            )
        return out

    def finish(self) -> None:
        if self._decoder is None or not self._decoder.eof:
            raise MalformedRequestError(f"the {self.encoding} body is cut short")


def content_encoding(request: Request) -> str:
    """The body's Content-Encoding (identity, gzip or deflate); 415 for any other."""
    encoding = (header(request, b"content-encoding") or "").strip().lower()
    if encoding in ("", "identity") or encoding in ENCODINGS:
        return encoding
    # the header is the client's input: named only when it is short and plain
    shown = repr(encoding) if len(encoding) <= 20 and encoding.replace("-", "").isalnum() else "this one"
    raise UnsupportedMediaTypeError(
        f"Content-Encoding {shown} is not accepted; send gzip, deflate or identity"
    )


_DIGITS = re.compile(r"[0-9]{1,19}")


def byte_count(value: str | None, what: str) -> int | None:
    """A header's byte count (ASCII digits only: ``str.isdigit`` takes other scripts'
    digits, which ``int`` then refuses); None when absent, 400 when not a count."""
    if value is None:
        return None
    value = value.strip()
    if not _DIGITS.fullmatch(value):
        raise MalformedRequestError(f"{what} must be a byte count (ASCII digits)")
    return int(value)


def _capped(request: Request, limit: int, timeout: float) -> Receive:
    """The request's receive channel, refused past ``limit`` body bytes (a declared
    Content-Length over it at once; a compressed body once it decompresses past it: it
    comes out decompressed, a piece at a time) or when the whole body has not arrived
    within ``timeout`` seconds (a stalled client): 413 or 408. Each byte is charged to
    the gateway's budget of body bytes in flight (:mod:`gateway.http.budget`)."""
    encoding = content_encoding(request)
    declared = byte_count(header(request, b"content-length"), "Content-Length")
    if declared is not None and declared > limit:
        raise PayloadTooLargeError(f"the body ({declared} bytes) exceeds the {limit} byte limit")
    reservation = reservation_of(request.scope)
    caller = request.scope.get("state", {}).get("caller")
    if reservation.holder is None and caller is not None:
        reservation.holder = caller.client  # held in its name: no caller holds the whole budget
    reservation.admit(declared)
    receive = request.receive
    seen = 0
    deadline = asyncio.get_running_loop().time() + timeout
    inflater = _Inflater(encoding, limit) if encoding in ENCODINGS else None
    upstream_done = False
    arrived: BodyArrival | None = request.scope.get(BODY_ARRIVED)
    last_read = False  # the message that ends the body was read

    async def inflated() -> Message:
        assert inflater is not None
        await asyncio.sleep(0)  # others run between pieces
        body = inflater.piece()
        reservation.charge(len(body))
        more = inflater.busy or not upstream_done
        if not more:
            inflater.finish()
        return {"type": "http.request", "body": body, "more_body": more}

    async def wrapped() -> Message:
        nonlocal seen, upstream_done, last_read
        if inflater is not None and inflater.busy:
            return await inflated()
        if arrived is not None and arrived.done and not last_read:
            message = await receive()  # all here: nothing to wait for
        else:
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise RequestTimeoutError(f"the body did not arrive within {timeout:g} s") from None
        if message["type"] == "http.request":
            last_read = not message.get("more_body", False)
            body = message.get("body", b"")
            seen += len(body)
            if seen > limit:
                raise PayloadTooLargeError(f"the body exceeds the {limit} byte limit for this content type")
            if inflater is None:
                reservation.charge(len(body))
                return message
            upstream_done = last_read
            inflater.push(body)
            return await inflated()
        return message

    return wrapped


async def limited_body(request: Request, limit: int, seconds: float) -> bytes:
    """The whole body through :func:`_capped` (413 past ``limit``, 408 past ``seconds``),
    read straight from the channel: no request object in between."""
    receive = _capped(request, limit, seconds)
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


# The scan takes a message a slice at a time; after a slice dense with structure (each
# token costs the scan a step in Python) the loop is let go: 8 KiB of "[[[[" is 4 ms.
_SLICE = 8 * 1024
_DENSE = 512


async def _scan(scan: JsonScan, data: bytes) -> None:
    if len(data) <= _SLICE:
        scan.feed(data)
        return
    for offset in range(0, len(data), _SLICE):
        before = scan.tokens
        scan.feed(data[offset : offset + _SLICE])
        if scan.tokens - before > _DENSE:
            await asyncio.sleep(0)


class JsonBody(NamedTuple):
    """A JSON body read under its bounds: the document, the JSON's size in bytes, and
    what follows the JSON (the binary tensors of a /v2 request; empty elsewhere)."""

    document: dict[str, Any]
    size: int
    rest: bytes


async def read_json(
    request: Request,
    limit: int,
    seconds: float,
    bounds: Callable[[], JsonBounds],
    workers: CheckWorkers,
    json_bytes: int | None = None,
) -> JsonBody:
    """The body through :func:`_capped`, its first ``json_bytes`` (all: None) a JSON
    object scanned against ``bounds()`` as it arrives (:mod:`gateway.serving.jsonguard`):
    a body that no valid request resembles is refused before it is all read (or all
    decompressed) and before anything parses it. A small body read in one message is
    parsed at once (its bounds never built); a larger one off the event loop, its long
    strings a piece at a time."""
    receive = _capped(request, limit, seconds)
    message = await receive()
    if message["type"] == "http.disconnect":
        raise ClientDisconnect
    first = message.get("body", b"")
    end = len(first) if json_bytes is None else json_bytes
    if not message.get("more_body", False) and len(first) <= WHOLE_BYTES:
        if end > len(first):
            raise MalformedRequestError("the JSON header's length runs past the body")
        return JsonBody(parse_json_object(first[:end]), end, first[end:])
    scan = JsonScan(bounds())
    held = bytearray()
    while True:
        body = message.get("body", b"")
        wanted = len(body) if json_bytes is None else json_bytes - len(held)
        if wanted > 0:
            await _scan(scan, body[:wanted] if wanted < len(body) else body)
        held += body
        if not message.get("more_body", False):
            break
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnect
    end = len(held) if json_bytes is None else json_bytes
    if end > len(held):
        raise MalformedRequestError("the JSON header's length runs past the body")
    scan.finish()
    spans = scan.spans
    document = await workers.run(
        end, parse_scanned, memoryview(held)[:end], spans, parse_json_object, parse_json_value
    )
    if not isinstance(document, dict):
        raise InvalidInputError("the JSON body must be an object")
    return JsonBody(document, end, bytes(held[end:]))


async def _read_multipart(request: Request, settings: Settings) -> ClassifyInput:
    parts = FileParts(
        boundary_of(header(request, b"content-type") or ""),
        max_parts=_MAX_PARTS,
        max_files=settings.image.max_images,
        max_file_bytes=settings.image.max_bytes,
    )
    capped = Request(
        request.scope, _capped(request, settings.max_body_bytes, settings.server.body_timeout_seconds)
    )
    try:
        async for piece in capped.stream():
            if piece:
                parts.feed(piece)
        return ClassifyInput(images=parts.finish())
    finally:
        parts.close()


async def _read_raw(request: Request, settings: Settings) -> ClassifyInput:
    body = await limited_body(request, settings.image.max_bytes, settings.server.body_timeout_seconds)
    return ClassifyInput(images=[body])


def classify_bounds(settings: Settings) -> JsonBounds:
    """What a JSON /classify body can hold: an object of lists of strings and a few
    scalars (two levels), as many strings as the list caps allow, one base64 image at
    its cap (with room for a data: prefix and escaped line breaks) as its longest string,
    and the text caps once a text key is seen."""
    caps = settings.list_caps()
    return JsonBounds(
        max_depth=2,
        max_tokens=2 * (sum(caps.values()) + 16),
        max_string_bytes=2 * (-(-settings.image.max_bytes * 4 // 3)) + 64 * 1024,
        max_bare_bytes=64 * 1024,
        text_keys=frozenset({b"text", b"texts", b"input"}),
        text_limit=settings.max_text_body_bytes,
    )


_OWN_KEYS = frozenset({"image", "images", "text", "texts"})
_JSON_KEYS = frozenset(ClassifyJSONRequest.model_fields)


def _task_from(document: dict[str, Any], body_size: int, settings: Settings) -> ClassifyInput:
    """vLLM's classification body (``{"model", "input": str | [str]}``; its other fields,
    such as ``user`` or ``priority``, are ignored as vLLM's own server ignores unknown ones)."""
    if body_size > settings.max_text_body_bytes:
        raise PayloadTooLargeError(
            f"a text request may be at most {settings.max_text_body_bytes} bytes; this one is {body_size}"
        )
    model, raw = document.get("model"), document.get("input")
    if not isinstance(model, str) or not model:
        raise InvalidInputError("'model' must name a text classifier")
    items = [raw] if isinstance(raw, str) else raw
    if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
        raise InvalidInputError("'input' must be a text or a list of texts")
    check_count(len(items), settings.text.max_texts, "inputs")
    texts = [normalize_text(item, settings.text.max_chars, f"input {i}") for i, item in enumerate(items)]
    return ClassifyInput(texts=texts, task_model=model)


async def _read_json(request: Request, settings: Settings, workers: CheckWorkers) -> ClassifyInput:
    body = await read_json(
        request,
        settings.max_json_body_bytes,
        settings.server.body_timeout_seconds,
        partial(classify_bounds, settings),
        workers,
    )
    return await workers.run(body.size, classify_input, body.document, body.size, settings)


def _check_shape(document: dict[str, Any], body_size: int, settings: Settings, caps: dict[str, int]) -> None:
    """Refuse, before any per-item work, what no valid request has: unknown keys, lists over
    their caps (413), a text request bigger than the text caps allow (413)."""
    if not _JSON_KEYS.issuperset(document):
        unknown = len(document.keys() - _JSON_KEYS)
        raise InvalidInputError(
            f"the JSON body has {unknown} unknown key(s)",
            errors=[{"loc": ["<unknown key>"], "msg": "Extra inputs are not permitted"}],
        )
    for key, cap in caps.items():
        value = document.get(key)
        if isinstance(value, list) and len(value) > cap:
            raise PayloadTooLargeError(f"{len(value)} {key} in one request; the limit is {cap}")
    if ("text" in document or "texts" in document) and body_size > settings.max_text_body_bytes:
        raise PayloadTooLargeError(
            f"a text request may be at most {settings.max_text_body_bytes} bytes; this one is {body_size}"
        )


def classify_input(document: dict[str, Any], size: int, settings: Settings) -> ClassifyInput:
    """A parsed JSON /classify body of ``size`` bytes -> ClassifyInput (CPU-bound: base64;
    run off the loop when large)."""
    if "input" in document and not document.keys() & _OWN_KEYS:
        return _task_from(document, size, settings)
    caps = settings.list_caps()
    _check_shape(document, size, settings, caps)
    model = classify_json_model(**caps)
    try:
        parsed = model.model_validate(document)
    except ValidationError as exc:
        raise InvalidInputError(
            "the JSON body is invalid", errors=summarise_validation_errors(exc.errors(), model.model_fields)
        ) from exc
    given = [name for name in ("image", "images", "text", "texts") if getattr(parsed, name) is not None]
    if len(given) != 1:
        raise InvalidInputError("give exactly one of 'image', 'images', 'text' or 'texts'")
    if given[0] in ("text", "texts"):
        return _texts_from(parsed, settings)
    if parsed.candidate_labels is not None:
        raise InvalidInputError("candidate_labels applies to texts only")
    encoded = [parsed.image] if parsed.image is not None else list(parsed.images or [])
    check_count(len(encoded), settings.image.max_images, "images")
    images: list[bytes] = []
    for index, text in enumerate(encoded):
        try:
            images.append(decode_base64_image(text, settings.image))
        except (MalformedRequestError, PayloadTooLargeError) as exc:
            exc.at(index)
            raise
    return ClassifyInput(images=images, top_k=parsed.top_k, threshold=parsed.threshold)


def _texts_from(parsed: ClassifyJSONRequest, settings: Settings) -> ClassifyInput:
    raw = [parsed.text] if parsed.text is not None else list(parsed.texts or [])
    check_count(len(raw), settings.text.max_texts, "texts")
    texts: list[str] = []
    for index, value in enumerate(raw):
        try:
            texts.append(normalize_text(value, settings.text.max_chars))
        except (InvalidInputError, PayloadTooLargeError) as exc:
            exc.at(index)
            raise
    labels = None
    if parsed.candidate_labels is not None:
        labels = normalize_labels(parsed.candidate_labels, settings.text)
    return ClassifyInput(texts=texts, candidate_labels=labels, top_k=parsed.top_k, threshold=parsed.threshold)


async def read_classify_input(request: Request, settings: Settings, workers: CheckWorkers) -> ClassifyInput:
    """Dispatch on the declared media type; the image bytes themselves are sniffed later."""
    kind = media_type(request)
    if kind == "multipart/form-data":
        return await _read_multipart(request, settings)
    if kind == "application/json" or (kind.startswith("application/") and kind.endswith("+json")):
        return await _read_json(request, settings, workers)
    if kind in RAW_IMAGE_TYPES:
        return await _read_raw(request, settings)
    # The declared type is the client's input: named only when it is short and plain.
    shown = "no Content-Type" if not kind else "this Content-Type"
    raise UnsupportedMediaTypeError(f"{shown} is not accepted; send one of {', '.join(ACCEPTED_TYPES)}")
