"""Build TensorRT plans from the exported ONNX models, on the GPU that will serve them.

    python deploy/model-build/plans.py [--repository model_repository] [--precision fp16|fp32] [--force]

Every model of the repository with a ``plan.json`` beside its config.pbtxt gets a plan
from its ``1/model.onnx``: the shipped ``image_model`` and ``text_model``, and every image
classifier written by ``triton-gateway add-model`` (which derives the profile from the
ONNX input and the batch cap). ``plan.json`` holds the TensorRT optimisation profile:
``{"inputs": [names], "min_shape": "1x3x224x224", "opt_shape": ..., "max_shape": ...}``
(batch first; the same shape for every input listed).

A plan only runs on the TensorRT version and the GPU model (compute capability) that
built it. Each plan gets a stamp (``model.plan.stamp``) recording the TensorRT version,
the GPU's name and compute capability, the ONNX file's hash, the shapes and the
precision; any difference rebuilds it. A host whose visible GPUs are of different
models is refused (a plan built on one would not load on the others): restrict the
build and Triton to one model with NVIDIA_VISIBLE_DEVICES / CUDA_VISIBLE_DEVICES, or
run one Triton per GPU model.

Precision: TensorRT 10 builds FP16 plans with ``--fp16`` (deprecated since 10.12, still
honoured in 10.x, the 25.08 image's TensorRT). TensorRT 11 dropped weakly typed builds:
there the plan is built ``--stronglyTyped`` from the FP32 ONNX, i.e. in FP32, and the
build says so (an FP16 ONNX export is what would restore FP16 there).

Runs inside NVIDIA's Triton image of the serving release (its trtexec); needs a GPU.
Standard library only. Environment: TRTEXEC (default: trtexec on PATH, else
/usr/src/tensorrt/bin/trtexec), NVIDIA_SMI (default nvidia-smi).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
from dataclasses import asdict, dataclass
from pathlib import Path

PROFILE_FILE = "plan.json"


@dataclass(frozen=True)
class PlanSpec:
    """One plan: its ONNX inputs and the optimisation profile (batch first; must match
    max_batch_size and dims in the model's config.pbtxt)."""

    name: str
    inputs: tuple[str, ...]
    min_shape: str
    opt_shape: str
    max_shape: str

    def shapes(self, shape: str) -> str:
        return ",".join(f"{name}:{shape}" for name in self.inputs)


def plan_specs(repository: Path) -> list[PlanSpec]:
    """Every model of the repository that has a plan.json, by name."""
    specs = []
    for path in sorted(repository.glob(f"*/{PROFILE_FILE}")):
        try:
            profile = json.loads(path.read_text())
            specs.append(
                PlanSpec(
                    name=path.parent.name,
                    inputs=tuple(profile["inputs"]),
                    min_shape=profile["min_shape"],
                    opt_shape=profile["opt_shape"],
                    max_shape=profile["max_shape"],
                )
            )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise PlanBuildError(f"{path} is not a profile ({exc.__class__.__name__}: {exc})") from exc
    return specs


@dataclass(frozen=True)
class Gpu:
    name: str
    compute_capability: str


class PlanBuildError(SystemExit):
    """A build that cannot be right on this host (said plainly, exit status 1)."""

    def __init__(self, message: str) -> None:
        super().__init__(f"[plans] {message}")


def log(message: str) -> None:
    print(f"[plans] {message}", flush=True)


def tensorrt_version(trtexec: str) -> tuple[int, int, int]:
    """From trtexec's banner, e.g. "[TensorRT v101300]" -> (10, 13, 0)."""
    result = subprocess.run([trtexec, "--help"], capture_output=True, text=True, check=False)
    match = re.search(r"TensorRT v(\d+)", result.stdout + result.stderr)
    if not match:
        raise PlanBuildError(f"cannot tell the TensorRT version from `{trtexec} --help`")
    number = int(match.group(1))  # major * 10000 + minor * 100 + patch (TensorRT >= 10)
    return number // 10000, number // 100 % 100, number % 100


def visible_gpus(nvidia_smi: str) -> list[Gpu]:
    result = subprocess.run(
        [nvidia_smi, "--query-gpu=name,compute_cap", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise PlanBuildError(f"`{nvidia_smi}` failed: no GPU visible? {result.stderr.strip()}")
    gpus = []
    for line in result.stdout.splitlines():
        if line.strip():
            name, capability = (part.strip() for part in line.rsplit(",", 1))
            gpus.append(Gpu(name, capability))
    if not gpus:
        raise PlanBuildError("no GPU visible")
    return gpus


def target_gpu(gpus: list[Gpu]) -> Gpu:
    models = sorted(set(gpus), key=lambda gpu: (gpu.name, gpu.compute_capability))
    if len(models) > 1:
        listed = "; ".join(f"{gpu.name} (sm {gpu.compute_capability})" for gpu in models)
        raise PlanBuildError(
            f"GPUs of different models are visible ({listed}): a plan built on one does not load "
            "on the others. Restrict this build and its Triton to one model (NVIDIA_VISIBLE_DEVICES)."
        )
    return models[0]


def precision_flags(version: tuple[int, int, int], precision: str) -> list[str]:
    if precision == "fp32":
        return []
    if version[0] >= 11:
        log(
            f"TensorRT {'.'.join(map(str, version))} has no weakly typed FP16 (--fp16): building "
            "strongly typed from the FP32 ONNX, so these plans run in FP32"
        )
        return ["--stronglyTyped"]
    return ["--fp16"]


def stamp(spec: PlanSpec, onnx: Path, version: tuple[int, int, int], gpu: Gpu, precision: str) -> str:
    return json.dumps(
        {
            "tensorrt": ".".join(map(str, version)),
            "gpu": asdict(gpu),
            "onnx_sha256": hashlib.sha256(onnx.read_bytes()).hexdigest(),
            "spec": asdict(spec),
            "precision": precision,
        },
        sort_keys=True,
    )


def build_plan(
    spec: PlanSpec,
    repository: Path,
    trtexec: str,
    version: tuple[int, int, int],
    gpu: Gpu,
    precision: str,
    force: bool,
) -> bool:
    """Build one plan unless its stamp matches; True when it was built."""
    folder = repository / spec.name / "1"
    onnx, plan = folder / "model.onnx", folder / "model.plan"
    stamp_file = plan.with_name("model.plan.stamp")
    if not onnx.exists():
        raise PlanBuildError(f"{onnx} is missing: run deploy/model-build/build.py first")
    wanted = stamp(spec, onnx, version, gpu, precision)
    if not force and plan.exists() and stamp_file.exists() and stamp_file.read_text() == wanted:
        log(f"{plan} is up to date")
        return False
    if plan.exists():
        log(f"{plan} was built for something else (TensorRT, GPU, model or shapes): rebuilding")
    log(f"building {plan} ({precision}, {gpu.name}, TensorRT {'.'.join(map(str, version))})")
    temporary = plan.with_name("model.plan.tmp")
    command = [
        trtexec,
        f"--onnx={onnx}",
        f"--saveEngine={temporary}",
        f"--minShapes={spec.shapes(spec.min_shape)}",
        f"--optShapes={spec.shapes(spec.opt_shape)}",
        f"--maxShapes={spec.shapes(spec.max_shape)}",
        "--skipInference",
        *precision_flags(version, precision),
    ]
    if subprocess.run(command, check=False).returncode != 0:
        raise PlanBuildError(f"trtexec failed for {spec.name}")
    temporary.replace(plan)
    stamp_file.write_text(wanted)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repository", type=Path, default=Path("model_repository"))
    parser.add_argument("--precision", choices=["fp16", "fp32"], default=os.environ.get("PRECISION", "fp16"))
    parser.add_argument("--force", action="store_true", default=os.environ.get("FORCE") == "1")
    options = parser.parse_args(argv)
    trtexec = os.environ.get("TRTEXEC") or shutil.which("trtexec") or "/usr/src/tensorrt/bin/trtexec"
    version = tensorrt_version(trtexec)
    gpu = target_gpu(visible_gpus(os.environ.get("NVIDIA_SMI", "nvidia-smi")))
    specs = plan_specs(options.repository)
    if not specs:
        raise PlanBuildError(f"no model in {options.repository} has a {PROFILE_FILE}: nothing to build")
    log(f"plans for {', '.join(spec.name for spec in specs)}")
    for spec in specs:
        build_plan(spec, options.repository, trtexec, version, gpu, options.precision, options.force)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
