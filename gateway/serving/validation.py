"""Cheap checks on client input before anything reaches Triton. Pure functions, no web framework.

Texts must be valid Unicode; they are normalised to NFC and stripped of control
characters other than tab, LF and CR (see :func:`normalize_text`).

Images are judged by their bytes and their header only: the format is sniffed from
magic bytes (the declared Content-Type is not trusted) and the dimensions and frame
count come from Pillow's header parser; pixels are never decoded here.
"""

from __future__ import annotations

import binascii
import io
import json
import re
import unicodedata
from dataclasses import dataclass
from typing import Any

import pybase64
from PIL import Image, UnidentifiedImageError

from gateway import jsoncodec
from gateway.errors import (
    ClientError,
    ImageTooLargeError,
    InvalidInputError,
    MalformedRequestError,
    PayloadTooLargeError,
    UnsupportedImageFormatError,
)
from gateway.settings import ImageLimits, TextLimits

# Formats Triton's image_preprocess decodes, by Pillow's name.
ACCEPTED_FORMATS = ("JPEG", "PNG", "WEBP")
# image_preprocess decodes these at full size (JPEGs decode scaled down, in draft mode).
FULL_DECODE_FORMATS = ("PNG", "WEBP")

# Signatures of formats we recognise, accepted or not: naming a refused format
# ("TIFF is not accepted") helps more than "unrecognised".
_SIGNATURES: tuple[tuple[bytes, str], ...] = (
    (b"\xff\xd8\xff", "JPEG"),
    (b"\x89PNG\r\n\x1a\n", "PNG"),
    (b"GIF87a", "GIF"),
    (b"GIF89a", "GIF"),
    (b"II*\x00", "TIFF"),
    (b"MM\x00*", "TIFF"),
    (b"BM", "BMP"),
    (b"%!PS", "EPS"),
    (b"\xc5\xd0\xd3\xc6", "EPS"),
    (b"%PDF-", "PDF"),
    (b"\x00\x00\x01\x00", "ICO"),
    (b"8BPS", "PSD"),
    (b"\xff\x0a", "JPEG XL"),
    (b"\x00\x00\x00\x0cJXL ", "JPEG XL"),
)


# Segments a header may hold before the image data. Real files have a few dozen; Pillow
# walks them in Python, so an 8 MiB file of 600k empty chunks would hold the event loop
# for seconds. Counting them is a cheap walk over lengths, capped here.
MAX_HEADER_SEGMENTS = 256
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# JPEG markers without a length field: TEM and RST0..RST7 (SOI is skipped before the walk).
_JPEG_STANDALONE = frozenset({0x01, *range(0xD0, 0xD8)})


@dataclass(frozen=True)
class ImageInfo:
    """What the header says about an accepted image."""

    format: str
    width: int
    height: int
    frames: int
    size_bytes: int


def sniff_format(data: bytes) -> str | None:
    """The format the magic bytes announce, or None when unrecognised."""
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WEBP"
    if data[4:8] == b"ftyp":
        brand = data[8:12]
        return "AVIF" if brand in (b"avif", b"avis") else "HEIF"
    for signature, name in _SIGNATURES:
        if data.startswith(signature):
            return name
    head = data[:256].lstrip().lower()
    if head.startswith((b"<?xml", b"<svg")) or b"<svg" in head:
        return "SVG"
    return None


def _png_segments(data: bytes, limit: int) -> int:
    """Chunks before the first IDAT (what Pillow reads to open a PNG), counting up to ``limit + 1``."""
    position, count = len(_PNG_SIGNATURE), 0
    while position + 8 <= len(data) and count <= limit:
        length = int.from_bytes(data[position : position + 4], "big")
        if data[position + 4 : position + 8] == b"IDAT":
            break
        position += 12 + length
        count += 1
    return count


# Bytes that are not markers, between a JPEG's segments, that the header may hold: Pillow
# skips such junk one byte at a time in Python (7 MiB of it held the loop for 1.2 s), and
# libjpeg calls a few "extraneous bytes" corrupt data it can live with.
MAX_JPEG_JUNK = 1024


