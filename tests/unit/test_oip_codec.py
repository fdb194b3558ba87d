"""The OIP codec (gateway/serving/oip.py): binary and JSON tensors in and out, and a fuzzer that
throws arbitrary JSON headers and binary tails at the parser: only ClientErrors come out."""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.errors import ClientError, PayloadTooLargeError
from gateway.http.bodies import byte_count
from gateway.serving.oip import Caps, encode_infer_response, parse_infer_request
from gateway.triton.backend import ModelSignature, TensorSpec
from gateway.triton.tensors import Tensor

SIGNATURE = ModelSignature(
    name="m",
    versions=("1",),
    platform="ensemble",
    inputs=(
        TensorSpec("TEXT", "BYTES", (-1, 1)),
        TensorSpec("TOP_K", "INT32", (-1, 1)),
        TensorSpec("W", "FP32", (-1, 2)),
    ),
    outputs=(TensorSpec("LABELS", "BYTES", (-1, -1)), TensorSpec("SCORES", "FP32", (-1, -1))),
)
CAPS = Caps(max_tensor_bytes=1 << 20, max_request_bytes=1 << 21, max_batch=8, max_strings=64)


def keep(tensor: Tensor) -> Tensor:
    return tensor


def test_binary_and_json_inputs_decode_to_the_same_tensors() -> None:
    weights = np.array([[0.5, -1.25]], dtype=np.float32)
    header = {
        "inputs": [
            {"name": "TEXT", "shape": [1, 1], "datatype": "BYTES", "parameters": {"binary_data_size": 9}},
            {"name": "TOP_K", "shape": [1, 1], "datatype": "INT32", "data": [[3]]},
            {"name": "W", "shape": [1, 2], "datatype": "FP32", "parameters": {"binary_data_size": 8}},
        ],
        "outputs": [{"name": "SCORES", "parameters": {"binary_data": True}}, {"name": "LABELS"}],
        "id": "r1",
    }
    binary = struct.pack("<I", 5) + b"hello" + weights.astype("<f4").tobytes()
    parsed = parse_infer_request(header, binary, SIGNATURE, CAPS, keep)
    by_name = {t.name: t for t in parsed.inputs}
    assert by_name["TEXT"].array.tolist() == [[b"hello"]]
    assert by_name["TOP_K"].array.dtype == np.int32
    assert by_name["TOP_K"].array.tolist() == [[3]]
    assert np.array_equal(by_name["W"].array, weights)
    assert parsed.outputs == ["SCORES", "LABELS"]
    assert parsed.binary_outputs == {"SCORES"}
    assert parsed.id == "r1"


def test_responses_encode_binary_where_asked_and_decode_back() -> None:
    labels = Tensor("LABELS", "BYTES", np.array([[b"cat", b"dog"]], dtype=np.object_))
    scores = Tensor("SCORES", "FP32", np.array([[0.75, 0.25]], dtype=np.float32))
    body, header_length = encode_infer_response("m", "1", None, [labels, scores], {"SCORES"})
    assert header_length is not None
    document = json.loads(body[:header_length])
    assert document["outputs"][0]["data"] == ["cat", "dog"]
    assert document["outputs"][1]["parameters"] == {"binary_data_size": 8}
    assert np.frombuffer(body[header_length:], dtype="<f4").tolist() == [0.75, 0.25]
    plain, none = encode_infer_response("m", "1", "x", [scores], set())
    assert none is None
    assert json.loads(plain)["outputs"][0]["data"] == [0.75, 0.25]


@pytest.mark.parametrize(
    "header_length",
    # \xb2 (superscript two) and a fullwidth one pass str.isdigit() and then fail int()
    ["-1", "abc", "", "1e3", "\xb2", "\uff11", "12345678901234567890"],
)
def test_a_bad_header_length_is_a_client_error(header_length: str) -> None:
    with pytest.raises(ClientError):
        byte_count(header_length, "Inference-Header-Content-Length")


def test_a_byte_count_is_ascii_digits() -> None:
    assert byte_count(" 100 ", "Content-Length") == 100
    assert byte_count(None, "Content-Length") is None


def test_a_bytes_input_is_refused_by_its_shape_before_its_elements_are_decoded() -> None:
    # 1.5 million declared strings, but no bytes for them: the shape alone refuses it
    header = {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1, 1_500_000],
                          "parameters": {"binary_data_size": 4}}]}  # fmt: skip
    wide = ModelSignature(
        "m", ("1",), "ensemble", (TensorSpec("TEXT", "BYTES", (-1, -1)),), SIGNATURE.outputs
    )
    with pytest.raises(PayloadTooLargeError, match="1500000 strings"):
        parse_infer_request(header, b"\x00" * 4, wide, CAPS, keep)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**40), 2**40)
    | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)
tensor_entries = st.fixed_dictionaries(
    {
        "name": st.sampled_from(["TEXT", "TOP_K", "W", "nope"]),
        "datatype": st.sampled_from(["BYTES", "INT32", "FP32", "INT64", "BOOL"]),
        "shape": st.lists(st.integers(-2, 3), max_size=3),
    },
    optional={
        "data": json_values,
        "parameters": st.fixed_dictionaries({"binary_data_size": st.integers(-2, 40)}),
    },
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    inputs=st.lists(tensor_entries, max_size=4) | json_values,
    outputs=st.none()
    | st.lists(st.dictionaries(st.sampled_from(["name", "parameters"]), json_values), max_size=3),
    binary=st.binary(max_size=48),
)
def test_the_parser_refuses_anything_malformed_with_a_client_error(
    inputs: Any, outputs: Any, binary: bytes
) -> None:
    header: dict[str, Any] = {"inputs": inputs}
    if outputs is not None:
        header["outputs"] = outputs
    try:
        parsed = parse_infer_request(header, binary, SIGNATURE, CAPS, keep)
    except ClientError:
        return
    # accepted: then it is exactly what the signature allows
    assert {t.name for t in parsed.inputs} == {"TEXT", "TOP_K", "W"}
    for tensor in parsed.inputs:
        spec = {s.name: s for s in SIGNATURE.inputs}[tensor.name]
        assert tensor.datatype == spec.datatype
        assert len(tensor.shape) == len(spec.shape)
