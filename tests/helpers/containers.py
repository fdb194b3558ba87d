"""podman for the container tests: a local Debian base image (no registry is reachable on
our machines, so the bases Dockerfiles name are made here with debootstrap, with the same
contents), image builds from the repository's Dockerfiles, and containers that go when
the test does."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "tests" / "containers" / "containers.conf"
# What the suite builds are tagged under, so a run's leftovers are easy to find.
PREFIX = "localhost/triton-gateway-test"
# Debian 12 with Python 3.11 and venv: what python:3.11-slim-bookworm and
# debian:bookworm-slim give the Dockerfiles (their apt installs the rest).
BASE = f"{PREFIX}-base:bookworm"
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates")
TOOLS = ("podman", "debootstrap", "docker-compose", "runc")


def environment() -> dict[str, str]:
    return {**os.environ, "CONTAINERS_CONF": str(CONF)}


def podman(
    *args: str, check: bool = True, timeout: float = 900, capture: bool = True
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["podman", *args],
        env=environment(),
        check=check,
        timeout=timeout,
        text=True,
        capture_output=capture,
    )


def missing_tools() -> list[str]:
    return [tool for tool in TOOLS if shutil.which(tool) is None]


def image_exists(tag: str) -> bool:
    return podman("image", "exists", tag, check=False).returncode == 0


def image_size(tag: str) -> int:
    found = json.loads(podman("image", "inspect", tag).stdout)
    return int(found[0]["Size"])


def base_image() -> str:
    """The local Debian 12 base (debootstrap --variant=minbase, about 80 s), made once."""
    if image_exists(BASE):
        return BASE
    with tempfile.TemporaryDirectory(prefix="rootfs-") as rootfs:
        subprocess.run(
            ["debootstrap", "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", "bookworm", rootfs],
            check=True,
            capture_output=True,
            timeout=900,
        )
        tar = subprocess.Popen(["tar", "-C", rootfs, "-c", "."], stdout=subprocess.PIPE)
        subprocess.run(
            ["podman", "import", "-", BASE],
            stdin=tar.stdout,
            env=environment(),
            check=True,
            capture_output=True,
        )
        tar.wait()
    return BASE


def build(
    tag: str,
    dockerfile: str,
    context: str = ".",
    args: dict[str, str] | None = None,
    volumes: Sequence[str] = (),
) -> float:
    """Build ``dockerfile`` as the project ships it, from local images only; seconds taken.
    Builds reach PyPI and Debian with the host's network and CA bundle."""
    command = ["build", "--pull=never", "--network", "host", "-v", "/etc/ssl/certs:/etc/ssl/certs:ro"]
    for volume in volumes:
        command += ["-v", volume]
    for key, value in (args or {}).items():
        command += ["--build-arg", f"{key}={value}"]
    started = time.monotonic()
    done = podman(
        *command, "-f", str(ROOT / dockerfile), "-t", tag, str(ROOT / context), check=False, timeout=1800
    )
    if done.returncode != 0:
        raise AssertionError(f"building {dockerfile} failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    return time.monotonic() - started


@dataclass
class Containers:
    """Containers a test starts, removed (forcibly) at its end."""

    names: list[str] = field(default_factory=list)

    def run(self, name: str, image: str, *options: str, command: Sequence[str] = ()) -> str:
        podman("rm", "--force", "--ignore", name, check=False)
        podman("run", "--detach", "--name", name, *options, image, *command)
        self.names.append(name)
        return name

    def logs(self, name: str) -> str:
        done = podman("logs", name, check=False)
        return (done.stdout + done.stderr)[-6000:]

    def remove_all(self) -> None:
        for name in reversed(self.names):
            podman("rm", "--force", "--time", "2", name, check=False)
        self.names.clear()
