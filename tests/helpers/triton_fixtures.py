"""Pytest plugin: a real tritonserver (session-wide) and the real gateway in front of it,
over real HTTP, for tests/integration and tests/e2e. Loaded by tests/conftest.py.

The Triton environment comes from TRITON_GATEWAY_TRITON_ENV (``make test`` sets it);
a missing environment or model is a loud failure, never a skip.
"""

from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Callable, Generator, Iterator
from pathlib import Path

import httpx
import pytest
from pydantic import SecretStr

from gateway.app import create_app
from gateway.dev.gatewayprocess import GatewayProcess
from gateway.dev.tritonserver import TritonServer
from gateway.settings import Settings, TritonSettings

from helpers.support import ServedApp

ROOT = Path(__file__).resolve().parents[2]
REPOSITORY = ROOT / "model_repository"
_servers: list[TritonServer] = []


def triton_env() -> Path:
    env = Path(os.environ.get("TRITON_GATEWAY_TRITON_ENV", ROOT / ".venv-triton"))
    if not env.is_absolute():
        env = ROOT / env
    if not (env / "bin" / "python").exists():
        pytest.fail(f"no Triton environment at {env}: run the suite with `make test`")
    return env


def start_triton(repository: Path, workdir: Path, response_cache_bytes: int = 0) -> TritonServer:
    """A real tritonserver as `make run` starts it: model control ``explicit`` with every
    model loaded at start and the repository API behind a key of its own. Without a
    response cache unless asked, so that tests sending the same input twice still exercise
    the models (tests/integration/test_response_cache.py covers the cache)."""
    if not (REPOSITORY / "image_model" / "1" / "model.onnx").exists():
        pytest.fail("model_repository/image_model/1/model.onnx is missing: run `make models`")
    server = TritonServer.on_free_ports(
        triton_env(),
        repository,
        workdir,
        response_cache_bytes=response_cache_bytes,
        model_control_mode="explicit",
        load_models=("*",),
        repository_key=secrets.token_hex(16),
    )
    _servers.append(server)
    server.start()
    server.wait_ready(timeout=180)
    return server


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Attach the tail of every tritonserver log to a failing test's report."""
    report = yield
    if report.failed:
        for server in _servers:
            if server.log_file.exists():
                tail = server.log_file.read_text(errors="replace").splitlines()[-60:]
                report.sections.append((f"tritonserver log {server.log_file}", "\n".join(tail)))
    return report


@pytest.fixture(scope="session")
def triton_python_env() -> Path:
    return triton_env()


@pytest.fixture(scope="session")
def model_repository() -> Path:
    return REPOSITORY


@pytest.fixture(scope="session")
def triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    server = start_triton(REPOSITORY, tmp_path_factory.mktemp("triton"))
    yield server
    server.kill()


@pytest.fixture(autouse=True)
def _triton_revived(request: pytest.FixtureRequest) -> None:
    """The session's Triton started again (same ports) if a test before this one left it
    dead. Triton's Python backend aborts now and then under load (SIGSEGV, then
    boost::interprocess::lock_exception: triton-inference-server/server#8882, open; once in
    a clean-clone run here on 2026-12-02, beside test_load_balancer's rapid reset): the test
    it happens in fails, and before this the ~60 tests after it failed too."""
    if "triton" not in request.fixturenames:
        return
    server: TritonServer = request.getfixturevalue("triton")
    if server.running:
        return
    print(f"the session's Triton had exited ({server.exit_code}); started again:\n{server.log_tail(20)}")
    server.start()
    server.wait_ready(timeout=180)


def gateway_settings(triton: TritonServer, **overrides: object) -> Settings:
    """Settings pointing at this Triton's gRPC and metrics endpoints."""
    return Settings(
        triton=TritonSettings(
            url=triton.grpc_url,
            metrics_url=triton.metrics_url,
            repository_key=SecretStr(triton.repository_key),
        ),
        **overrides,  # type: ignore[arg-type]
    )