def _jpeg_segments(data: bytes, limit: int) -> int:
    """Marker segments before the first SOS (what Pillow reads to open a JPEG), up to
    ``limit + 1``; InvalidInputError when junk between them passes MAX_JPEG_JUNK."""
    position, count, size, junk = 2, 0, len(data), 0
    while position + 4 <= size and count <= limit:
        if data[position] != 0xFF:
            found = data.find(b"\xff", position, position + MAX_JPEG_JUNK + 1 - junk)
            if found < 0:
                raise InvalidInputError(
                    f"the JPEG header has over {MAX_JPEG_JUNK} bytes that are not markers before its image data"
                )
            junk += found - position
            position = found
            continue
        marker = data[position + 1]
        if marker == 0xFF:  # fill byte
            position += 1
            continue
        if marker == 0xDA:  # start of scan: the image data follows
            break
        count += 1
        if marker in _JPEG_STANDALONE:
            position += 2
        else:
            position += 2 + int.from_bytes(data[position + 2 : position + 4], "big")
    return count


def count_header_segments(data: bytes, detected: str, limit: int = MAX_HEADER_SEGMENTS) -> int:
    """How many segments precede the image data (up to ``limit + 1``); 0 for other formats."""
    if detected == "PNG":
        return _png_segments(data, limit)
    if detected == "JPEG":
        return _jpeg_segments(data, limit)
    return 0


def inspect_image(data: bytes, limits: ImageLimits, formats: tuple[str, ...] = ACCEPTED_FORMATS) -> ImageInfo:
    """Check one encoded image against the limits and the model's ``formats`` (a subset of
    ACCEPTED_FORMATS), from its bytes and header only."""
    if not data:
        raise InvalidInputError("the image is empty (0 bytes)")
    if len(data) > limits.max_bytes:
        raise PayloadTooLargeError(f"the image is {len(data)} bytes; the limit is {limits.max_bytes}")
    detected = sniff_format(data)
    if detected not in formats:
        what = "not a recognised image format" if detected is None else f"{detected}, which is not accepted"
        raise UnsupportedImageFormatError(f"the data is {what}; send {', '.join(formats)}")
    if count_header_segments(data, detected) > MAX_HEADER_SEGMENTS:
        raise InvalidInputError(
            f"the {detected} header has over {MAX_HEADER_SEGMENTS} segments before the image data"
        )
    try:
        # Reads the header only; restricting formats keeps Pillow from trying others.
        with Image.open(io.BytesIO(data), formats=[detected]) as image:
            width, height = image.size
            frames = int(getattr(image, "n_frames", 1))
    except Image.DecompressionBombError as exc:
        # Pillow's own guard (far above our cap) fired while reading the header.
        raise ImageTooLargeError(f"the header declares over {limits.max_pixels} pixels") from exc
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, EOFError) as exc:
        raise InvalidInputError(f"the {detected} header cannot be read") from exc
    if width < 1 or height < 1:
        raise InvalidInputError(f"the {detected} header declares an empty image ({width}x{height})")
    if max(width, height) > limits.max_side:
        raise ImageTooLargeError(f"{width}x{height} has a side over the {limits.max_side} pixel limit")
    if width * height > limits.max_pixels:
        raise ImageTooLargeError(
            f"{width}x{height} is {width * height} pixels; the limit is {limits.max_pixels}"
        )
    if detected in FULL_DECODE_FORMATS and width * height > limits.max_pixels_full_decode:
        raise ImageTooLargeError(
            f"{width}x{height} is {width * height} pixels; the limit for {detected} "
            f"(decoded at full size) is {limits.max_pixels_full_decode}"
        )
    if frames > limits.max_frames:
        raise ImageTooLargeError(f"the image has {frames} frames; the limit is {limits.max_frames}")
    return ImageInfo(format=detected, width=width, height=height, frames=frames, size_bytes=len(data))


def check_count(count: int, limit: int, what: str) -> None:
    """At least one input, at most ``limit`` of them (a cap: 413)."""
    if count == 0:
        raise InvalidInputError(f"no {what} given")
    if count > limit:
        raise PayloadTooLargeError(f"{count} {what} in one request; the limit is {limit}")


def inspect_images(
    images: list[bytes], limits: ImageLimits, formats: tuple[str, ...] = ACCEPTED_FORMATS
) -> list[ImageInfo]:
    """inspect_image for each; an error names the input it is about."""
    found = []
    for index, data in enumerate(images):
        try:
            found.append(inspect_image(data, limits, formats))
        except ClientError as exc:
            exc.at(index)
            raise
    return found


