"""The images in deploy/ build with podman from the locks, and the CPU Triton image keeps
the contract of NVIDIA's image that the other Dockerfiles build on."""

from __future__ import annotations

import re

from packaging.markers import Marker

from helpers.containers import ROOT, podman


def _pins(lock: str, python: str = "3.11.2") -> dict[str, str]:
    """The lock's pins that apply on Linux x86_64 with ``python``."""
    environment = {"python_full_version": python, "python_version": python.rsplit(".", 1)[0]}
    pins = {}
    for line in (ROOT / lock).read_text().splitlines():
        found = re.match(r"([A-Za-z0-9_.\-]+)==([^\s;]+)(?: ; (.+?))? \\$", line)
        if found and (not found[3] or Marker(found[3]).evaluate(environment)):
            pins[found[1].lower()] = found[2]
    return pins


def test_the_gateway_image_holds_exactly_the_runtime_lock(gateway_image: str) -> None:
    listed = podman(
        "run",
        "--rm",
        "--entrypoint",
        "python3",
        gateway_image,
        "-c",
        "import importlib.metadata as m; print('\\n'.join(f'{d.metadata[\"Name\"]}=={d.version}' for d in m.distributions()))",
    ).stdout
    installed = {
        name.lower().replace("_", "-"): version
        for name, version in (line.split("==") for line in listed.split())
    }
    python = podman(
        "run", "--rm", "--entrypoint", "python3", gateway_image, "-c", "import platform; print(platform.python_version())"
    ).stdout.strip()  # fmt: skip
    wanted = _pins("deploy/gateway/requirements.txt", python)
    wanted.pop("setuptools")  # the build backend: removed from the final image with pip
    assert {name: installed.get(name) for name in wanted} == wanted
    assert installed["triton-gateway"]
    # it runs as the manifests expect: uid 10001, the CLI as entrypoint
    assert podman("run", "--rm", "--entrypoint", "id", gateway_image, "-u").stdout.strip() == "10001"
    assert "serve" in podman("run", "--rm", gateway_image, "--help").stdout


def test_the_cpu_triton_image_keeps_the_contract_of_nvidias(triton_cpu_image: str, triton_image: str) -> None:
    run = ("run", "--rm", "--entrypoint", "/opt/nvidia/nvidia_entrypoint.sh")
    assert podman(*run, triton_cpu_image, "id", "-u", "triton-server").stdout.strip() == "1000"
    assert "pip" in podman(*run, triton_cpu_image, "python3", "-m", "pip", "--version").stdout
    assert "curl" in podman(*run, triton_cpu_image, "curl", "--version").stdout
    # tritonserver --help exits 1 after its usage: the binary loads and runs
    assert (
        "--model-repository" in podman(*run, triton_cpu_image, "tritonserver", "--help", check=False).stderr
    )
    # the Triton image built on it: its models' packages, numpy < 2 for the stub
    versions = podman(
        *run,
        triton_image,
        "python3",
        "-c",
        "import numpy, PIL, onnxruntime, tokenizers; print(numpy.__version__)",
    ).stdout.strip()
    assert versions == _pins("deploy/triton/requirements.txt")["numpy"]
    assert versions.startswith("1.")
    assert podman("run", "--rm", "--entrypoint", "id", triton_image, "-u").stdout.strip() == "1000"


def test_the_model_build_image_exports_with_torchs_cpu_build(model_build_image: str) -> None:
    found = podman(
        "run",
        "--rm",
        "--entrypoint",
        "/opt/model-build/venv/bin/python",
        model_build_image,
        "-c",
        "import torch, onnx, transformers; print(torch.__version__, torch.cuda.is_available())",
    ).stdout.split()
    assert found == ["2.13.0+cpu", "False"]
