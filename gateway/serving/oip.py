"""The Open Inference Protocol (KServe v2): request parsing, checks against a model's
signature, what one request may hold, and response encoding (JSON and the binary tensor
extension).

Pure functions on bytes and numpy arrays, no I/O, shared by both doors: the HTTP routes
(``gateway.http.routes.oip``) and the gRPC service (``gateway.grpcfront``), which hands its
requests over in the same form (a JSON-shaped header and the binary tensors). Every refusal
is a :class:`gateway.errors.ClientError`.

Binary tensor extension (what ``tritonclient.http`` sends by default): the body is a JSON
header of ``Inference-Header-Content-Length`` bytes followed by the raw tensors of the
inputs whose ``parameters.binary_data_size`` says how many bytes are theirs, in input
order. A BYTES tensor in binary is each element as a little-endian uint32 length and
its bytes. Outputs are binary when the request asks (``parameters.binary_data_output``
or an output's ``parameters.binary_data``); the answer then has the same layout.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from gateway.errors import InvalidInputError, MalformedRequestError, PayloadTooLargeError
from gateway.serving.catalog import CatalogEntry
from gateway.serving.jsonguard import JsonBounds
from gateway.settings import Settings
from gateway.triton.backend import ModelSignature, TensorSpec
from gateway.triton.tensors import DTYPES, Tensor, TensorDataError, from_raw, strings

HEADER_LENGTH = "Inference-Header-Content-Length"

# Parameters of the protocol and its extensions: the ones the gateway honours, and why it
# refuses the others (a parameter is never dropped in silence). docs/how-to/v2.md lists them.
_STATELESS = "the sequence extension is not served: the gateway's models are stateless classifiers"
_SHARED_MEMORY = "shared memory is not served: it is Triton's host's memory; send the tensor in the body"
REQUEST_PARAMETERS = frozenset({"binary_data_output"})
INPUT_PARAMETERS = frozenset({"binary_data_size"})
OUTPUT_PARAMETERS = frozenset({"binary_data", "classification"})
# Triton's classification extension: at most this many classes an output.
MAX_CLASSES = 1000
REFUSED_PARAMETERS = {
    "sequence_id": _STATELESS,
    "sequence_start": _STATELESS,
    "sequence_end": _STATELESS,
    "priority": "request priorities are not passed on to Triton",
    "timeout": "the gateway owns the deadline (GATEWAY_TRITON__TIMEOUT_SECONDS)",
    "shared_memory_region": _SHARED_MEMORY,
    "shared_memory_byte_size": _SHARED_MEMORY,
    "shared_memory_offset": _SHARED_MEMORY,
}


def check_parameters(parameters: Any, honoured: frozenset[str], where: str) -> dict[str, Any]:
    """``parameters`` (an object) when every key is one the gateway honours here; else a
    400 that names the parameter and says why it is not passed on."""
    if parameters is None:
        return {}
    if not isinstance(parameters, dict):
        raise InvalidInputError(f"{where}'parameters' must be an object")
    for key in parameters:
        if key in honoured:
            continue
        reason = REFUSED_PARAMETERS.get(key)
        if reason is not None:
            raise MalformedRequestError(f"{where}parameter {key!r} is refused: {reason}")
        # the key is the client's input: named only when it is short and plain
        shown = (
            repr(key)
            if isinstance(key, str) and len(key) <= 40 and key.replace("_", "").isalnum()
            else "a parameter"
        )
        raise MalformedRequestError(
            f"{where}{shown} is not a parameter the gateway passes on; it passes none"
        )
    return parameters


MAX_TENSORS = 64  # inputs or outputs named in one request
MAX_DIMS = 8


@dataclass
class InferRequest:
    """A parsed, checked inference request."""

    id: str | None
    inputs: list[Tensor]
    outputs: list[str]  # requested outputs; empty: all of the model's
    binary_outputs: set[str] = field(default_factory=set)
    classes: dict[str, int] = field(default_factory=dict)  # the classification extension's


@dataclass(frozen=True)
class Caps:
    """What one request may hold."""

    max_tensor_bytes: int
    max_request_bytes: int
    max_batch: int  # first dimension of a batched input
    max_strings: int  # elements of one BYTES input, checked from its shape before decoding


# A decoded BYTES input -> the tensor to send (say, texts normalised); raises ClientError.
BytesCheck = Callable[[Tensor], Tensor]


def _integer(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidInputError(f"{what} must be an integer")
    return value


def oip_bounds(settings: Settings) -> JsonBounds:
    """What a /v2 JSON body (or the JSON header of a binary one) can hold: tensors nested
    as deep as their shape, at most ``server.max_json_values`` values, strings no longer
    than the largest text or base64 image the gateway takes."""
    values = settings.server.max_json_values
    return JsonBounds(
        max_depth=MAX_DIMS + 4,
        max_tokens=2 * values + 4096,
        max_string_bytes=max(2 * (-(-settings.image.max_bytes * 4 // 3)), settings.max_text_body_bytes),
        max_bare_bytes=32 * values + 64 * 1024,
    )


def _flatten(data: Any, depth: int = 0) -> list[Any]:
    """Row-major elements of a JSON tensor ("data" may be flat or nested)."""
    if not isinstance(data, list):
        return [data]
    if depth > MAX_DIMS:
        raise InvalidInputError("the tensor data is nested deeper than its shape can be")
    out: list[Any] = []
    for item in data:
        out.extend(_flatten(item, depth + 1) if isinstance(item, list) else [item])
    return out


def _from_json(spec_name: str, datatype: str, elements: list[Any]) -> np.ndarray[Any, Any]:
    where = f"input {spec_name!r}"
    if datatype == "BYTES":
        if not all(isinstance(e, str) for e in elements):
            raise InvalidInputError(f"{where}: BYTES data in JSON must be strings")
        return np.array([e.encode("utf-8", "surrogatepass") for e in elements], dtype=np.object_)
    if datatype == "BOOL":
        if not all(isinstance(e, bool) for e in elements):
            raise InvalidInputError(f"{where}: BOOL data must be true or false")
        return np.array(elements, dtype=np.bool_)
    floating = datatype.startswith("FP")
    for e in elements:
        if isinstance(e, bool) or not isinstance(e, int | float) or (not floating and isinstance(e, float)):
            raise InvalidInputError(
                f"{where}: {datatype} data must be {'numbers' if floating else 'integers'}"
            )
        if floating and not math.isfinite(e):
            raise InvalidInputError(f"{where}: {datatype} data must be finite")
    dtype = np.dtype(DTYPES[datatype])
    if not floating:
        info = np.iinfo(dtype)
        if elements and (min(elements) < info.min or max(elements) > info.max):
            raise InvalidInputError(f"{where}: a value is out of the {datatype} range")
    return np.array(elements, dtype=dtype)


def _from_binary(
    spec_name: str, datatype: str, raw: bytes | memoryview, shape: list[int]
) -> np.ndarray[Any, Any]:
    where = f"input {spec_name!r}"
    try:
        array = from_raw(spec_name, datatype, raw, shape).array
    except TensorDataError as exc:
        raise InvalidInputError(f"{where}: {exc}") from None
    if datatype.startswith("FP") and not np.isfinite(array).all():
        raise InvalidInputError(f"{where}: {datatype} data must be finite")
    return array


def _check_shape(spec: TensorSpec, shape: list[int], caps: Caps) -> None:
    where = f"input {spec.name!r}"
    if len(shape) != len(spec.shape):
        raise InvalidInputError(
            f"{where}: shape has {len(shape)} dimensions; the model expects {len(spec.shape)}"
        )
    for index, (got, want) in enumerate(zip(shape, spec.shape, strict=True)):
        if got < 0 or (want >= 0 and got != want):
            raise InvalidInputError(f"{where}: dimension {index} is {got}; the model expects {want}")
    if spec.shape and spec.shape[0] == -1 and shape[0] > caps.max_batch:
        raise PayloadTooLargeError(f"{where}: a batch of {shape[0]}; the limit is {caps.max_batch}")
    if 0 in shape:
        raise InvalidInputError(f"{where}: the tensor is empty")


def parse_infer_request(
    header: dict[str, Any],
    binary: bytes | memoryview,
    signature: ModelSignature,
    caps: Caps,
    check_bytes: BytesCheck,
) -> InferRequest:
    """Check a request's tensors against the model's signature, decode them, and run
    ``check_bytes`` on every BYTES input (the gateway's own input checks)."""
    specs = {spec.name: spec for spec in signature.inputs}
    raw_inputs = header.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise InvalidInputError("'inputs' must be a non-empty list of tensors")
    if len(raw_inputs) > MAX_TENSORS:
        raise PayloadTooLargeError(f"over {MAX_TENSORS} inputs")
    inputs: list[Tensor] = []
    offset = 0
    total = 0
    for item in raw_inputs:
        if not isinstance(item, dict):
            raise InvalidInputError("each input must be an object")
        name = item.get("name")
        if not isinstance(name, str) or name not in specs:
            raise InvalidInputError(
                f"unknown input; the model's inputs are {sorted(specs)}"
            )  # never echo the client's name
        if any(t.name == name for t in inputs):
            raise InvalidInputError(f"input {name!r} is given twice")
        spec = specs[name]
        if item.get("datatype") != spec.datatype:
            raise InvalidInputError(f"input {name!r}: datatype must be {spec.datatype}")
        shape = item.get("shape")
        if not isinstance(shape, list) or len(shape) > MAX_DIMS:
            raise InvalidInputError(f"input {name!r}: 'shape' must be a list of at most {MAX_DIMS} integers")
        shape = [_integer(d, f"input {name!r}: a dimension") for d in shape]
        _check_shape(spec, shape, caps)
        count = math.prod(shape)
        if spec.datatype == "BYTES" and count > caps.max_strings:
            raise PayloadTooLargeError(
                f"input {name!r}: shape {shape} holds {count} strings; the limit is {caps.max_strings}"
            )
        parameters = check_parameters(item.get("parameters"), INPUT_PARAMETERS, f"input {name!r}: ")
        if "binary_data_size" in parameters:
            size = _integer(parameters["binary_data_size"], f"input {name!r}: binary_data_size")
            if size < 0 or offset + size > len(binary):
                raise InvalidInputError(f"input {name!r}: binary_data_size runs past the body")
            if size > caps.max_tensor_bytes:
                raise PayloadTooLargeError(
                    f"input {name!r} is {size} bytes; the limit is {caps.max_tensor_bytes}"
                )
            # a view: slicing the bytes would copy the tensor once more
            array = _from_binary(name, spec.datatype, memoryview(binary)[offset : offset + size], shape)
            offset += size
        else:
            if "data" not in item:
                raise InvalidInputError(f"input {name!r} has no 'data' (nor binary_data_size)")
            elements = _flatten(item["data"])
            if len(elements) != count:
                raise InvalidInputError(f"input {name!r}: {len(elements)} elements for shape {shape}")
            array = _from_json(name, spec.datatype, elements)
        tensor = Tensor(name, spec.datatype, array.reshape(shape))
        if tensor.nbytes > caps.max_tensor_bytes:
            raise PayloadTooLargeError(
                f"input {name!r} is {tensor.nbytes} bytes; the limit is {caps.max_tensor_bytes}"
            )
        total += tensor.nbytes
        if total > caps.max_request_bytes:
            raise PayloadTooLargeError(f"the inputs exceed {caps.max_request_bytes} bytes")
        inputs.append(tensor)
    if offset != len(binary):
        raise InvalidInputError("the body holds binary data no input claims")
    missing = sorted(n for n, spec in specs.items() if not spec.optional and all(t.name != n for t in inputs))
    if missing:
        raise InvalidInputError(f"missing inputs: {missing}")
    # the structure holds: now the content of BYTES inputs
    inputs = [check_bytes(tensor) if tensor.datatype == "BYTES" else tensor for tensor in inputs]
    outputs, binary_outputs, classes = _requested_outputs(header, signature)
    request_id = header.get("id")
    if request_id is not None and (not isinstance(request_id, str) or len(request_id) > 128):
        raise InvalidInputError("'id' must be a string of at most 128 characters")
    return InferRequest(request_id, inputs, outputs, binary_outputs, classes)


def _requested_outputs(
    header: dict[str, Any], signature: ModelSignature
) -> tuple[list[str], set[str], dict[str, int]]:
    """The outputs asked for (none: all), those answered binary, and the classes asked
    of each (Triton's classification extension: Triton computes them)."""
    known = [spec.name for spec in signature.outputs]
    parameters = check_parameters(header.get("parameters"), REQUEST_PARAMETERS, "")
    all_binary = parameters.get("binary_data_output") is True
    raw = header.get("outputs")
    if raw is None:
        return [], set(known) if all_binary else set(), {}
    if not isinstance(raw, list) or len(raw) > MAX_TENSORS:
        raise InvalidInputError(f"'outputs' must be a list of at most {MAX_TENSORS} objects")
    names: list[str] = []
    binary: set[str] = set()
    classes: dict[str, int] = {}
    for item in raw:
        if not isinstance(item, dict) or item.get("name") not in known:
            raise InvalidInputError(f"unknown output; the model's outputs are {known}")
        name = str(item["name"])
        names.append(name)
        options = check_parameters(item.get("parameters"), OUTPUT_PARAMETERS, f"output {name!r}: ")
        if options.get("binary_data", all_binary) is True:
            binary.add(name)
        if "classification" in options:
            count = options["classification"]
            if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_CLASSES:
                raise InvalidInputError(f"output {name!r}: classification must be 1 to {MAX_CLASSES} classes")
            classes[name] = count
    return names, binary, classes


def _json_data(tensor: Tensor) -> list[Any]:
    flat = tensor.array.reshape(-1)
    if tensor.datatype == "BYTES":
        return strings(list(flat))
    return list(flat.tolist())


def encode_infer_response(
    model: str, version: str, request_id: str | None, outputs: Sequence[Tensor], binary: set[str]
) -> tuple[bytes, int | None]:
    """The answer's body and, when any output is binary, its JSON header's length."""
    document: dict[str, Any] = {"model_name": model, "model_version": version, "outputs": []}
    if request_id is not None:
        document["id"] = request_id
    tail: list[bytes] = []
    for tensor in outputs:
        entry: dict[str, Any] = {
            "name": tensor.name,
            "datatype": tensor.datatype,
            "shape": list(tensor.shape),
        }
        if tensor.name in binary:
            data = tensor.raw()
            entry["parameters"] = {"binary_data_size": len(data)}
            tail.append(data)
        else:
            entry["data"] = _json_data(tensor)
        document["outputs"].append(entry)
    header = json.dumps(document, separators=(",", ":")).encode()
    if not tail:
        return header, None
    return header + b"".join(tail), len(header)


# The protocol's extensions the gateway serves, exactly (docs/how-to/v2.md: the others, and why).
EXTENSIONS = ("binary_tensor_data", "classification", "model_configuration", "statistics")
# The server's name in its metadata, on both doors: the one Triton's clients check (NVIDIA's
# examples fail on any other); the version beside it is the Triton behind the gateway's.
# The gateway names itself apart (``gateway`` on /v2, the ``server`` metadata on gRPC).
SERVER_NAME = "triton"
GATEWAY_NAME = "triton-gateway"
# What the doors say of the parts of Triton's protocol the gateway does not serve.
NOT_SERVED_SHARED_MEMORY = "the gateway does not serve shared memory: send the tensors in the request"
NOT_SERVED_SETTINGS = "the gateway does not serve Triton's trace and log settings (they are the operator's)"
NOT_SERVED_CONTROL = "model control is the gateway's admin surface (/admin), not Triton's repository API"


def caps_for(settings: Settings, entry: CatalogEntry | None) -> Caps:
    """What one OIP request may hold: the largest image batch or text request the
    gateway's caps allow, and the JSON body cap; a classifier's BYTES input at most a
    batch of candidate label sets, another model's at most ``server.max_json_values``."""
    max_batch = max(settings.image.max_images, settings.text.max_texts)
    return Caps(
        max_tensor_bytes=max(
            settings.image.max_bytes * settings.image.max_images, settings.max_text_body_bytes
        ),
        max_request_bytes=settings.max_json_body_bytes,
        max_batch=max_batch,
        max_strings=max_batch * settings.text.max_candidate_labels
        if entry is not None
        else settings.server.max_json_values,
    )


def bytes_checks(entry: CatalogEntry | None) -> BytesCheck:
    """A classifier's BYTES inputs pass the checks of its kind, as on /classify (texts
    normalised, images inspected, candidate labels capped and unrepeated); a model of
    GATEWAY_V2_MODELS has no checks of the gateway's beyond the protocol's."""

    def check(tensor: Tensor) -> Tensor:
        if entry is not None and tensor.name in entry.kind.oip_inputs:
            return entry.kind.check_tensor(tensor, entry.caps)
        return tensor

    return check


def check_top_k(entry: CatalogEntry | None, inputs: list[Tensor]) -> None:
    """A classifier's TOP_K within what it answers."""
    if entry is None:
        return
    highest = entry.caps.max_top_k
    for tensor in inputs:
        if tensor.name != "TOP_K" or tensor.array.size == 0:
            continue
        # a row's k each: a few values, read in Python (numpy's comparisons cost 20 us a call)
        values = tensor.array.ravel()
        low, high = (
            (min(v := values.tolist()), max(v)) if values.size <= 1024 else (values.min(), values.max())
        )
        if low < 1 or high > highest:
            raise InvalidInputError(f"TOP_K must be between 1 and {highest}")
