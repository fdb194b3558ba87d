"""The door's answers, serialised by hand (gateway.rpc.service), parse as protobuf's own
messages would: field for field, whatever the outputs' sizes and kinds, and as the
tensors Triton's answers decoded to (their contents given back as they came)."""

from __future__ import annotations

import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from gateway.rpc.service import infer_response, stream_response
from gateway.triton.tensors import Tensor, from_raw


def reference(request_id: str, outputs: list[Tensor]) -> service_pb2.ModelInferResponse:
    response = service_pb2.ModelInferResponse(model_name="m", model_version="3", id=request_id)
    for tensor in outputs:
        entry = response.outputs.add()
        entry.name, entry.datatype = tensor.name, tensor.datatype
        entry.shape.extend(tensor.shape)
        response.raw_output_contents.append(tensor.raw())
    return response


def outputs(size: int) -> list[Tensor]:
    rng = np.random.default_rng(size)
    labels = Tensor("LABELS", "BYTES", np.array([[rng.bytes(size), b"dog"]], dtype=np.object_))
    scores = Tensor("SCORES", "FP32", rng.random((1, max(size // 4, 1)), dtype=np.float32))
    empty = Tensor("NONE", "INT64", np.zeros((0, 2), np.int64))
    # as the backend hands them over: decoded from Triton's raw contents
    decoded = [from_raw(t.name, t.datatype, t.raw(), t.shape) for t in (labels, scores)]
    return [labels, scores, empty, *decoded]


@pytest.mark.parametrize("size", [0, 1, 127, 128, 20_000, 3 * 1024 * 1024])
@pytest.mark.parametrize("request_id", ["", "r-1"])
def test_the_answer_parses_as_protobufs_own(size: int, request_id: str) -> None:
    tensors = outputs(size)
    answer = infer_response("m", "3", request_id, tensors)
    assert service_pb2.ModelInferResponse.FromString(answer) == reference(request_id, tensors)


def test_a_stream_answer_carries_the_answer() -> None:
    tensors = outputs(300)
    streamed = service_pb2.ModelStreamInferResponse.FromString(
        stream_response(infer_response("m", "3", "r-2", tensors))
    )
    assert streamed.error_message == ""
    assert streamed.infer_response == reference("r-2", tensors)
