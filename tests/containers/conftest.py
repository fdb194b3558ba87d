"""Container fixtures: the images built once a session, from the repository's Dockerfiles
and locks, on a local Debian base (no registry is reachable here: the test says so and
builds one of the same contents). Their sizes and build times go to
.reports/containers.json."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from helpers.containers import PREFIX, ROOT, Containers, base_image, build, image_size, missing_tools

REPORT = ROOT / ".reports" / "containers.json"
LOCAL_WHEELS = Path("/opt/wheels")  # our machines' copy of PyTorch's CPU wheel


@pytest.fixture(scope="session")
def report() -> Iterator[dict[str, dict[str, float]]]:
    found: dict[str, dict[str, float]] = {}
    yield found
    REPORT.parent.mkdir(exist_ok=True)
    REPORT.write_text(json.dumps(found, indent=2) + "\n")


def _built(
    report: dict[str, dict[str, float]],
    name: str,
    dockerfile: str,
    context: str,
    args: dict[str, str],
    volumes: Sequence[str] = (),
) -> str:
    """``dockerfile`` built as ``<PREFIX>-<name>:local``, its size and build time reported."""
    tag = f"{PREFIX}-{name}:local"
    seconds = build(tag, dockerfile, context, args, volumes)
    report[name] = {"seconds": round(seconds, 1), "mib": round(image_size(tag) / 2**20, 1)}
    print(f"{name}: {report[name]['mib']} MiB, built in {seconds:.0f} s")
    return tag


@pytest.fixture(scope="session")
def base() -> str:
    missing = missing_tools()
    if missing:
        pytest.fail(f"{', '.join(missing)} missing: `make test-containers` installs them (apt)")
    # python:3.11-slim-bookworm, debian:bookworm-slim and NVIDIA's image cannot be pulled here
    print("no registry: the images build on a local Debian 12 base made with debootstrap")
    return base_image()


@pytest.fixture(scope="session")
def gateway_image(base: str, report: dict[str, dict[str, float]]) -> str:
    return _built(report, "gateway", "deploy/gateway/Dockerfile", ".", {"BASE_IMAGE": base})


@pytest.fixture(scope="session")
def triton_cpu_image(base: str, report: dict[str, dict[str, float]]) -> str:
    return _built(report, "triton-cpu", "deploy/triton/Dockerfile.cpu", "deploy/triton", {"BASE_IMAGE": base})


@pytest.fixture(scope="session")
def triton_image(triton_cpu_image: str, report: dict[str, dict[str, float]]) -> str:
    return _built(
        report, "triton", "deploy/triton/Dockerfile", "deploy/triton", {"TRITON_IMAGE": triton_cpu_image}
    )


@pytest.fixture(scope="session")
def model_build_image(triton_cpu_image: str, report: dict[str, dict[str, float]]) -> str:
    args = {"TRITON_IMAGE": triton_cpu_image}
    volumes: list[str] = []
    if LOCAL_WHEELS.is_dir():  # PyTorch's index is out of reach here; its wheel is on disk
        args["PIP_FIND_LINKS"] = str(LOCAL_WHEELS)
        volumes.append(f"{LOCAL_WHEELS}:{LOCAL_WHEELS}:ro")
    return _built(report, "model-build", "deploy/model-build/Dockerfile", ".", args, volumes)


@pytest.fixture
def containers() -> Iterator[Containers]:
    started = Containers()
    yield started
    started.remove_all()
