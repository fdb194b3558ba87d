"""A BYTES tensor's raw contents: every element back as it was sent, and every damaged or
miscounted buffer refused with TensorDataError (never another exception)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.triton.tensors import TensorDataError, decode_bytes, encode_bytes

elements = st.lists(st.binary(max_size=40), max_size=12)


@settings(max_examples=300, deadline=None)
@given(elements)
def test_what_is_encoded_decodes_as_it_was(items: list[bytes]) -> None:
    raw = encode_bytes(items)
    assert decode_bytes(raw) == items
    assert decode_bytes(raw, len(items)) == items
    assert decode_bytes(memoryview(b"xx" + raw + b"yy")[2:-2], len(items)) == items


@settings(max_examples=300, deadline=None)
@given(elements, st.data())
def test_a_cut_or_miscounted_buffer_is_refused(items: list[bytes], data: st.DataObject) -> None:
    raw = encode_bytes(items)
    cut = data.draw(st.integers(0, max(0, len(raw) - 1))) if raw else 0
    if raw:
        with pytest.raises(TensorDataError):
            decode_bytes(raw[:cut], len(items))
    for count in {len(items) + 1, max(0, len(items) - 1)} - {len(items)}:
        with pytest.raises(TensorDataError, match="exactly the elements its shape says"):
            decode_bytes(raw, count)


def test_the_messages_say_what_is_wrong() -> None:
    with pytest.raises(TensorDataError, match="ends inside an element"):
        decode_bytes(b"\x01\x00", 1)
    with pytest.raises(TensorDataError, match="runs past its data"):
        decode_bytes(b"\x09\x00\x00\x00abc", 1)
    with pytest.raises(TensorDataError, match="runs past its data"):
        decode_bytes(b"\x09\x00\x00\x00abc")
