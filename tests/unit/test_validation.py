"""Pure validation rules: formats from magic bytes, header caps, base64, JSON, top_k."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from gateway.errors import (
    ImageTooLargeError,
    InvalidInputError,
    MalformedRequestError,
    PayloadTooLargeError,
    UnsupportedImageFormatError,
)
from gateway.serving.validation import (
    decode_base64_image,
    inspect_image,
    parse_json_object,
    resolve_top_k,
    sniff_format,
)
from gateway.settings import ImageLimits

from helpers.support import (
    EPS_BYTES,
    SVG_BYTES,
    chelsea_jpeg,
    coffee_png,
    coffee_webp,
    encode,
    png_header_only,
    random_bytes,
    small_png,
    tiff_bytes,
)

LIMITS = ImageLimits()


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (chelsea_jpeg(), "JPEG"),
        (coffee_png(), "PNG"),
        (coffee_webp(), "WEBP"),
        (tiff_bytes(), "TIFF"),
        (EPS_BYTES, "EPS"),
        (SVG_BYTES, "SVG"),
        (b"GIF89a" + b"\x00" * 20, "GIF"),
        (b"%PDF-1.7\n", "PDF"),
        (random_bytes(), None),
        (b"", None),
    ],
)
def test_sniff_format_reads_magic_bytes(data: bytes, expected: str | None) -> None:
    assert sniff_format(data) == expected


def test_inspect_reads_dimensions_from_header() -> None:
    info = inspect_image(chelsea_jpeg(), LIMITS)
    assert (info.format, info.width, info.height, info.frames) == ("JPEG", 451, 300, 1)


def test_inspect_accepts_png_and_webp() -> None:
    assert inspect_image(coffee_png(), LIMITS).format == "PNG"
    assert inspect_image(coffee_webp(), LIMITS).format == "WEBP"


def test_empty_image_is_invalid_input() -> None:
    with pytest.raises(InvalidInputError) as caught:
        inspect_image(b"", LIMITS)
    assert caught.value.status == 422


@pytest.mark.parametrize("data", [random_bytes(), tiff_bytes(), EPS_BYTES, SVG_BYTES])
def test_other_formats_are_unsupported(data: bytes) -> None:
    with pytest.raises(UnsupportedImageFormatError) as caught:
        inspect_image(data, LIMITS)
    assert caught.value.status == 415


def test_header_claiming_huge_dimensions_is_refused_without_decoding() -> None:
    bomb = png_header_only(50_000, 50_000)
    assert len(bomb) < 200
    with pytest.raises(ImageTooLargeError) as caught:
        inspect_image(bomb, LIMITS)
    assert caught.value.status == 413
    assert caught.value.slug == "image-too-large"


def test_pixel_cap_applies_when_each_side_is_allowed() -> None:
    with pytest.raises(ImageTooLargeError, match="pixels"):
        inspect_image(png_header_only(10_000, 5_000), LIMITS)


def test_png_and_webp_have_a_lower_pixel_cap_than_jpeg() -> None:
    """They decode at full size in image_preprocess (gateway/bench/preprocess.py)."""
    assert LIMITS.max_pixels_full_decode < LIMITS.max_pixels
    side = int(LIMITS.max_pixels_full_decode**0.5) + 1
    with pytest.raises(ImageTooLargeError, match="decoded at full size"):
        inspect_image(png_header_only(side, side), LIMITS)
    assert inspect_image(png_header_only(side - 2, side - 2), LIMITS).width == side - 2
    webp = encode(np.zeros((64, 64, 3), np.uint8), "WEBP")
    with pytest.raises(ImageTooLargeError, match="decoded at full size"):
        inspect_image(webp, ImageLimits(max_pixels_full_decode=64 * 63))
    jpeg = chelsea_jpeg()  # 451x300: a JPEG is held to max_pixels only
    assert inspect_image(jpeg, ImageLimits(max_pixels_full_decode=100)).format == "JPEG"


def test_limits_are_configurable() -> None:
    strict = ImageLimits(max_pixels=63, max_side=100)
    with pytest.raises(ImageTooLargeError):
        inspect_image(small_png(8, 8), strict)
    assert inspect_image(small_png(7, 9), strict).width == 7


def test_byte_cap() -> None:
    with pytest.raises(PayloadTooLargeError):
        inspect_image(chelsea_jpeg(), ImageLimits(max_bytes=1000))


def test_frame_cap_for_animated_png() -> None:
    import numpy as np
    from PIL import Image

    frames = [Image.fromarray(np.full((4, 4, 3), i, dtype=np.uint8)) for i in range(5)]
    import io

    buffer = io.BytesIO()
    frames[0].save(buffer, "PNG", save_all=True, append_images=frames[1:])
    with pytest.raises(ImageTooLargeError, match="5 frames"):
        inspect_image(buffer.getvalue(), ImageLimits(max_frames=4))
    assert inspect_image(buffer.getvalue(), ImageLimits(max_frames=5)).frames == 5


def test_unreadable_header_of_accepted_format_is_invalid() -> None:
    with pytest.raises(InvalidInputError):
        inspect_image(b"\x89PNG\r\n\x1a\n" + b"\x00" * 30, LIMITS)


def test_base64_round_trip_with_data_url_and_line_breaks() -> None:
    data = small_png()
    text = base64.b64encode(data).decode()
    assert decode_base64_image(text, LIMITS) == data
    assert decode_base64_image("data:image/png;base64," + text, LIMITS) == data
    assert decode_base64_image("\n".join(text[i : i + 20] for i in range(0, len(text), 20)), LIMITS) == data


@pytest.mark.parametrize("text", ["not base64!!", "abc", "data:image/png,rawdata", "é" * 8])
def test_invalid_base64_is_malformed(text: str) -> None:
    with pytest.raises(MalformedRequestError) as caught:
        decode_base64_image(text, LIMITS)
    assert caught.value.status == 400


def test_oversized_base64_is_refused_before_decoding() -> None:
    with pytest.raises(PayloadTooLargeError):
        decode_base64_image("A" * 4000, ImageLimits(max_bytes=1000))


@pytest.mark.parametrize("body", [b'{"a": NaN}', b'{"a": Infinity}', b'{"a": -Infinity}'])
def test_json_nan_is_invalid_input(body: bytes) -> None:
    with pytest.raises(InvalidInputError) as caught:
        parse_json_object(body)
    assert caught.value.status == 422


@pytest.mark.parametrize("body", [b"{", b"", b"\xff\xfe", b'{"a": 1,}'])
def test_malformed_json_is_400(body: bytes) -> None:
    with pytest.raises(MalformedRequestError):
        parse_json_object(body)


def test_json_must_be_an_object() -> None:
    with pytest.raises(InvalidInputError):
        parse_json_object(b"[1, 2]")


def test_deeply_nested_json_is_malformed_not_a_crash() -> None:
    with pytest.raises(MalformedRequestError):
        parse_json_object(b"[" * 100_000 + b"]" * 100_000)


def test_resolve_top_k() -> None:
    assert resolve_top_k(None, None, 5, 20) == 5
    assert resolve_top_k(3, None, 5, 20) == 3
    assert resolve_top_k(None, 7, 5, 20) == 7
    assert resolve_top_k(4, 4, 5, 20) == 4
    with pytest.raises(InvalidInputError):
        resolve_top_k(3, 4, 5, 20)
    with pytest.raises(InvalidInputError):
        resolve_top_k(None, 11, 5, 10)


def test_error_index_is_reported() -> None:
    error = InvalidInputError("bad").at(3)
    assert error.problem("rid", "/classify")["input_index"] == 3


def test_webp_encode_sanity() -> None:
    # Guards the fixtures themselves: a WebP that Pillow wrote is sniffed as WebP.
    import numpy as np

    assert sniff_format(encode(np.zeros((2, 2, 3), dtype=np.uint8), "WEBP")) == "WEBP"


def test_normalize_text_rules() -> None:
    from gateway.serving.validation import normalize_text

    assert normalize_text("e\u0301", 10) == "\u00e9"
    assert normalize_text("a\x00b\x1bc\x7fd\x85e", 10) == "abcde"
    assert normalize_text("tab\tnew\nline\r", 20) == "tab\tnew\nline\r"
    with pytest.raises(InvalidInputError, match="lone surrogate"):
        normalize_text("\ud800", 10)
    with pytest.raises(InvalidInputError, match="empty"):
        normalize_text(" \x00\n", 10)
    with pytest.raises(PayloadTooLargeError):
        normalize_text("x" * 11, 10)
    # The cap counts characters after NFC: 10 decomposed pairs make 10 characters.
    assert len(normalize_text("e\u0301" * 10, 10)) == 10


def test_normalize_labels_rules() -> None:
    from gateway.serving.validation import normalize_labels
    from gateway.settings import TextLimits

    limits = TextLimits(max_candidate_labels=3, max_label_chars=5)
    assert normalize_labels([" a ", "b"], limits) == ["a", "b"]
    with pytest.raises(InvalidInputError):
        normalize_labels(["a", "a "], limits)
    with pytest.raises(PayloadTooLargeError):
        normalize_labels(["a", "b", "c", "d"], limits)
    with pytest.raises(PayloadTooLargeError):
        normalize_labels(["abcdef"], limits)
    with pytest.raises(InvalidInputError):
        normalize_labels([], limits)


def test_a_jpeg_header_of_junk_is_refused_before_pillow_walks_it() -> None:
    """Pillow skips non-marker bytes one at a time in Python: 7 MiB of them took it 0.43 s,
    on the event loop. Past MAX_JPEG_JUNK such bytes the header is refused from a C-speed
    search; a real photo passes."""
    import time

    from gateway.serving.validation import MAX_JPEG_JUNK, inspect_image
    from gateway.settings import ImageLimits

    junk = b"\xff\xd8\xff" + bytes(7 * 2**20 - 3)
    started = time.perf_counter()
    with pytest.raises(InvalidInputError, match=f"over {MAX_JPEG_JUNK} bytes that are not markers"):
        inspect_image(junk, ImageLimits())
    print(f"refused in {(time.perf_counter() - started) * 1000:.2f} ms")
    from helpers.support import chelsea_jpeg

    assert inspect_image(chelsea_jpeg(), ImageLimits()).format == "JPEG"
