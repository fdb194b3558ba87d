"""A fine-tuned text classifier from a user's ONNX file and ``tokenizer.json``: what the
files and the options say (checked before anything is written), and the four model
directories written from them.

``NAME`` (ensemble) = ``NAME_tokenize`` -> ``NAME_model`` -> ``NAME_postprocess``:

- ``NAME_tokenize``: the shipped ``text_tokenize`` code (a symlink) with the user's
  ``tokenizer.json`` beside it, its truncation (``max_tokens``), padding buckets, the
  network's integer type and whether it takes ``token_type_ids``;
- ``NAME_model``: the ONNX file, a GPU config (TensorRT plan, built on the GPU host by
  ``deploy/model-build/plans.py`` from ``plan.json``: a profile over batch and sequence
  length) and its CPU twin (``configs/cpu.pbtxt``: ONNX Runtime in the shipped runner);
- ``NAME_postprocess``: the shipped ``image_postprocess`` code (logits -> scores ->
  top-k, by ``activation``) with ``labels.txt``.

Every config is a shipped one read as a message, with what differs changed.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.errors import ConfigurationError
from gateway.modelrepo.onnxgraph import OnnxGraph, TensorInfo
from gateway.modelrepo.staging import check_activation, link_code, stage_postprocess
from gateway.modelrepo.tokenizerfile import TokenizerInfo
from gateway.names import DEFAULT_ACTIVATION, SHIPPED_MODELS, TEXT_TASK
from gateway.triton import pbtxt

TEXT = SHIPPED_MODELS["text"]
IMAGE = SHIPPED_MODELS["image"]
# The network inputs a tokenizer produces, and the tokenize step's output for each.
TOKEN_INPUTS = {
    "input_ids": "INPUT_IDS",
    "attention_mask": "ATTENTION_MASK",
    "token_type_ids": "TOKEN_TYPE_IDS",
}
REQUIRED_INPUTS = ("input_ids", "attention_mask")
INTEGER_TYPES = {"INT64": "TYPE_INT64", "INT32": "TYPE_INT32"}
DEFAULT_MAX_LENGTH = 512  # when the graph does not tell (BERT's and most encoders')
DEFAULT_MAX_BATCH = 64
DEFAULT_MAX_TOP_K = 20
# Padded lengths below max_length: few buckets batch best (see text_tokenize's config).
LENGTH_BUCKETS = (64, 128)


class TextModelError(ConfigurationError):
    """The files or the options cannot make a text classifier (the message names the
    file and the numbers)."""


@dataclass(frozen=True)
class TextOptions:
    """What `add-model --task text-classification --onnx` was told; None: read or derived."""

    max_length: int | None = None
    activation: str = DEFAULT_ACTIVATION
    output_name: str | None = None
    max_batch: int | None = None
    max_top_k: int | None = None


@dataclass(frozen=True)
class TextSpec:
    """Everything the configs need, checked against the files."""

    inputs: tuple[str, ...]  # the network's, in its order
    integer_type: str  # TYPE_INT64 or TYPE_INT32
    output_name: str
    classes: int
    max_batch: int
    max_length: int
    fixed_length: bool  # the network's sequence axis is fixed at max_length
    activation: str
    max_top_k: int
    tokenizer_model: str

    def dims(self) -> list[int]:
        return [self.max_length if self.fixed_length else -1]

    def buckets(self) -> str:
        if self.fixed_length:
            return str(self.max_length)
        return ",".join(str(b) for b in LENGTH_BUCKETS if b < self.max_length)

    def profile(self) -> dict[str, Any]:
        """The TensorRT optimisation profile: batch 1..max_batch x sequence 1..max_length
        (fixed: exactly max_length), optimum 8 x 64 (or less)."""
        shortest = self.max_length if self.fixed_length else 1
        typical = self.max_length if self.fixed_length else min(64, self.max_length)
        return {
            "inputs": list(self.inputs),
            "min_shape": f"1x{shortest}",
            "opt_shape": f"{min(8, self.max_batch)}x{typical}",
            "max_shape": f"{self.max_batch}x{self.max_length}",
        }


def _listed(tensors: tuple[TensorInfo, ...]) -> str:
    return ", ".join(f"{t.name} ({t.element_type} {t.shape()})" for t in tensors)


def _inputs(graph: OnnxGraph) -> tuple[tuple[str, ...], str, int | None, int | None]:
    """The token inputs, their integer type, the fixed batch and sequence (None: dynamic)."""
    path = graph.path
    names = [t.name for t in graph.inputs]
    unknown = [name for name in names if name not in TOKEN_INPUTS]
    missing = [name for name in REQUIRED_INPUTS if name not in names]
    if unknown or missing:
        raise TextModelError(
            f"{path} takes {_listed(graph.inputs)}; a text classifier takes what a tokenizer gives: "
            f"input_ids and attention_mask, and optionally token_type_ids"
            + (f" (unknown: {', '.join(unknown)})" if unknown else "")
            + (f" (missing: {', '.join(missing)})" if missing else "")
        )
    types = {t.element_type for t in graph.inputs}
    if len(types) != 1 or not types <= set(INTEGER_TYPES):
        raise TextModelError(
            f"{path}: inputs {_listed(graph.inputs)}; token inputs must all be INT64 or all INT32"
        )
    batches, sequences = set(), set()
    for tensor in graph.inputs:
        if len(tensor.dims) != 2:
            raise TextModelError(f"{path}: input {tensor.name} is {tensor.shape()}, not batch x sequence")
        batches.add(tensor.dims[0])
        sequences.add(tensor.dims[1])
    if len(batches) != 1 or len(sequences) != 1:
        raise TextModelError(f"{path}: the token inputs disagree on their shapes ({_listed(graph.inputs)})")
    (batch,), (sequence,) = batches, sequences
    return tuple(names), INTEGER_TYPES[types.pop()], batch, sequence


def _output(graph: OnnxGraph, wanted: str | None, labels: list[str], labels_file: Path) -> TensorInfo:
    path = graph.path
    if wanted is not None:
        found = [t for t in graph.outputs if t.name == wanted]
        if not found:
            raise TextModelError(
                f"{path} has no output named {wanted!r}; its outputs: {_listed(graph.outputs)}"
            )
        output = found[0]
    elif len(graph.outputs) != 1:
        raise TextModelError(
            f"{path} has {len(graph.outputs)} outputs ({_listed(graph.outputs)}): name one with --output"
        )
    else:
        output = graph.outputs[0]
    if output.element_type != "FLOAT":
        raise TextModelError(f"{path}: output {output.name} is {output.element_type}, not FLOAT")
    if len(output.dims) != 2 or output.dims[1] is None:
        raise TextModelError(
            f"{path}: output {output.name} is {output.shape()}; a classifier's output is batch x classes, "
            "with a fixed number of classes"
        )
    if output.dims[1] != len(labels):
        raise TextModelError(
            f"{labels_file} has {len(labels)} labels, but {path}'s output {output.name} has {output.dims[1]} classes"
        )
    return output


def _max_length(graph: OnnxGraph, sequence: int | None, options: TextOptions) -> int:
    path, asked, positions = graph.path, options.max_length, graph.position_rows
    if asked is not None and not 2 <= asked <= 8192:
        raise TextModelError(f"--max-length must be 2..8192 tokens, not {asked}")
    if sequence is not None:
        if asked is not None and asked != sequence:
            raise TextModelError(
                f"{path}: the sequence axis is fixed at {sequence}, --max-length says {asked}"
            )
        return sequence
    if asked is not None and positions is not None and asked > positions:
        raise TextModelError(
            f"--max-length {asked} is longer than {path}'s position embeddings allow ({positions} tokens)"
        )
    return asked or positions or DEFAULT_MAX_LENGTH


def text_spec(
    graph: OnnxGraph, tokenizer: TokenizerInfo, labels: list[str], labels_file: Path, options: TextOptions
) -> TextSpec:
    """Check the ONNX graph, the tokenizer, the labels and the options against each other."""
    check_activation(options.activation, TextModelError)
    inputs, integer_type, batch, sequence = _inputs(graph)
    output = _output(graph, options.output_name, labels, labels_file)
    rows = graph.vocabulary_rows
    if rows is not None and tokenizer.max_id >= rows:
        raise TextModelError(
            f"{tokenizer.path} emits token ids up to {tokenizer.max_id} ({tokenizer.vocabulary} tokens), but "
            f"{graph.path}'s embedding table has {rows} rows: the tokenizer is not this model's"
        )
    if batch is None:
        max_batch = options.max_batch or DEFAULT_MAX_BATCH
        if not 1 <= max_batch <= 1024:
            raise TextModelError(f"--max-batch must be 1..1024, not {max_batch}")
    elif batch == 1 and options.max_batch in (None, 1):
        max_batch = 1
    else:
        raise TextModelError(
            f"{graph.path}: the batch axis is fixed at {batch}"
            + (
                f", --max-batch says {options.max_batch}"
                if batch == 1
                else ": export it with a dynamic batch axis (or 1)"
            )
        )
    classes = len(labels)
    max_top_k = options.max_top_k or min(DEFAULT_MAX_TOP_K, classes)
    if not 1 <= max_top_k <= classes:
        raise TextModelError(f"--max-top-k must be 1..{classes} (the classes), not {max_top_k}")
    return TextSpec(
        inputs=inputs,
        integer_type=integer_type,
        output_name=output.name,
        classes=classes,
        max_batch=max_batch,
        max_length=_max_length(graph, sequence, options),
        fixed_length=sequence is not None,
        activation=options.activation,
        max_top_k=max_top_k,
        tokenizer_model=tokenizer.model,
    )


def parts(name: str) -> dict[str, str]:
    return {"ensemble": name, **{part: f"{name}_{part}" for part in ("tokenize", "model", "postprocess")}}


def _read(repository: Path, relative: str) -> Any:
    path = repository / relative
    if not path.is_file():
        raise TextModelError(f"{repository} has no {relative}: add-model builds on the shipped models")
    return pbtxt.read_config(path)


def _step(ensemble: Any, model: str, inputs: dict[str, str], outputs: dict[str, str]) -> None:
    step = ensemble.ensemble_scheduling.step.add()
    step.model_name = model
    step.model_version = -1
    for key, value in inputs.items():
        step.input_map[key] = value
    for key, value in outputs.items():
        step.output_map[key] = value


def stage_text(
    repository: Path,
    name: str,
    spec: TextSpec,
    onnx_file: Path,
    tokenizer_file: Path,
    labels: list[str],
    staging: Path,
    managed: tuple[str, str],
) -> list[str]:
    """Write the four directories of ``name`` into ``staging``; returns their names."""
    names = parts(name)
    for part in names.values():
        (staging / part / "1").mkdir(parents=True)
    digest = hashlib.sha256(onnx_file.read_bytes()).hexdigest()[:16]
    origin = (
        f"Written by `triton-gateway add-model {name}` from {onnx_file.name} (sha256 {digest}...) and "
        f"{tokenizer_file.name} ({spec.tokenizer_model}):\n{', '.join(spec.inputs)} "
        f"{spec.integer_type.removeprefix('TYPE_')}, up to {spec.max_length} tokens"
        f"{' (fixed)' if spec.fixed_length else ''}, {spec.classes} classes ({spec.activation}), "
        f"batch <= {spec.max_batch}."
    )
    token_types = "token_type_ids" in spec.inputs

    # The ensemble: the shipped text classifier's (queue, batching) with its own steps.
    ensemble = _read(repository, f"{TEXT['ensemble']}/config.pbtxt")
    ensemble.name = name
    ensemble.max_batch_size = spec.max_batch
    pbtxt.remove_tensor(ensemble.input, "CANDIDATE_LABELS")  # zero-shot only
    ensemble.parameters.clear()
    pbtxt.set_parameter(ensemble, "gateway_task", TEXT_TASK)
    pbtxt.set_parameter(ensemble, *managed)
    del ensemble.ensemble_scheduling.step[:]
    tokens = {TOKEN_INPUTS[i]: i for i in spec.inputs}
    _step(ensemble, names["tokenize"], {"TEXT": "TEXT"}, {**tokens, "TRUNCATED": "TRUNCATED"})
    _step(ensemble, names["model"], {i: i for i in spec.inputs}, {spec.output_name: "logits"})
    _step(
        ensemble,
        names["postprocess"],
        {"LOGITS": "logits", "TOP_K": "TOP_K"},
        {"LABELS": "LABELS", "SCORES": "SCORES", "CLASS_IDS": "CLASS_IDS"},
    )
    (staging / name / "config.pbtxt").write_text(pbtxt.render(ensemble, origin))

    tokenize = _read(repository, f"{TEXT['tokenize']}/config.pbtxt")
    tokenize.name = names["tokenize"]
    tokenize.max_batch_size = spec.max_batch
    for output in tokenize.output:
        if output.name in ("INPUT_IDS", "ATTENTION_MASK"):
            output.data_type = pbtxt.data_type(spec.integer_type)
            del output.dims[:]
            output.dims.extend(spec.dims())
    if token_types:
        pbtxt.add_tensor(tokenize.output, "TOKEN_TYPE_IDS", spec.integer_type, spec.dims())
    pbtxt.set_parameter(tokenize, "tokenizer_file", "tokenizer.json")
    pbtxt.set_parameter(tokenize, "max_tokens", str(spec.max_length))
    pbtxt.set_parameter(tokenize, "length_buckets", spec.buckets())
    (staging / names["tokenize"] / "config.pbtxt").write_text(pbtxt.render(tokenize, origin))
    shutil.copyfile(tokenizer_file, staging / names["tokenize"] / "1" / "tokenizer.json")
    link_code(staging, repository, names["tokenize"], TEXT["tokenize"], TextModelError)

    model_dir = staging / names["model"]
    for relative, out, header in (
        (f"{TEXT['model']}/config.pbtxt", model_dir / "config.pbtxt", "GPU: a TensorRT plan built by deploy/model-build/plans.py from 1/model.onnx (profile: plan.json)."),
        (f"{TEXT['model']}/configs/cpu.pbtxt", model_dir / "configs" / "cpu.pbtxt", "CPU twin (tritonserver --model-config-name=cpu): 1/model.onnx in ONNX Runtime."),
    ):  # fmt: skip
        config = _read(repository, relative)
        config.name = names["model"]
        config.max_batch_size = spec.max_batch
        del config.input[:]
        for tensor in spec.inputs:
            pbtxt.add_tensor(config.input, tensor, spec.integer_type, spec.dims())
        del config.output[:]
        pbtxt.add_tensor(config.output, spec.output_name, "TYPE_FP32", [spec.classes])
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(pbtxt.render(config, f"{header}\n{origin}"))
    shutil.copyfile(onnx_file, model_dir / "1" / "model.onnx")
    link_code(staging, repository, names["model"], IMAGE["model"], TextModelError)  # the ONNX Runtime runner
    (model_dir / "plan.json").write_text(json.dumps(spec.profile(), indent=2) + "\n")

    stage_postprocess(
        repository, staging, names["postprocess"], labels, max_batch=spec.max_batch, max_top_k=spec.max_top_k,
        activation=spec.activation, origin=origin, error=TextModelError,
    )  # fmt: skip
    return list(names.values())
