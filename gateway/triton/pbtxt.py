"""Triton's ``config.pbtxt`` files as messages: the one place the gateway reads or writes
the protobuf text format of Triton's ModelConfig (the schema tritonclient ships).

Used by ``triton-gateway add-model`` (never while serving): it reads the shipped configs,
changes what differs for the new model and writes them back, so every field the shipped
models set (queue policies, instance groups, caches) is carried over, not retyped.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from google.protobuf import text_format
from google.protobuf.message import Message
from tritonclient.grpc import model_config_pb2

from gateway.errors import ConfigurationError


class ConfigFileError(ConfigurationError):
    """A config.pbtxt that is not a Triton model configuration."""


def read_config(path: Path) -> Any:
    """The ModelConfig message of ``path``."""
    try:
        return text_format.Parse(path.read_text(encoding="utf-8"), model_config_pb2.ModelConfig())
    except (OSError, UnicodeDecodeError, text_format.ParseError) as exc:
        raise ConfigFileError(f"{path}: not a Triton model configuration ({exc})") from exc


def render(config: Message, header: str) -> str:
    """``config`` as config.pbtxt text, after a comment ``header`` (one line or more)."""
    comment = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines())
    return comment + text_format.MessageToString(config)


def set_parameter(config: Any, key: str, value: str) -> None:
    config.parameters[key].string_value = value


def parameters(config: Any) -> dict[str, str]:
    return {key: parameter.string_value for key, parameter in config.parameters.items()}


def set_tensor(tensors: Any, old: str, name: str, dims: list[int]) -> None:
    """Rename tensor ``old`` of an input or output list and set its dims."""
    (tensor,) = [t for t in tensors if t.name == old]
    tensor.name = name
    del tensor.dims[:]
    tensor.dims.extend(dims)


def data_type(name: str) -> int:
    """The enum value of a Triton data type name (``TYPE_INT64``)."""
    return int(model_config_pb2.DataType.Value(name))


def add_tensor(tensors: Any, name: str, type_name: str, dims: list[int]) -> None:
    """Append an input or output ``name`` of ``type_name`` (``TYPE_FP32``) and ``dims``."""
    tensor = tensors.add()
    tensor.name = name
    tensor.data_type = data_type(type_name)
    tensor.dims.extend(dims)


def remove_tensor(tensors: Any, name: str) -> None:
    """Remove input or output ``name`` from the list, if it is there."""
    kept = [t for t in tensors if t.name != name]
    if len(kept) != len(tensors):
        copies = [type(t)() for t in kept]
        for copy, tensor in zip(copies, kept, strict=True):
            copy.CopyFrom(tensor)
        del tensors[:]
        tensors.extend(copies)
