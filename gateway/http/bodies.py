"""Reading /classify bodies from the wire, with size caps enforced while reading.

Turns the three accepted transports (multipart, raw image bytes, JSON) into one
:class:`ClassifyInput`; what the bytes are worth is judged later by
:mod:`gateway.serving.validation`.
"""

from __future__ import annotations

import asyncio
import zlib
from typing import Any

from pydantic import ValidationError
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException
from starlette.requests import ClientDisconnect, Request
from starlette.types import Message, Receive

from gateway.errors import (
    InvalidInputError,
    MalformedRequestError,
    PayloadTooLargeError,
    RequestTimeoutError,
    UnsupportedMediaTypeError,
    summarise_validation_errors,
)
from gateway.http.schemas import ClassifyJSONRequest, classify_json_model
from gateway.serving.payload import RAW_IMAGE_TYPES, ClassifyInput
from gateway.serving.validation import (
    check_count,
    decode_base64_image,
    normalize_labels,
    normalize_text,
    parse_json_object,
)
from gateway.serving.workers import CheckWorkers
from gateway.settings import Settings

ACCEPTED_TYPES = ("multipart/form-data", "application/json", *RAW_IMAGE_TYPES)
# Bounds the multipart parser itself; the image count cap is checked after parsing so
# that it answers 413 rather than the parser's generic error.
_MAX_PARTS = 1000


def expects_continue(request: Request) -> bool:
    """Whether the client waits for ``100 Continue`` before it sends its body."""
    return request.headers.get("expect", "").strip().lower() == "100-continue"


def media_type(request: Request) -> str:
    return request.headers.get("content-type", "").split(";", 1)[0].strip().lower()


# Content-Encoding -> zlib's wbits (gzip's header; deflate is zlib-wrapped, RFC 9110)
ENCODINGS = {"gzip": 31, "x-gzip": 31, "deflate": 15}


class _Inflater:
    """Decompresses a body chunk by chunk, never holding more than ``limit`` + 1 bytes of
    its output: a small body that would expand past the cap (a zip bomb) is refused
    while it is being decompressed, not after."""

    def __init__(self, encoding: str, limit: int) -> None:
        self.encoding = encoding
        self.limit = limit
        self.produced = 0
        self._decoder: Any = None

    def feed(self, chunk: bytes, last: bool) -> bytes:
        if self._decoder is None:
            wbits = ENCODINGS[self.encoding]
            # a raw deflate stream (no zlib header), as some clients send: accepted too
            if wbits == 15 and chunk and not (chunk[0] & 0x0F == 8 and int.from_bytes(chunk[:2]) % 31 == 0):
                wbits = -15
            self._decoder = zlib.decompressobj(wbits)
        out = []
        data = chunk
        try:
            while data:
                piece = self._decoder.decompress(data, self.limit - self.produced + 1)
                self.produced += len(piece)
                if self.produced > self.limit:
                    raise PayloadTooLargeError(
                        f"the body decompresses to over the {self.limit} byte limit for this content type"
                    )
                out.append(piece)
                data = self._decoder.unconsumed_tail
        except zlib.error as exc:
            raise MalformedRequestError(f"the {self.encoding} body is corrupt") from exc
        if last and not self._decoder.eof:
            raise MalformedRequestError(f"the {self.encoding} body is cut short")
        return b"".join(out)


def content_encoding(request: Request) -> str:
    """The body's Content-Encoding (identity, gzip or deflate); 415 for any other."""
    encoding = request.headers.get("content-encoding", "").strip().lower()
    if encoding in ("", "identity") or encoding in ENCODINGS:
        return encoding
    # the header is the client's input: named only when it is short and plain
    shown = repr(encoding) if len(encoding) <= 20 and encoding.replace("-", "").isalnum() else "this one"
    raise UnsupportedMediaTypeError(
        f"Content-Encoding {shown} is not accepted; send gzip, deflate or identity"
    )


def _capped(request: Request, limit: int, timeout: float) -> Receive:
    """The request's receive channel, refused past ``limit`` body bytes (a declared
    Content-Length over it at once; a compressed body once it decompresses past it: it
    comes out decompressed) or when the whole body has not arrived within ``timeout``
    seconds (a stalled client): 413 or 408."""
    encoding = content_encoding(request)
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLargeError(f"the body ({declared} bytes) exceeds the {limit} byte limit")
    receive = request.receive
    seen = 0
    deadline = asyncio.get_running_loop().time() + timeout
    inflater = _Inflater(encoding, limit) if encoding in ENCODINGS else None

    async def wrapped() -> Message:
        nonlocal seen
        try:
            async with asyncio.timeout_at(deadline):
                message = await receive()
        except TimeoutError:
            raise RequestTimeoutError(f"the body did not arrive within {timeout:g} s") from None
        if message["type"] == "http.request":
            body = message.get("body", b"")
            seen += len(body)
            if seen > limit:
                raise PayloadTooLargeError(f"the body exceeds the {limit} byte limit for this content type")
            if inflater is not None:
                message = {**message, "body": inflater.feed(body, last=not message.get("more_body", False))}
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


async def _read_multipart(request: Request, settings: Settings) -> ClassifyInput:
    capped = Request(
        request.scope, _capped(request, settings.max_body_bytes, settings.server.body_timeout_seconds)
    )
    try:
        async with capped.form(max_files=_MAX_PARTS, max_fields=_MAX_PARTS) as form:
            parts = form.getlist("file")
            check_count(len(parts), settings.image.max_images, "images ('file' parts)")
            images: list[bytes] = []
            for index, part in enumerate(parts):
                if not isinstance(part, UploadFile):
                    raise InvalidInputError("a 'file' part must be a file upload").at(index)
                if part.size is not None and part.size > settings.image.max_bytes:
                    raise PayloadTooLargeError(
                        f"the image is {part.size} bytes; the limit is {settings.image.max_bytes}"
                    ).at(index)
                images.append(await part.read())
    except (MultiPartException, HTTPException) as exc:
        raise MalformedRequestError("the multipart body is malformed") from exc
    return ClassifyInput(images=images)


async def _read_raw(request: Request, settings: Settings) -> ClassifyInput:
    body = await limited_body(request, settings.image.max_bytes, settings.server.body_timeout_seconds)
    return ClassifyInput(images=[body])


async def _read_json(request: Request, settings: Settings, workers: CheckWorkers) -> ClassifyInput:
    body = await limited_body(request, settings.max_json_body_bytes, settings.server.body_timeout_seconds)
    return await workers.run(len(body), parse_json_input, body, settings)


def _check_shape(document: dict[str, Any], body_size: int, settings: Settings, caps: dict[str, int]) -> None:
    """Refuse, before any per-item work, what no valid request has: unknown keys, lists over
    their caps (413), a text request bigger than the text caps allow (413)."""
    unknown = len(document.keys() - ClassifyJSONRequest.model_fields.keys())
    if unknown:
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


def parse_json_input(body: bytes, settings: Settings) -> ClassifyInput:
    """A JSON /classify body -> ClassifyInput (CPU-bound: run off the loop when large)."""
    document = parse_json_object(body)
    caps = settings.list_caps()
    _check_shape(document, len(body), settings, caps)
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
