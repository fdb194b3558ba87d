"""Triton Python model: the CPU twin of a TensorRT plan, run by ONNX Runtime.

Selected by configs/cpu.pbtxt; serves image_model and (through a symlink) text_model.
Inputs and outputs are named by the model config, so the same file serves any ONNX model
whose graph uses those names. All requests of a batch run in one ONNX Runtime call:
inputs with a variable axis (token sequences) are right-padded with zeros to the longest
request first, which an attention mask makes inert.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils


def _concatenate(arrays: list[np.ndarray]) -> np.ndarray:
    widest = np.max([a.shape for a in arrays], axis=0)
    padded = [
        np.pad(a, [(0, 0)] + [(0, int(w) - s) for w, s in zip(widest[1:], a.shape[1:], strict=True)])
        for a in arrays
    ]
    return np.concatenate(padded)


class TritonPythonModel:
    def initialize(self, args: dict[str, Any]) -> None:
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        path = Path(args["model_repository"]) / args["model_version"] / params["onnx_file"]
        options = ort.SessionOptions()
        options.intra_op_num_threads = int(params.get("intra_op_threads", "0"))
        # ONNX Runtime's pool threads spin between runs by default, taking the cores that
        # Triton, the other models' stubs and the gateway share. "1": spin (a host whose
        # cores are this model's alone).
        options.add_session_config_entry(
            "session.intra_op.allow_spinning", params.get("intra_op_spinning", "0")
        )
        self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        self.inputs = [item["name"] for item in config["input"]]
        self.outputs = [item["name"] for item in config["output"]]

    def execute(self, requests: list[Any]) -> list[Any]:
        arrays = {
            name: [pb_utils.get_input_tensor_by_name(r, name).as_numpy() for r in requests]
            for name in self.inputs
        }
        feeds = {name: _concatenate(parts) for name, parts in arrays.items()}
        sizes = [part.shape[0] for part in arrays[self.inputs[0]]]
        results = self.session.run(self.outputs, feeds)
        responses = []
        start = 0
        for size in sizes:
            tensors = [
                pb_utils.Tensor(name, np.ascontiguousarray(result[start : start + size]))
                for name, result in zip(self.outputs, results, strict=True)
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
            start += size
        return responses
