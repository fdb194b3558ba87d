"""The inference request the gateway serialises itself parses, field for field, as the
message protobuf would have built (what Triton reads)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2

from gateway.triton.client import infer_request_bytes
from gateway.triton.tensors import Tensor, from_raw
from gateway.triton.wire import WireError, split_raw_inputs


def reference(inputs: list[Tensor], outputs: list[str], priority: int) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name="m", model_version="2", id="r-1")
    if priority:
        request.parameters["priority"].uint64_param = priority
    for tensor in inputs:
        entry = request.inputs.add()
        entry.name, entry.datatype = tensor.name, tensor.datatype
        entry.shape.extend(tensor.shape)
        request.raw_input_contents.append(tensor.raw())
    for name in outputs:
        request.outputs.add().name = name
    return request


@pytest.mark.parametrize("priority", [0, 1])
@pytest.mark.parametrize("image_bytes", [0, 5, 127, 128, 300, 70_000, 3 * 1024 * 1024])
def test_the_wire_request_parses_as_protobufs_own(priority: int, image_bytes: int) -> None:
    rng = np.random.default_rng(image_bytes)
    images = [rng.bytes(image_bytes + i) for i in range(3)]
    inputs = [
        Tensor("IMAGE", "BYTES", np.array([[image] for image in images], dtype=np.object_)),
        Tensor("TOP_K", "INT32", np.full((3, 1), 5, dtype=np.int32)),
        Tensor("SCALE", "FP32", np.arange(6, dtype=np.float32).reshape(3, 2)),
    ]
    wire, nbytes = infer_request_bytes("m", "2", inputs, "r-1", ["LABELS", "SCORES"], priority)
    parsed = service_pb2.ModelInferRequest.FromString(wire)
    expected = reference(inputs, ["LABELS", "SCORES"], priority)
    assert parsed == expected
    assert nbytes == sum(len(t.raw()) for t in inputs)


@pytest.mark.parametrize(
    ("datatype", "array"),
    [
        ("FP32", np.float32(3.0)),
        ("INT64", np.zeros((0, 3), np.int64)),
        ("BOOL", np.array([[True, False]])),
        ("FP16", np.ones((2, 2), np.float16)),
        ("INT32", np.arange(6, dtype=">i4").reshape(2, 3)),  # big-endian in, little-endian out
        ("FP32", np.ones((4, 4), np.float32)[:, ::2]),  # not contiguous
        ("BYTES", np.array([[b""], [b"x"]], dtype=np.object_)),
    ],
)
def test_raw_parts_join_to_the_raw_contents(datatype: str, array: np.ndarray) -> None:
    tensor = Tensor("X", datatype, np.asarray(array))
    assert b"".join(tensor.raw_parts()) == tensor.raw()


@pytest.mark.parametrize(
    ("datatype", "array"),
    [
        ("FP32", np.arange(6, dtype=np.float32).reshape(2, 3)),
        ("BYTES", np.array([[b"cat", b""], [b"dog", b"\xff"]], dtype=np.object_)),
        ("INT64", np.zeros((0, 3), np.int64)),
    ],
)
def test_a_decoded_tensor_gives_back_the_contents_it_came_in(datatype: str, array: np.ndarray) -> None:
    """An answer passed through unchanged is not encoded again; one made from it is."""
    contents = Tensor("X", datatype, array).raw()
    decoded = from_raw("X", datatype, contents, array.shape)
    assert decoded.raw() is contents
    assert b"".join(decoded.raw_parts()) == contents
    assert decoded.shape == array.shape
    assert all(isinstance(d, int) for d in decoded.shape)
    first = Tensor("X", datatype, decoded.array[:1])  # e.g. TOP_K's rows: encoded anew
    assert first.raw() == Tensor("X", datatype, array[:1]).raw()


@pytest.mark.parametrize("image_bytes", [0, 5, 127, 128, 300, 70_000])
def test_a_received_request_splits_into_protobufs_message_and_its_raw_contents(image_bytes: int) -> None:
    """The gRPC door reads raw contents as views: the rest parses as the message without
    them, and the views are the contents, in order, wherever field 7 stood."""
    rng = np.random.default_rng(image_bytes)
    inputs = [
        Tensor("IMAGE", "BYTES", np.array([[rng.bytes(image_bytes)]], dtype=np.object_)),
        Tensor("TOP_K", "INT32", np.full((1, 1), 5, dtype=np.int32)),
    ]
    expected = reference(inputs, ["LABELS"], priority=3)
    for wire in (
        expected.SerializeToString(),
        infer_request_bytes("m", "2", inputs, "r-1", ["LABELS"], 3)[0],
    ):
        rest, raw = split_raw_inputs(wire)
        parsed = service_pb2.ModelInferRequest.FromString(rest)
        assert [bytes(view) for view in raw] == [t.raw() for t in inputs]
        parsed.raw_input_contents.extend(bytes(view) for view in raw)
        assert parsed == expected


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=64))
def test_any_bytes_split_or_are_refused_as_malformed(data: bytes) -> None:
    try:
        rest, raw = split_raw_inputs(data)
    except WireError:
        return
    assert len(rest) + sum(len(view) for view in raw) <= len(data)