@pytest.fixture(scope="session")
def gateway(triton: TritonServer) -> Iterator[ServedApp]:
    settings = gateway_settings(triton)
    served = ServedApp(create_app(settings), settings).start()
    yield served
    served.stop()


@pytest.fixture
def http(gateway: ServedApp) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway.url, timeout=60) as client:
        yield client


@pytest.fixture
def serve_gateway() -> Iterator[Callable[[Settings], httpx.Client]]:
    """Serve extra gateways with other settings; all stopped at the end of the test."""
    started: list[tuple[ServedApp, httpx.Client]] = []

    def serve(settings: Settings) -> httpx.Client:
        served = ServedApp(create_app(settings), settings).start()
        client = httpx.Client(base_url=served.url, timeout=60)
        started.append((served, client))
        return client

    yield serve
    for served, client in started:
        client.close()
        served.stop()


FAULTY_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        raise pb_utils.TritonModelException("this model always fails")
"""

FAULTY_CONFIG = """
name: "faulty_classifier"
backend: "python"
max_batch_size: 32
input [
  { name: "IMAGE" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "TOP_K" data_type: TYPE_INT32 dims: [ 1 ] }
]
output [
  { name: "LABELS" data_type: TYPE_STRING dims: [ -1 ] },
  { name: "SCORES" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "CLASS_IDS" data_type: TYPE_INT32 dims: [ -1 ] }
]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""


# A model whose answer is larger than a top-k answer by far: 8 MiB of FP32 (an embedding
# or logits model served through /v2 can answer that much).
BIG_OUTPUT_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [
            pb_utils.InferenceResponse([pb_utils.Tensor("VALUES", np.ones((1, 2 * 1024 * 1024), np.float32))])
            for _ in requests
        ]
"""

BIG_OUTPUT_CONFIG = """
name: "big_output"
backend: "python"
max_batch_size: 0
input [ { name: "QUERY" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "VALUES" data_type: TYPE_FP32 dims: [ 1, 2097152 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""


def _faulty_triton(root: Path) -> Iterator[TritonServer]:
    """A Triton of the real repository plus a model that always fails and one with an
    8 MiB answer, under ``root``; killed after (its log no longer attached to failures)."""
    repository = root / "repository"
    shutil.copytree(REPOSITORY, repository, ignore=shutil.ignore_patterns("*.stamp", "__pycache__"))
    faulty = repository / "faulty_classifier"
    (faulty / "1").mkdir(parents=True)
    (faulty / "1" / "model.py").write_text(FAULTY_MODEL)
    (faulty / "config.pbtxt").write_text(FAULTY_CONFIG)
    big = repository / "big_output"
    (big / "1").mkdir(parents=True)
    (big / "1" / "model.py").write_text(BIG_OUTPUT_MODEL)
    (big / "config.pbtxt").write_text(BIG_OUTPUT_CONFIG)
    server = start_triton(repository, root / "triton")
    yield server
    server.kill()
    _servers.remove(server)


@pytest.fixture
def faults_triton(tmp_path: Path) -> Iterator[TritonServer]:
    """A Triton of this test's own (it may be stopped), with the real repository plus a
    model that always fails and one with an 8 MiB answer, for what a healthy server with
    the shipped models does not produce."""
    yield from _faulty_triton(tmp_path)


@pytest.fixture(scope="module")
def faulty_triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    """:func:`faults_triton`'s models on one Triton shared by a module's tests that only call it
    (a start is 5-7 s): a test that stops, kills or unloads takes ``faults_triton``."""
    yield from _faulty_triton(tmp_path_factory.mktemp("faulty"))


@pytest.fixture
def spawn_gateway(tmp_path: Path) -> Iterator[Callable[..., GatewayProcess]]:
    """Start gateway processes with GATEWAY_* settings; all killed at the end of the test."""
    started: list[GatewayProcess] = []

    def spawn(triton: TritonServer, **env: str) -> GatewayProcess:
        served = GatewayProcess.start(triton, tmp_path, env=env)
        started.append(served)
        return served.wait()

    yield spawn
    for served in started:
        served.stop()
