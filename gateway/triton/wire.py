"""ModelInferRequest's ``raw_input_contents`` (field 7) on the wire, both ways, so large
inputs are never copied by protobuf: written after the serialised rest of the message
(gateway.triton.client) and read as views into the received message (the gRPC door); and
ModelInferResponse's ``raw_output_contents`` (field 6), written after the rest of the
door's answer as Triton sent them.

A repeated field may come in any position and protobuf merges the rest, so what is left
once field 7 is taken out parses as the same message without its raw contents
(tests/unit/test_triton_wire.py holds both directions against protobuf's own parser).
"""

from __future__ import annotations

RAW_INPUT_FIELD = 7
RAW_INPUT_TAG = bytes([(RAW_INPUT_FIELD << 3) | 2])
# ModelInferResponse's raw_output_contents, and ModelStreamInferResponse's infer_response
RAW_OUTPUT_TAG = bytes([(6 << 3) | 2])
STREAM_INFER_RESPONSE_TAG = bytes([(2 << 3) | 2])


class WireError(ValueError):
    """The bytes are not a well-formed protobuf message."""


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        if not value:
            out.append(low)
            return bytes(out)
        out.append(low | 0x80)


def append_field(pieces: list[bytes | memoryview], tag: bytes, parts: list[bytes | memoryview]) -> int:
    """Append a length-delimited field ``tag`` holding ``parts`` (joined, not copied
    here) to the message being written as ``pieces``; the field's size."""
    size = sum(map(len, parts))
    pieces.append(tag + varint(size))
    pieces.extend(parts)
    return size


def _read_varint(view: memoryview, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(view) or shift > 63:
            raise WireError("a varint runs past the message")
        byte = view[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7


def split_raw_inputs(message: bytes) -> tuple[bytes, list[memoryview]]:
    """``message`` without its raw input contents (for protobuf to parse; small), and
    those contents in order, as views into ``message`` (no copy)."""
    view = memoryview(message)
    rest: list[memoryview] = []
    raw: list[memoryview] = []
    at = 0
    while at < len(view):
        start = at
        key, at = _read_varint(view, at)
        field, kind = key >> 3, key & 7
        if kind == 0:
            _, at = _read_varint(view, at)
        elif kind == 1:
            at += 8
        elif kind == 5:
            at += 4
        elif kind == 2:
            length, at = _read_varint(view, at)
            if field == RAW_INPUT_FIELD:
                if at + length > len(view):
                    raise WireError("a field runs past the message")
                raw.append(view[at : at + length])
                at += length
                continue
            at += length
        else:  # groups (3, 4) are not in Triton's protocol; 6 and 7 are not wire types
            raise WireError(f"wire type {kind} is not taken")
        if at > len(view) or field == 0:
            raise WireError("a field runs past the message")
        rest.append(view[start:at])
    return b"".join(rest), raw
