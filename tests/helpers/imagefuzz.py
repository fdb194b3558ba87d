"""Real JPEG/PNG/WebP files with metadata (EXIF, XMP, ICC, text chunks), and a Hypothesis
strategy that mutates them where decoders are weakest: inside those metadata segments,
in segment lengths and anywhere else in the file.

Hypothesis draws every choice (which file, which segment, which operation, which bytes),
so a failure shrinks to a small reproducible mutation.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Literal

import numpy as np
from hypothesis import strategies as st
from PIL import Image, ImageCms, PngImagePlugin

XMP = (
    b'<?xpacket begin="" id="W5M0MpCehiHzreSzNTczkc9d"?><x:xmpmeta xmlns:x="adobe:ns:meta/">'
    b'<rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#"><rdf:Description '
    b'xmlns:tiff="http://ns.adobe.com/tiff/1.0/" tiff:Orientation="6"/></rdf:RDF></x:xmpmeta>'
    b'<?xpacket end="w"?>'
)


Order = Literal["little", "big"]
Field = tuple[int, int, Order]  # offset, width in bytes, byte order


@dataclass(frozen=True)
class Seed:
    """A real file, the byte ranges of its segments, their length fields, and its EXIF IFD
    entries (tag, type, count, value): where one wrong number does most harm."""

    name: str
    data: bytes
    segments: tuple[tuple[int, int], ...]
    lengths: tuple[Field, ...]
    entries: tuple[Field, ...]


def _exif() -> bytes:
    exif = Image.Exif()
    exif[0x0112] = 6  # Orientation: rotate
    exif[0x010F] = "triton-gateway"  # Make
    exif[0x0131] = "fuzz seed"  # Software
    gps = exif.get_ifd(0x8825)
    gps[1] = "N"
    gps[2] = (52.0, 22.0, 1.5)
    exif_ifd = exif.get_ifd(0x8769)
    exif_ifd[0x9003] = "2026:11:23 10:00:00"
    return exif.tobytes()


def _photo() -> np.ndarray:
    from skimage import data

    photo = Image.fromarray(data.chelsea()).resize((72, 48))  # type: ignore[no-untyped-call]
    return np.asarray(photo)


def _exif_entries(data: bytes) -> list[Field]:
    """Every 12-byte entry of every IFD of the (first) EXIF block."""
    start = data.find(b"Exif\x00\x00")
    if start < 0:
        start = data.find(b"MM\x00*") if data.find(b"II*\x00") < 0 else data.find(b"II*\x00")
        if start < 0:
            return []
    else:
        start += 6
    tiff = data[start:]
    order: Order = "little" if tiff[:2] == b"II" else "big"
    fields: list[Field] = []
    pending, seen = [int.from_bytes(tiff[4:8], order)], set()
    while pending:
        ifd = pending.pop()
        if ifd in seen or ifd + 2 > len(tiff):
            continue
        seen.add(ifd)
        for i in range(int.from_bytes(tiff[ifd : ifd + 2], order)):
            entry = ifd + 2 + 12 * i
            if entry + 12 > len(tiff):
                break
            fields.append((start + entry, 12, order))
            if int.from_bytes(tiff[entry : entry + 2], order) in (0x8769, 0x8825):  # Exif and GPS IFDs
                pending.append(int.from_bytes(tiff[entry + 8 : entry + 12], order))
    return fields


def _jpeg_segments(data: bytes) -> list[tuple[int, int]]:
    found, position = [], 2
    while position + 4 <= len(data) and data[position] == 0xFF:
        marker = data[position + 1]
        if marker == 0xDA:
            found.append((position, min(len(data), position + 64)))
            break
        length = int.from_bytes(data[position + 2 : position + 4], "big")
        found.append((position, position + 2 + length))
        position += 2 + length
    return found


def _png_segments(data: bytes) -> list[tuple[int, int]]:
    found, position = [], 8
    while position + 8 <= len(data):
        length = int.from_bytes(data[position : position + 4], "big")
        found.append((position, min(len(data), position + 12 + length)))
        position += 12 + length
    return found


def _riff_segments(data: bytes) -> list[tuple[int, int]]:
    found, position = [], 12
    while position + 8 <= len(data):
        length = int.from_bytes(data[position + 4 : position + 8], "little")
        found.append((position, min(len(data), position + 8 + length + (length & 1))))
        position += 8 + length + (length & 1)
    return found


@cache
def seeds() -> tuple[Seed, ...]:
    photo = Image.fromarray(_photo())
    icc = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
    exif = _exif()
    made: list[Seed] = []

    def add(name: str, fmt: str, finder: Callable[[bytes], list[tuple[int, int]]], **options: object) -> None:
        buffer = io.BytesIO()
        photo.save(buffer, fmt, **options)
        data = buffer.getvalue()
        segments = finder(data)
        # where each segment's length field sits: offset from its start, width, byte order
        shift, width, order = {"JPEG": (2, 2, "big"), "PNG": (0, 4, "big"), "WEBP": (4, 4, "little")}[fmt]
        lengths: list[Field] = [
            (start + shift, width, "big" if order == "big" else "little") for start, _ in segments
        ]
        made.append(Seed(name, data, tuple(segments), tuple(lengths), tuple(_exif_entries(data))))

    add("jpeg-exif-icc-xmp", "JPEG", _jpeg_segments, quality=85, exif=exif, icc_profile=icc, xmp=XMP)
    add("jpeg-progressive-exif", "JPEG", _jpeg_segments, quality=70, progressive=True, exif=exif)
    text = PngImagePlugin.PngInfo()
    text.add_text("Comment", "a tEXt chunk")
    text.add_itxt("Description", "an iTXt chunk", lang="en")
    text.add_text("Title", "a zTXt chunk " * 20, zip=True)
    add("png-text-exif-icc", "PNG", _png_segments, pnginfo=text, exif=exif, icc_profile=icc)
    add("webp-exif-icc-xmp", "WEBP", _riff_segments, quality=80, exif=exif, icc_profile=icc, xmp=XMP)
    add("webp-lossless-exif", "WEBP", _riff_segments, lossless=True, exif=exif)
    return tuple(made)


_OPERATIONS = ("flip", "byte", "word", "dword", "insert", "delete", "duplicate")


@st.composite
def mutated_images(draw: st.DrawFn) -> bytes:
    """One real file with 1-4 mutations, most of them inside a metadata segment."""
    seed = draw(st.sampled_from(seeds()))
    data = bytearray(seed.data)
    for _ in range(draw(st.integers(1, 4))):
        if not data:
            break
        choice = draw(st.integers(0, 5))
        if seed.entries and choice < 3:
            # Type confusion, wild counts and offsets: the classic EXIF/TIFF bug classes.
            offset, _, order = draw(st.sampled_from(seed.entries))
            kind = draw(st.integers(0, 16))
            count = draw(st.one_of(st.integers(0, 64), st.sampled_from((2**31, 2**32 - 1))))
            value = draw(st.one_of(st.integers(0, 64), st.integers(0, 2**32 - 1)))
            data[offset + 2 : offset + 4] = kind.to_bytes(2, order)
            if draw(st.booleans()):
                data[offset + 4 : offset + 8] = count.to_bytes(4, order)
            if draw(st.booleans()):
                data[offset + 8 : offset + 12] = value.to_bytes(4, order)
            continue
        if seed.lengths and choice == 3:
            offset, width, order = draw(st.sampled_from(seed.lengths))
            top = 2 ** (8 * width) - 1
            value = draw(
                st.one_of(st.integers(0, 16), st.sampled_from((top, top // 2 + 1)), st.integers(0, top))
            )
            data[offset : offset + width] = value.to_bytes(width, order)
            continue
        if seed.segments and draw(st.integers(0, 3)) > 0:
            start, end = draw(st.sampled_from(seed.segments))
            end = min(end, len(data))
            start = min(start, max(0, end - 1))
        else:
            start, end = 0, len(data)
        position = draw(st.integers(start, max(start, end - 1)))
        operation = draw(st.sampled_from(_OPERATIONS))
        if operation == "flip":
            data[position] ^= 1 << draw(st.integers(0, 7))
        elif operation == "byte":
            data[position] = draw(st.sampled_from((0x00, 0x01, 0x7F, 0x80, 0xFF, draw(st.integers(0, 255)))))
        elif operation in ("word", "dword"):
            width = 2 if operation == "word" else 4
            value = draw(
                st.sampled_from(
                    (
                        0,
                        1,
                        2 ** (8 * width) - 1,
                        2 ** (8 * width - 1),
                        draw(st.integers(0, 2 ** (8 * width) - 1)),
                    )
                )
            )
            order = draw(st.sampled_from(("big", "little")))
            data[position : position + width] = value.to_bytes(width, order)
        elif operation == "insert":
            data[position:position] = draw(st.binary(min_size=1, max_size=64))
        elif operation == "delete":
            del data[position : position + draw(st.integers(1, 64))]
        else:
            size = draw(st.integers(1, 256))
            data[position:position] = data[position : position + size]
    return bytes(data)
