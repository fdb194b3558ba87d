"""The JSON structure guard: what it refuses, where, and that what it passes parses to
exactly what orjson makes of the whole body, however the body is cut into chunks."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import ClientError, InvalidInputError, PayloadTooLargeError
from gateway.serving.jsonguard import SPLICE_BYTES, JsonBounds, JsonScan, parse_scanned
from gateway.serving.validation import parse_json_object, parse_json_value

WIDE = JsonBounds(max_depth=64, max_tokens=100_000, max_string_bytes=1 << 24, max_bare_bytes=1 << 24)


def scanned(body: bytes, cuts: list[int], bounds: JsonBounds = WIDE) -> Any:
    scan = JsonScan(bounds)
    previous = 0
    for cut in [*sorted({c for c in cuts if 0 < c < len(body)}), len(body)]:
        scan.feed(body[previous:cut])
        previous = cut
    scan.finish()
    return parse_scanned(body, scan.spans, parse_json_object, parse_json_value)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(alphabet=st.sampled_from('ab"\\/\n\u00e9\U0001f600[]{},'), max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(document=st.dictionaries(st.text(max_size=6), json_values, max_size=5), data=st.data())
def test_any_document_cut_anywhere_parses_as_orjson_does(
    document: dict[str, Any], data: st.DataObject
) -> None:
    body = json.dumps(document).encode()
    cuts = data.draw(st.lists(st.integers(0, len(body)), max_size=6))
    assert scanned(body, cuts) == orjson.loads(body)


@pytest.mark.parametrize("escaped", [False, True])
def test_long_strings_are_cut_out_and_put_back(escaped: bool) -> None:
    image = ("AB\\/CD" if escaped else "ABCD") * (SPLICE_BYTES // 2)
    text = "x" * 10
    body = ('{"images": ["' + image + '", "' + image + '"], "t": "' + text + '"}').encode()
    scan = JsonScan(WIDE)
    for offset in range(0, len(body), 7_001):  # chunks that cut strings and escapes
        scan.feed(body[offset : offset + 7_001])
    scan.finish()
    assert len(scan.spans) == 2
    assert all(span.escaped is escaped for span in scan.spans)
    assert parse_scanned(body, scan.spans, parse_json_object, parse_json_value) == json.loads(body)


def test_a_client_string_that_looks_like_a_placeholder_stays_itself() -> None:
    body = ('{"a": "' + "x" * (SPLICE_BYTES + 1) + '", "b": "\\u0000abc:0"}').encode()
    assert scanned(body, [100]) == json.loads(body)


@pytest.mark.parametrize(
    ("body", "error", "words"),
    [
        (b"[" * 2000, InvalidInputError, "nested over"),
        (b"[" + b"[]," * 1000 + b"[]]", PayloadTooLargeError, "values and separators"),
        (b'{"a": "' + b"x" * 5000, PayloadTooLargeError, "a string"),
        (b'{"a": ' + b"1" * 5000, PayloadTooLargeError, "outside its strings"),
        (b'{"a": "' + b"\\\\" * 3000, PayloadTooLargeError, "a string"),
    ],
)
def test_what_no_request_looks_like_is_refused_while_it_arrives(
    body: bytes, error: type[ClientError], words: str
) -> None:
    bounds = JsonBounds(max_depth=4, max_tokens=500, max_string_bytes=4096, max_bare_bytes=4096)
    scan = JsonScan(bounds)

    def feed_all() -> None:
        for offset in range(0, len(body), 512):
            scan.feed(body[offset : offset + 512])

    with pytest.raises(error, match=words):
        feed_all()
    assert scan.size < len(body)  # refused before the end


def test_a_text_key_switches_to_the_text_cap() -> None:
    bounds = JsonBounds(
        max_depth=2, max_tokens=100, max_string_bytes=1 << 20, max_bare_bytes=1 << 20,
        text_keys=frozenset({b"text"}), text_limit=1000,
    )  # fmt: skip
    scan = JsonScan(bounds)
    scan.feed(b'{"text": "hello"')
    with pytest.raises(PayloadTooLargeError, match="text request"):
        scan.feed(b" " * 2000)
    images = JsonScan(bounds)  # the same bytes without the text key pass
    images.feed(b'{"image": "hello"')
    images.feed(b" " * 2000)
