"""An image classifier from a user's ONNX file: what the file and the options say (checked
before anything is written), and the four model directories written from it.

``NAME`` (ensemble) = ``NAME_preprocess`` -> ``NAME_model`` -> ``NAME_postprocess``:

- ``NAME_preprocess``: the shipped ``image_preprocess`` code (a symlink) with this
  network's crop size, resize, mean/std, channel order and layout in its config;
- ``NAME_model``: the ONNX file, a GPU config (TensorRT plan, built on the GPU host by
  ``deploy/model-build/plans.py`` from ``plan.json``, the profile derived here) and its
  CPU twin (``configs/cpu.pbtxt``: ONNX Runtime in the shipped runner, a symlink);
- ``NAME_postprocess``: the shipped ``image_postprocess`` code with ``labels.txt``.

Every config is the shipped one read as a message, with what differs changed: queue
policies, instance groups and caches stay as the shipped models have them.
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
from gateway.names import DEFAULT_ACTIVATION, SHIPPED_MODELS
from gateway.triton import pbtxt

SHIPPED = SHIPPED_MODELS["image"]
# mean and std per channel, in RGB order and the 0..255 scale the preprocess works in.
PRESETS: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    # torchvision and most PyTorch models: mean (0.485, 0.456, 0.406), std (0.229, 0.224, 0.225) of 0..1
    "imagenet": ((123.675, 116.28, 103.53), (58.395, 57.12, 57.375)),
    # Inception, MobileNet and other TF-slim models: (x - 127.5) / 127.5
    "inception": ((127.5, 127.5, 127.5), (127.5, 127.5, 127.5)),
    # EfficientNet-Lite: (x - 127) / 128
    "efficientnet-lite": ((127.0, 127.0, 127.0), (128.0, 128.0, 128.0)),
}
DEFAULT_MAX_BATCH = 32
DEFAULT_MAX_TOP_K = 20
# The crop is taken from the image resized to (crop side + 32) on its short side: the
# ratio EfficientNet's and most ImageNet models' evaluation uses (224 -> 256).
CROP_PADDING = 32


class ImageModelError(ConfigurationError):
    """The ONNX file or the options cannot make an image classifier (the message names
    the file and the numbers)."""


@dataclass(frozen=True)
class ImageOptions:
    """What `add-model --task image-classification` was told; None: read or derived."""

    normalize: str | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    channel_order: str = "RGB"
    input_size: tuple[int, int] | None = None  # (height, width)
    resize_short_side: int | None = None
    input_name: str | None = None
    output_name: str | None = None
    max_batch: int | None = None
    max_top_k: int | None = None
    activation: str = DEFAULT_ACTIVATION


@dataclass(frozen=True)
class ImageSpec:
    """Everything the configs need, checked against the ONNX file."""

    input_name: str
    output_name: str
    layout: str  # NCHW or NHWC
    height: int
    width: int
    classes: int
    max_batch: int
    resize_short_side: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    channel_order: str
    max_top_k: int
    activation: str = DEFAULT_ACTIVATION

    def pixels_dims(self) -> list[int]:
        if self.layout == "NCHW":
            return [3, self.height, self.width]
        return [self.height, self.width, 3]

    def profile(self) -> dict[str, Any]:
        """The TensorRT optimisation profile: batch 1..max_batch, optimum 8 (or less)."""
        shape = "x".join(map(str, self.pixels_dims()))
        return {
            "inputs": [self.input_name],
            "min_shape": f"1x{shape}",
            "opt_shape": f"{min(8, self.max_batch)}x{shape}",
            "max_shape": f"{self.max_batch}x{shape}",
        }


def _one(tensors: tuple[TensorInfo, ...], wanted: str | None, what: str, path: Path) -> TensorInfo:
    listed = ", ".join(f"{t.name} ({t.shape()})" for t in tensors)
    if wanted is not None:
        for tensor in tensors:
            if tensor.name == wanted:
                return tensor
        raise ImageModelError(f"{path} has no {what} named {wanted!r}; its {what}s: {listed}")
    if what == "input" and len(tensors) != 1:
        raise ImageModelError(
            f"{path} has {len(tensors)} inputs ({listed}): an image classifier takes one image input"
        )
    if len(tensors) != 1:
        raise ImageModelError(f"{path} has {len(tensors)} {what}s ({listed}): name one with --{what}")
    return tensors[0]


def _image_input(graph: OnnxGraph, options: ImageOptions) -> tuple[TensorInfo, str, int, int]:
    """The input, its layout and its (height, width)."""
    path = graph.path
    tensor = _one(graph.inputs, options.input_name, "input", path)
    if options.input_name is None and len(graph.inputs) != 1:  # pragma: no cover - _one refused
        raise ImageModelError(f"{path}: one image input is needed")
    dims = tensor.dims
    if len(dims) != 4 or (dims[1] != 3 and dims[3] != 3):
        raise ImageModelError(
            f"{path}: input {tensor.name} is {tensor.shape()}, not an image "
            "(batch x 3 x height x width, or batch x height x width x 3)"
        )
    if tensor.element_type != "FLOAT":
        raise ImageModelError(
            f"{path}: input {tensor.name} is {tensor.element_type}; the preprocess gives FLOAT "
            "(export the network with an FP32 input; TensorRT still builds FP16 plans from it)"
        )
    layout = "NCHW" if dims[1] == 3 else "NHWC"
    height, width = (dims[2], dims[3]) if layout == "NCHW" else (dims[1], dims[2])
    if height is None or width is None:
        if options.input_size is None:
            raise ImageModelError(
                f"{path}: input {tensor.name} has a dynamic spatial size ({tensor.shape()}): "
                "TensorRT needs a fixed one; pass --input-size HEIGHTxWIDTH (what the network was trained at)"
            )
        return tensor, layout, *options.input_size
    if options.input_size is not None and options.input_size != (height, width):
        asked = "x".join(map(str, options.input_size))
        raise ImageModelError(
            f"{path}: input {tensor.name} is fixed at {height}x{width}, --input-size says {asked}"
        )
    return tensor, layout, height, width


def _max_batch(graph: OnnxGraph, tensor: TensorInfo, options: ImageOptions) -> int:
    batch = tensor.dims[0]
    if batch is None:
        wanted = options.max_batch or DEFAULT_MAX_BATCH
        if not 1 <= wanted <= 1024:
            raise ImageModelError(f"--max-batch must be 1..1024, not {wanted}")
        return wanted
    if batch != 1:
        raise ImageModelError(
            f"{graph.path}: input {tensor.name}'s batch axis is fixed at {batch}: export it with a "
            "dynamic batch axis (or 1)"
        )
    if options.max_batch not in (None, 1):
        raise ImageModelError(
            f"{graph.path}: input {tensor.name}'s batch axis is fixed at 1, --max-batch says {options.max_batch}"
        )
    return 1


def _normalisation(options: ImageOptions) -> tuple[tuple[float, ...], tuple[float, ...]]:
    if options.normalize is not None:
        if options.mean is not None or options.std is not None:
            raise ImageModelError("give --normalize or --mean and --std, not both")
        if options.normalize not in PRESETS:
            raise ImageModelError(
                f"--normalize must be one of {', '.join(PRESETS)}, not {options.normalize!r}"
            )
        mean, std = PRESETS[options.normalize]
        if options.channel_order == "BGR":  # listed in the network's channel order
            mean, std = mean[::-1], std[::-1]
        return mean, std
    if options.mean is None or options.std is None:
        raise ImageModelError(
            f"say how the network expects its pixels: --normalize {{{','.join(PRESETS)}}}, "
            "or --mean and --std (three values each, 0..255 scale, in the network's channel order)"
        )
    for what, values in (("--mean", options.mean), ("--std", options.std)):
        if len(values) != 3:
            raise ImageModelError(f"{what} needs three values (one a channel), got {len(values)}")
    if min(options.std) <= 0:
        raise ImageModelError("--std values must be positive")
    return options.mean, options.std


def image_spec(graph: OnnxGraph, labels: list[str], labels_file: Path, options: ImageOptions) -> ImageSpec:
    """Check the ONNX graph, the labels and the options against each other."""
    if options.channel_order not in ("RGB", "BGR"):
        raise ImageModelError(f"--channel-order must be RGB or BGR, not {options.channel_order!r}")
    tensor, layout, height, width = _image_input(graph, options)
    max_batch = _max_batch(graph, tensor, options)
    output = _one(graph.outputs, options.output_name, "output", graph.path)
    if output.element_type != "FLOAT":
        raise ImageModelError(f"{graph.path}: output {output.name} is {output.element_type}, not FLOAT")
    if len(output.dims) != 2 or output.dims[1] is None:
        raise ImageModelError(
            f"{graph.path}: output {output.name} is {output.shape()}; a classifier's output is "
            "batch x classes, with a fixed number of classes"
        )
    classes = output.dims[1]
    if classes != len(labels):
        raise ImageModelError(
            f"{labels_file} has {len(labels)} labels, but {graph.path}'s output {output.name} "
            f"has {classes} classes"
        )
    resize = options.resize_short_side or max(height, width) + CROP_PADDING
    if resize < max(height, width):
        raise ImageModelError(f"--resize-short-side {resize} is smaller than the input's {height}x{width}")
    max_top_k = options.max_top_k or min(DEFAULT_MAX_TOP_K, classes)
    if not 1 <= max_top_k <= classes:
        raise ImageModelError(f"--max-top-k must be 1..{classes} (the classes), not {max_top_k}")
    mean, std = _normalisation(options)
    check_activation(options.activation, ImageModelError)
    return ImageSpec(
        input_name=tensor.name,
        output_name=output.name,
        layout=layout,
        height=height,
        width=width,
        classes=classes,
        max_batch=max_batch,
        resize_short_side=resize,
        mean=mean,
        std=std,
        channel_order=options.channel_order,
        max_top_k=max_top_k,
        activation=options.activation,
    )


def parts(name: str) -> dict[str, str]:
    return {"ensemble": name, **{part: f"{name}_{part}" for part in ("preprocess", "model", "postprocess")}}


def _floats(values: tuple[float, ...]) -> str:
    return ",".join(f"{value:g}" for value in values)


def stage_image(
    repository: Path,
    name: str,
    spec: ImageSpec,
    onnx_file: Path,
    labels: list[str],
    staging: Path,
    managed: tuple[str, str],
) -> list[str]:
    """Write the four directories of ``name`` into ``staging``; returns their names."""
    names = parts(name)
    shipped = {part: repository / model for part, model in SHIPPED.items()}
    for folder in shipped.values():
        if not (folder / "config.pbtxt").is_file():
            raise ImageModelError(
                f"{repository} has no {folder.name}: add-model builds on the shipped models"
            )
    for part in names.values():
        (staging / part / "1").mkdir(parents=True)
    digest = hashlib.sha256(onnx_file.read_bytes()).hexdigest()[:16]
    origin = (
        f"Written by `triton-gateway add-model {name}` from {onnx_file.name} (sha256 {digest}...):\n"
        f"{spec.layout} {spec.height}x{spec.width} {spec.channel_order}, resize short side "
        f"{spec.resize_short_side}, mean {_floats(spec.mean)}, std {_floats(spec.std)}, "
        f"{spec.classes} classes ({spec.activation}), batch <= {spec.max_batch}."
    )

    ensemble = pbtxt.read_config(shipped["ensemble"] / "config.pbtxt")
    ensemble.name = name
    ensemble.max_batch_size = spec.max_batch
    pbtxt.set_parameter(ensemble, *managed)
    for step in ensemble.ensemble_scheduling.step:
        step.model_name = names[next(part for part, model in SHIPPED.items() if model == step.model_name)]
        if step.model_name == names["model"]:
            (pixels,) = step.input_map.values()
            (logits,) = step.output_map.values()
            step.input_map.clear()
            step.output_map.clear()
            step.input_map[spec.input_name] = pixels
            step.output_map[spec.output_name] = logits
    (staging / name / "config.pbtxt").write_text(pbtxt.render(ensemble, origin))

    pre = pbtxt.read_config(shipped["preprocess"] / "config.pbtxt")
    pre.name = names["preprocess"]
    pre.max_batch_size = spec.max_batch
    pbtxt.set_tensor(pre.output, "PIXELS", "PIXELS", spec.pixels_dims())
    for key, value in {
        "resize_short_side": str(spec.resize_short_side),
        "mean": _floats(spec.mean),
        "std": _floats(spec.std),
        "channel_order": spec.channel_order,
        "layout": spec.layout,
    }.items():
        pbtxt.set_parameter(pre, key, value)
    (staging / names["preprocess"] / "config.pbtxt").write_text(pbtxt.render(pre, origin))
    link_code(staging, repository, names["preprocess"], SHIPPED["preprocess"], ImageModelError)

    model_dir = staging / names["model"]
    for config_path, out, header in (
        (shipped["model"] / "config.pbtxt", model_dir / "config.pbtxt", "GPU: a TensorRT plan built by deploy/model-build/plans.py from 1/model.onnx (profile: plan.json)."),
        (shipped["model"] / "configs" / "cpu.pbtxt", model_dir / "configs" / "cpu.pbtxt", "CPU twin (tritonserver --model-config-name=cpu): 1/model.onnx in ONNX Runtime."),
    ):  # fmt: skip
        config = pbtxt.read_config(config_path)
        config.name = names["model"]
        config.max_batch_size = spec.max_batch
        (old_input,) = [tensor.name for tensor in config.input]
        (old_output,) = [tensor.name for tensor in config.output]
        pbtxt.set_tensor(config.input, old_input, spec.input_name, spec.pixels_dims())
        pbtxt.set_tensor(config.output, old_output, spec.output_name, [spec.classes])
        batching = config.dynamic_batching
        preferred = [size for size in batching.preferred_batch_size if size <= spec.max_batch]
        del batching.preferred_batch_size[:]
        batching.preferred_batch_size.extend(preferred)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(pbtxt.render(config, f"{header}\n{origin}"))
    shutil.copyfile(onnx_file, model_dir / "1" / "model.onnx")
    link_code(staging, repository, names["model"], SHIPPED["model"], ImageModelError)
    (model_dir / "plan.json").write_text(json.dumps(spec.profile(), indent=2) + "\n")

    stage_postprocess(
        repository, staging, names["postprocess"], labels, max_batch=spec.max_batch, max_top_k=spec.max_top_k,
        activation=spec.activation, origin=origin, error=ImageModelError,
    )  # fmt: skip
    return list(names.values())
