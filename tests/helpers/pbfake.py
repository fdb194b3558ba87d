"""A stand-in for Triton's `triton_python_backend_utils`, for unit tests of the Python
backends' own logic (the integration tests run them inside a real Triton). It models
what the CPU stack cannot show: a BLS output left in GPU memory unless the request asks
for CPU memory, as the Python backend does for a TensorRT model on a GPU."""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from helpers.support import load_script

TRITONSERVER_MEMORY_CPU = 0
TRITONSERVER_MEMORY_GPU = 2


class TritonModelException(Exception):  # noqa: N818 (the name pb_utils uses)
    pass


@dataclass
class PreferredMemory:
    preferred_memory_type: int
    preferred_device_id: int = 0


@dataclass
class Tensor:
    name: str
    data: np.ndarray
    on_gpu: bool = False

    def as_numpy(self) -> np.ndarray:
        if self.on_gpu:
            raise TritonModelException("Tensor is stored in GPU and cannot be converted to NumPy.")
        return self.data


@dataclass
class TritonError:
    message_text: str
    code: int = 0
    INVALID_ARG = 3

    def message(self) -> str:
        return self.message_text


@dataclass
class InferenceResponse:
    output_tensors: list[Tensor]
    error: TritonError | None = None

    def has_error(self) -> bool:
        return self.error is not None


@dataclass
class InferenceRequest:
    """A BLS request; ``exec`` asks the fake server's model function for the outputs."""

    model_name: str
    inputs: list[Tensor]
    requested_output_names: list[str]
    preferred_memory: PreferredMemory | None = None

    def exec(self) -> InferenceResponse:
        outputs = SERVER[self.model_name](self.inputs)
        wants_cpu = (
            self.preferred_memory is not None
            and self.preferred_memory.preferred_memory_type == TRITONSERVER_MEMORY_CPU
        )
        for tensor in outputs:
            tensor.on_gpu = GPU_OUTPUTS and not wants_cpu
        return InferenceResponse(outputs)


# The models a BLS call can reach, and whether their outputs stay on the GPU by default.
SERVER: dict[str, Callable[[list[Tensor]], list[Tensor]]] = {}
GPU_OUTPUTS = False


def get_input_tensor_by_name(request: Any, name: str) -> Tensor | None:
    return next((t for t in request.inputs if t.name == name), None)


def get_output_tensor_by_name(response: InferenceResponse, name: str) -> Tensor | None:
    return next((t for t in response.output_tensors if t.name == name), None)


def get_output_config_by_name(config: dict[str, Any], name: str) -> dict[str, Any]:
    return next(o for o in config["output"] if o["name"] == name)


def get_input_config_by_name(config: dict[str, Any], name: str) -> dict[str, Any]:
    return next(i for i in config["input"] if i["name"] == name)


def load_model(model_py: Path) -> types.ModuleType:
    """Import a model.py against this module as `triton_python_backend_utils`."""
    sys.modules["triton_python_backend_utils"] = sys.modules[__name__]
    module: types.ModuleType = load_script(model_py, f"model_{model_py.parent.parent.name}")
    return module
