"""Tensors and their one codec: datatypes, raw little-endian contents, BYTES elements.

Used by both wire formats the gateway speaks, the Open Inference Protocol's binary
extension (``gateway.serving.oip``) and Triton's gRPC ``raw_input_contents`` /
``raw_output_contents`` (``gateway.triton.client``): a BYTES tensor's raw form is each element
as a little-endian uint32 length followed by its bytes; every other datatype is its
elements, row-major, little-endian.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# Datatypes (OIP and Triton names) -> numpy; BYTES are Python bytes in object arrays.
DTYPES: dict[str, Any] = {
    "BOOL": np.bool_,
    "UINT8": np.uint8,
    "UINT16": np.uint16,
    "UINT32": np.uint32,
    "UINT64": np.uint64,
    "INT8": np.int8,
    "INT16": np.int16,
    "INT32": np.int32,
    "INT64": np.int64,
    "FP16": np.float16,
    "FP32": np.float32,
    "FP64": np.float64,
    "BYTES": np.object_,
}


# The wire's little-endian dtypes, made once: on the hot path (every answer's outputs are
# decoded through them) building a dtype per tensor cost a measurable share.
_WIRE: dict[str, np.dtype[Any]] = {
    name: np.dtype(dtype).newbyteorder("<") for name, dtype in DTYPES.items() if name != "BYTES"
}


class TensorDataError(ValueError):
    """Raw tensor contents that do not make the tensor they claim to be."""


@dataclass
class Tensor:
    """A named tensor with its data (BYTES: an object array of ``bytes``). ``wire``: the
    raw contents it was decoded from (:func:`from_raw`), given back as they came by
    :meth:`raw` and :meth:`raw_parts` instead of being encoded again (an answer passed
    through a door unchanged is not re-encoded). A tensor made from another's array is a
    new Tensor without it; nothing changes an array in place."""

    name: str
    datatype: str
    array: np.ndarray[Any, Any]
    wire: bytes | memoryview | None = field(default=None, repr=False, compare=False)

    @property
    def shape(self) -> tuple[int, ...]:
        shape: tuple[int, ...] = self.array.shape  # a tuple of Python ints already
        return shape

    @property
    def nbytes(self) -> int:
        if self.datatype == "BYTES":
            return sum(len(item) for item in self.array.reshape(-1))
        return int(self.array.nbytes)

    def raw_parts(self) -> list[bytes | memoryview]:
        """The tensor's contents on the wire, in pieces that join to :meth:`raw` without
        copying the elements first (a BYTES element is its own bytes object)."""
        if self.wire is not None:
            return [self.wire] if len(self.wire) else []
        if self.datatype == "BYTES":
            parts: list[bytes | memoryview] = []
            for item in self.array.reshape(-1):
                element = as_bytes(item)
                parts.append(len(element).to_bytes(4, "little"))
                parts.append(element)
            return parts
        array = np.ascontiguousarray(self.array, dtype=_WIRE[self.datatype]).reshape(-1)
        return [array.view(np.uint8).data] if array.size else []

    def raw(self) -> bytes:
        """The tensor's contents on the wire."""
        if self.wire is not None:
            return bytes(self.wire)  # the same object when it is bytes
        if self.datatype == "BYTES":
            return encode_bytes([as_bytes(item) for item in self.array.reshape(-1)])
        return np.ascontiguousarray(self.array, dtype=_WIRE[self.datatype]).tobytes()

    def rows(self) -> list[Any]:
        """A [batch, n] tensor as one list per row (BYTES elements as bytes)."""
        if self.datatype == "BYTES" and self.array.ndim != 2:
            return [list(row) for row in self.array]
        return list(self.array.tolist())  # (an object array's rows: lists of its bytes)


def as_bytes(item: Any) -> bytes:
    return item if isinstance(item, bytes) else str(item).encode("utf-8")


def encode_bytes(elements: Sequence[bytes]) -> bytes:
    """A BYTES tensor's raw contents from its elements."""
    return b"".join(len(element).to_bytes(4, "little") + element for element in elements)


def decode_bytes(raw: bytes | memoryview, count: int | None = None) -> list[bytes]:
    """The elements of a BYTES tensor's raw contents; with ``count``, exactly that many and
    nothing left over (TensorDataError otherwise). Each element is copied once, out of
    ``raw`` (a view into a larger message reads no more than its own bytes)."""
    if count is None:
        elements: list[bytes] = []
        at, end = 0, len(raw)
        while at < end:
            at = _element(raw, at, end, elements)
        return elements
    elements = []
    append, from_bytes = elements.append, int.from_bytes
    at, end = 0, len(raw)
    for _ in range(count):  # (every answer's labels: the loop a step shorter than _element)
        if at >= end:
            raise TensorDataError(_NOT_THE_SHAPE)
        head = at + 4
        if head > end:
            raise TensorDataError(_ENDS_INSIDE)
        at = head + from_bytes(raw[at:head], "little")
        if at > end:
            raise TensorDataError(_RUNS_PAST)
        append(bytes(raw[head:at]))
    if at != end:
        raise TensorDataError(_NOT_THE_SHAPE)
    return elements


_ENDS_INSIDE = "the binary BYTES data ends inside an element"
_RUNS_PAST = "a binary BYTES element runs past its data"
_NOT_THE_SHAPE = "the binary data does not hold exactly the elements its shape says"


def _element(raw: bytes | memoryview, at: int, end: int, elements: list[bytes]) -> int:
    """The element at ``at`` appended to ``elements``; where the next one starts."""
    head = at + 4
    if head > end:
        raise TensorDataError(_ENDS_INSIDE)
    at = head + int.from_bytes(raw[at:head], "little")
    if at > end:
        raise TensorDataError(_RUNS_PAST)
    elements.append(bytes(raw[head:at]))
    return at


def from_raw(name: str, datatype: str, raw: bytes | memoryview, shape: Sequence[int]) -> Tensor:
    """A tensor from its raw contents and shape (TensorDataError when they disagree); a
    numeric one is a view of ``raw``, not a copy."""
    dims = tuple(map(int, shape))
    count = math.prod(dims)
    if datatype == "BYTES":
        array = np.array(decode_bytes(raw, count), dtype=np.object_)
    else:
        dtype = _WIRE.get(datatype)
        if dtype is None:
            raise TensorDataError(f"unknown datatype {datatype}")
        if len(raw) != count * dtype.itemsize:
            raise TensorDataError(f"{len(raw)} bytes do not make {count} {datatype} elements")
        array = np.frombuffer(raw, dtype=dtype)
        if not dtype.isnative:  # a big-endian host: to native order
            array = array.astype(dtype.newbyteorder("="))
    return Tensor(name, datatype, array.reshape(dims), raw)


def strings(items: Sequence[Any]) -> list[str]:
    """BYTES elements (or anything) as text, undecodable bytes replaced."""
    return [item.decode("utf-8", "replace") if isinstance(item, bytes) else str(item) for item in items]
