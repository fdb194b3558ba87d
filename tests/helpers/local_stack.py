"""The local stack as a user runs it (`triton-gateway local`, admin keys on, admin routes
on a listener of their own), shared by the integration modules that add models to a
running stack (the catalog, your own classifiers): started once a session.

At start it holds the shipped models and two second classifiers (an image one sharing
Lite0's network with labels of its own; a zero-shot text one written by add-model).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from gateway.dev.tritonserver import free_ports
from gateway.shared.keyfiles import hash_key

from helpers.triton_fixtures import REPOSITORY

SENTIMENTS = {
    "positive": "Someone is pleased, happy and satisfied: this is good.",
    "negative": "Someone is unhappy, disappointed or angry: this is bad.",
}
ADMIN = {"Authorization": "Bearer ops-secret"}
JPEG = {"content-type": "image/jpeg"}


def renamed(source: Path, target: Path, renames: dict[str, str]) -> None:
    """A copy of a model directory under another name, its config's names replaced."""
    shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__", "*.stamp", "*.onnx"))
    config = (source / "config.pbtxt").read_text()
    for old, new in renames.items():
        config = re.sub(rf'"{re.escape(old)}"', f'"{new}"', config)
    (target / "config.pbtxt").write_text(config)


def add_second_classifiers(repository: Path) -> None:
    """image_classifier_upper: the same network, its labels upper-cased (its own
    postprocess); text_sentiment: the same encoder, a label set of its own, written by
    `triton-gateway add-model`."""
    renamed(
        REPOSITORY / "image_postprocess",
        repository / "image_postprocess_upper",
        {"image_postprocess": "image_postprocess_upper"},
    )
    upper = (REPOSITORY / "image_postprocess" / "labels.txt").read_text().upper()
    (repository / "image_postprocess_upper" / "labels.txt").write_text(upper)
    renamed(
        REPOSITORY / "image_classifier",
        repository / "image_classifier_upper",
        {"image_classifier": "image_classifier_upper", "image_postprocess": "image_postprocess_upper"},
    )

    labels = repository.parent / "sentiment.txt"
    labels.write_text("".join(f"{name}: {prompt}\n" for name, prompt in SENTIMENTS.items()))
    add_model("text_sentiment", labels, repository)


def add_model(name: str, labels: Path, repository: Path, *image: str) -> subprocess.CompletedProcess[str]:
    """The real command, as a user runs it (a text classifier unless ``image`` options are
    given); asserts it succeeded unless ``image`` asks for a refusal with "--expect-refusal"."""
    refusal = "--expect-refusal" in image
    options = [option for option in image if option != "--expect-refusal"]
    task = "image-classification" if options else "text-classification"
    command = [sys.executable, "-m", "gateway", "add-model", name, "--task", task,
               "--labels", str(labels), "--repository", str(repository), *options]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    assert (done.returncode != 0) == refusal, done.stderr
    return done


@dataclass
class LocalStack:
    url: str
    admin_url: str
    repository: Path
    log: Path

    def admin(self, method: str, path: str) -> httpx.Response:
        return httpx.request(method, f"{self.admin_url}{path}", headers=ADMIN, timeout=300)


@pytest.fixture(scope="session")
def local_stack(tmp_path_factory: pytest.TempPathFactory, triton_python_env: Path) -> Iterator[LocalStack]:
    root = tmp_path_factory.mktemp("catalog")
    repository = root / "repository"
    shutil.copytree(
        REPOSITORY, repository, symlinks=True, ignore=shutil.ignore_patterns("__pycache__", "*.tmp")
    )
    add_second_classifiers(repository)
    keys = root / "admin-keys"
    keys.write_text(f"ops {hash_key('ops-secret')}\n")
    port, admin_port = free_ports(2)
    environment = {
        **os.environ,
        "GATEWAY_ADMIN__KEYS_FILE": str(keys),
        "GATEWAY_ADMIN__PORT": str(admin_port),
    }
    command = [
        sys.executable, "-m", "gateway", "local",
        "--port", str(port),
        "--triton-env", str(triton_python_env),
        "--model-repository", str(repository),
        "--workdir", str(root / "triton"),
    ]  # fmt: skip
    log = root / "local.log"
    with log.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT, env=environment)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            assert process.poll() is None, log.read_text()[-3000:]
            try:
                if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        else:
            pytest.fail(f"the local stack did not get ready: {log.read_text()[-3000:]}")
        yield LocalStack(url, f"http://127.0.0.1:{admin_port}", repository, log)
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