def decode_base64_image(text: str, limits: ImageLimits) -> bytes:
    """Base64 (standard alphabet, padding required, a data: URL prefix allowed) -> bytes."""
    if text.startswith("data:"):
        header, sep, text = text.partition(",")
        if not sep or not header.endswith(";base64"):
            raise MalformedRequestError("a data: URL must be base64 encoded (data:<type>;base64,<data>)")
    if len(text) > -(-limits.max_bytes * 4 // 3) + 1024:
        raise PayloadTooLargeError(f"the encoded image exceeds the {limits.max_bytes} byte limit")
    try:
        return pybase64.b64decode(text, validate=True)  # SIMD: ~40x the standard library's
    except (binascii.Error, ValueError):
        pass
    compact = "".join(text.split())  # MIME-style line breaks are common in base64 from tools
    try:
        return pybase64.b64decode(compact, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise MalformedRequestError("an image is not valid base64") from exc


def _refuse_constant(name: str) -> Any:
    raise InvalidInputError(f"{name} is not a valid JSON number")


def parse_json_value(body: bytes | memoryview) -> Any:
    """Strict JSON: UTF-8, no NaN or Infinity; any value."""
    try:
        return jsoncodec.loads(body)  # the fast parser takes every well-formed document
    except ValueError:
        return _judged(bytes(body))


def parse_json_object(body: bytes | memoryview) -> dict[str, Any]:
    """Strict JSON: UTF-8, an object at the top, no NaN or Infinity."""
    value = parse_json_value(body)
    if not isinstance(value, dict):
        raise InvalidInputError("the JSON body must be an object")
    return value


def _judged(body: bytes) -> Any:
    """What the fast parser refused, read by the standard library, whose errors say what is
    wrong (a NaN is invalid input; a lone surrogate is read and refused by the text rule)."""
    try:
        return json.loads(body, parse_constant=_refuse_constant)
    except RecursionError as exc:
        raise MalformedRequestError("the JSON is nested too deeply") from exc
    except ValueError as exc:
        # JSONDecodeError, UnicodeDecodeError and the integer digit limit (a 100,000-digit
        # number) are all ValueErrors: whatever the parser refuses is malformed.
        raise MalformedRequestError("the body is not valid JSON") from exc


def resolve_top_k(query: int | None, body: int | None, default: int, maximum: int) -> int:
    """top_k may come from the query or the JSON body, not both with different values."""
    if query is not None and body is not None and query != body:
        raise InvalidInputError("top_k is given twice, with different values")
    top_k = query if query is not None else body if body is not None else default
    if not 1 <= top_k <= maximum:
        raise InvalidInputError(f"top_k must be between 1 and {maximum}")
    return top_k


def resolve_threshold(query: float | None, body: float | None) -> float | None:
    """threshold may come from the query or the JSON body, not both with different values
    (each is checked to be in (0, 1] where it is read)."""
    if query is not None and body is not None and query != body:
        raise InvalidInputError("threshold is given twice, with different values")
    return query if query is not None else body


# C0 and C1 control characters (Unicode category Cc) except tab, line feed, carriage return.
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


def normalize_text(value: str, max_chars: int, what: str = "the text") -> str:
    """The documented text rule: valid Unicode, NFC, control characters other than tab,
    LF and CR removed, not empty or whitespace only, at most ``max_chars`` characters."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidInputError(f"{what} is not valid Unicode (it has a lone surrogate)") from exc
    if len(value) > 4 * max_chars:  # cheap early refusal before normalising a huge string
        raise PayloadTooLargeError(f"{what} has over {max_chars} characters")
    value = _CONTROL.sub("", unicodedata.normalize("NFC", value))
    if not value.strip():
        raise InvalidInputError(f"{what} is empty or only whitespace")
    if len(value) > max_chars:
        raise PayloadTooLargeError(f"{what} has {len(value)} characters; the limit is {max_chars}")
    return value


def normalize_labels(labels: list[str], limits: TextLimits) -> list[str]:
    """candidate_labels: 1..max of them, each a valid short text, no repeats."""
    check_count(len(labels), limits.max_candidate_labels, "candidate_labels")
    clean = [normalize_text(label, limits.max_label_chars, "a candidate label").strip() for label in labels]
    if len(set(clean)) != len(clean):
        raise InvalidInputError("candidate_labels repeats a label")
    return clean
