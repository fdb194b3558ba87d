"""The benchmark's second yardstick: a KServe custom transformer in front of the same Triton,
in KServe's documented form (a ``kserve.Model`` whose ``preprocess`` turns the request into
an ``InferRequest``, the inherited ``predict`` sending it to the predictor over gRPC v2, and
``postprocess`` shaping the answer), served by KServe's own ``ModelServer`` (one worker,
its default event loop and access log). Run in a virtual environment of its own
(``gateway/bench/side_by_side.py`` makes it: ``kserve==0.21.0``), never with the gateway.

    <kserve venv>/bin/python gateway/bench/kserve_transformer.py --model_name classify \\
        --predictor_host 127.0.0.1:8001 --predictor_protocol grpc-v2 --http_port 8095

It takes what the gateway's ``/classify`` takes, at ``POST /v1/models/classify:predict``:
JSON ``{"text": ...}`` or ``{"image": <base64>}``, a raw image body, or multipart ``file``
parts, with the same checks as the reference gateway (none), so the figure is the cost of
KServe's serving layer and a transformer's usual code.
"""

from __future__ import annotations

import argparse
import base64
from typing import Any

import numpy as np
from kserve import InferInput, InferRequest, InferResponse, Model, ModelServer, model_server
from python_multipart.multipart import MultipartParser, parse_options_header

TOP_K = np.array([[5]], dtype=np.int32)


def _bytes_input(name: str, items: list[bytes]) -> InferInput:
    tensor = InferInput(name, [len(items), 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[item] for item in items], dtype=np.object_), binary_data=True)
    return tensor


def _top_k(rows: int) -> InferInput:
    tensor = InferInput("TOP_K", [rows, 1], "INT32")
    tensor.set_data_from_numpy(np.repeat(TOP_K, rows, axis=0), binary_data=True)
    return tensor


def _multipart_files(body: bytes, content_type: str) -> list[bytes]:
    """The ``file`` parts of a multipart body, with python-multipart's streaming parser."""
    _, options = parse_options_header(content_type)
    files: list[bytes] = []
    current: list[bytes] = []

    def on_part_begin() -> None:
        current.clear()

    def on_part_data(data: bytes, start: int, end: int) -> None:
        current.append(data[start:end])

    def on_part_end() -> None:
        files.append(b"".join(current))

    parser = MultipartParser(
        options[b"boundary"],
        {"on_part_begin": on_part_begin, "on_part_data": on_part_data, "on_part_end": on_part_end},
    )
    parser.write(body)
    parser.finalize()
    return files


class ClassifyTransformer(Model):  # type: ignore[misc]
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.ready = True

    def preprocess(self, payload: Any, headers: dict[str, str] | None = None) -> InferRequest:
        if isinstance(payload, dict):
            if "text" in payload:
                texts = [str(payload["text"]).encode()]
                return InferRequest("text_classifier", [_bytes_input("TEXT", texts), _top_k(1)])
            images = [base64.b64decode(payload["image"])]
        else:
            content_type = (headers or {}).get("content-type", "")
            images = (
                _multipart_files(payload, content_type)
                if content_type.startswith("multipart/form-data")
                else [payload]
            )
        return InferRequest("image_classifier", [_bytes_input("IMAGE", images), _top_k(len(images))])

    def postprocess(self, result: Any, headers: dict[str, str] | None = None) -> dict[str, Any]:
        response: InferResponse = result
        outputs = {output.name: output.as_numpy() for output in response.outputs}
        rows = zip(outputs["LABELS"], outputs["SCORES"], outputs["CLASS_IDS"], strict=True)
        return {
            "results": [
                [
                    {"label": label.decode(), "score": float(score), "class_id": int(i)}
                    for label, score, i in zip(*row, strict=True)
                ]
                for row in rows
            ]
        }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(parents=[model_server.parser])
    options = parser.parse_args()
    ModelServer(workers=1, enable_grpc=False).start([ClassifyTransformer(options.model_name)])
