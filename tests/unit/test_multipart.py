"""The multipart reader: the ``file`` parts in order, whatever the pieces the body comes
in, and every bound checked while it streams."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import GatewayError, InvalidInputError, MalformedRequestError, PayloadTooLargeError
from gateway.http.multipart import MAX_PART_HEADER_BYTES, FileParts, boundary_of

BOUNDARY = b"b0undary"


def part(name: bytes, data: bytes, filename: bytes | None = b"x.jpg", extra: bytes = b"") -> bytes:
    disposition = b'form-data; name="' + name + b'"'
    if filename is not None:
        disposition += b'; filename="' + filename + b'"'
    return (
        b"--" + BOUNDARY + b"\r\nContent-Disposition: " + disposition + b"\r\n" + extra
        + b"Content-Type: application/octet-stream\r\n\r\n" + data + b"\r\n"
    )  # fmt: skip


def body(*parts: bytes) -> bytes:
    return b"".join(parts) + b"--" + BOUNDARY + b"--\r\n"


def read(data: bytes, piece: int = 1 << 20, **caps: int) -> list[bytes]:
    bounds = {"max_parts": 10, "max_files": 4, "max_file_bytes": 1000, **caps}
    parts = FileParts(BOUNDARY, **bounds)
    for start in range(0, len(data), piece):
        parts.feed(data[start : start + piece])
    return parts.finish()


def test_file_parts_come_in_order_and_other_fields_are_skipped() -> None:
    data = body(part(b"file", b"one"), part(b"note", b"ignored", filename=None), part(b"file", b"\r\n--two"))
    assert read(data) == [b"one", b"\r\n--two"]
    assert read(data, piece=1) == [b"one", b"\r\n--two"]  # a byte at a time


@settings(max_examples=200, deadline=None)
@given(
    files=st.lists(st.binary(max_size=300), min_size=1, max_size=4),
    piece=st.integers(min_value=1, max_value=400),
)
def test_any_content_in_any_pieces_reads_back(files: list[bytes], piece: int) -> None:
    assert read(body(*(part(b"file", f) for f in files)), piece=piece) == files


def problem(data: bytes, **caps: int) -> GatewayError:
    with pytest.raises(GatewayError) as raised:
        read(data, piece=7, **caps)
    return raised.value


def test_each_bound_is_a_clear_error_naming_the_image() -> None:
    too_big = problem(body(part(b"file", b"ok"), part(b"file", b"x" * 1001)))
    assert isinstance(too_big, PayloadTooLargeError)
    assert too_big.input_index == 1
    too_many = problem(body(*(part(b"file", b"x") for _ in range(5))))
    assert isinstance(too_many, PayloadTooLargeError)
    not_a_file = problem(body(part(b"file", b"x"), part(b"file", b"y", filename=None)))
    assert isinstance(not_a_file, InvalidInputError)
    assert not_a_file.input_index == 1
    assert isinstance(problem(body(part(b"note", b"no file"))), InvalidInputError)


@pytest.mark.parametrize(
    "data",
    [
        body(part(b"file", b"x"))[:-12],  # ends before the closing boundary
        b"--" + BOUNDARY + b"\r\nContent-Disposition: form-data\r\n\r\nx\r\n--" + BOUNDARY + b"--\r\n",
        body(part(b"file", b"x", extra=b"X-Pad: " + b"a" * MAX_PART_HEADER_BYTES + b"\r\n")),
        body(*(part(b"note", b"") for _ in range(11))),  # over max_parts
        b"not multipart at all",
    ],
    ids=["truncated", "no-name", "huge-header", "too-many-parts", "garbage"],
)
def test_a_malformed_body_is_a_400(data: bytes) -> None:
    assert isinstance(problem(data), MalformedRequestError)


def test_the_boundary_comes_from_the_content_type() -> None:
    assert boundary_of('multipart/form-data; boundary="b0undary"') == BOUNDARY
    with pytest.raises(MalformedRequestError):
        boundary_of("multipart/form-data")
