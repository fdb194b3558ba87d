"""What an ONNX file says about its inputs and outputs: the one place the ``onnx``
package is used (by ``triton-gateway add-model``, never while serving).

``onnx`` is an optional dependency (``pip install 'triton-gateway[models]'``): it is
imported when a file is read, and its absence is a clear error, not an ImportError.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gateway.errors import ConfigurationError


class OnnxFileError(ConfigurationError):
    """The file is not an ONNX model this command can read (the message says why)."""


@dataclass(frozen=True)
class TensorInfo:
    """One graph input or output: its name, element type (ONNX's name, e.g. FLOAT) and
    dims (None where the dim is dynamic or unknown)."""

    name: str
    element_type: str
    dims: tuple[int | None, ...]

    def shape(self) -> str:
        return " x ".join("?" if dim is None else str(dim) for dim in self.dims)


@dataclass(frozen=True)
class OnnxGraph:
    path: Path
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    # The rows of a transformer's embedding tables, where the graph names them as Hugging
    # Face exports do (``...word_embeddings.weight``, ``...position_embeddings.weight``).
    vocabulary_rows: int | None = None
    position_rows: int | None = None


def read_graph(path: Path) -> OnnxGraph:
    """The graph's real inputs (initializers listed as inputs by old exporters left out)
    and outputs, with shapes inferred where the file does not state them. Raises
    OnnxFileError for a file that cannot be read, does not pass ONNX's checker, or keeps
    its weights in external files (the repository gets one self-contained file)."""
    try:
        import onnx
    except ImportError as exc:  # pragma: no cover - the dev and models extras have it
        raise OnnxFileError(
            "reading ONNX files needs the onnx package: pip install 'triton-gateway[models]'"
        ) from exc

    if not path.is_file():
        raise OnnxFileError(f"{path}: no such file")
    try:
        model = onnx.load(str(path), load_external_data=False)
        onnx.checker.check_model(model)
    except Exception as exc:  # onnx raises DecodeError, ValidationError, OSError, ...
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise OnnxFileError(f"{path}: not a valid ONNX model ({reason[:200]})") from exc
    external = [
        tensor.name for tensor in model.graph.initializer if tensor.data_location == onnx.TensorProto.EXTERNAL
    ]
    if external:
        raise OnnxFileError(
            f"{path}: keeps {len(external)} weights in external data files; export it as one "
            "file (torch.onnx.export(..., external_data=False))"
        )
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # inference is a help for outputs without shapes, never required
        inferred = model
    weights = {tensor.name for tensor in model.graph.initializer}

    def info(value: onnx.ValueInfoProto) -> TensorInfo:
        tensor = value.type.tensor_type
        element = onnx.TensorProto.DataType.Name(tensor.elem_type) if tensor.elem_type else "UNDEFINED"
        dims = tuple(
            dim.dim_value if dim.HasField("dim_value") and dim.dim_value > 0 else None
            for dim in tensor.shape.dim
        )
        return TensorInfo(value.name, element, dims)

    def rows(suffix: str) -> int | None:
        found = [t.dims[0] for t in model.graph.initializer if t.name.endswith(suffix) and len(t.dims) == 2]
        return int(found[0]) if len(found) == 1 else None

    return OnnxGraph(
        path=path,
        inputs=tuple(info(v) for v in inferred.graph.input if v.name not in weights),
        outputs=tuple(info(v) for v in inferred.graph.output),
        vocabulary_rows=rows("word_embeddings.weight"),
        position_rows=rows("position_embeddings.weight"),
    )
