"""docker-compose.yml + docker-compose.cpu.yml brought up for real, under podman and
Debian's docker-compose, as a user on a machine without a GPU would: the model build (its
skip: the models are built), Triton on CPU, two gateway replicas behind HAProxy, Redis and
Prometheus, with the secrets `make keys` writes. Images only a registry has are Debian's
packages of the same programs (tests/containers/compose.local.yml); Grafana and Jaeger are
left out (they cannot be built here).

podman runs health checks from systemd timers, and our machines have no systemd: the test
runs each container's check on its interval itself (`podman healthcheck run`), as the
engine's scheduler would."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import tritonclient.grpc as tritongrpc

from gateway.dev.tritonserver import free_ports
from gateway.shared.keyfiles import hash_key

from helpers.containers import PREFIX, ROOT, build, environment, podman
from helpers.support import chelsea_jpeg

PROJECT = "tgtest"
FILES = ("docker-compose.yml", "docker-compose.cpu.yml", "tests/containers/compose.local.yml")
SERVICES = ("model-build", "triton", "gateway", "redis", "proxy", "prometheus")
CLIENT_KEY = "compose-client-secret"
PROMETHEUS_KEY = "compose-prometheus-secret"
# registry images -> Debian's packages of the same programs
STAND_INS = {"redis": "redis-server", "haproxy": "haproxy", "prometheus": "prometheus"}


@dataclass
class Stack:
    env: dict[str, str]
    url: str  # HAProxy's HTTP frontend, published
    grpc: str  # HAProxy's gRPC frontend, published
    prometheus: str

    def compose(self, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
        files = [arg for name in FILES for arg in ("-f", str(ROOT / name))]
        return subprocess.run(
            ["docker-compose", "-p", PROJECT, *files, *args],
            env=self.env, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip

    def container(self, service: str, index: int = 1) -> str:
        return f"{PROJECT}_{service}_{index}"


def _project_containers() -> list[str]:
    out = podman(
        "ps", "-a", "--filter", f"label=com.docker.compose.project={PROJECT}", "--format", "{{.Names}}"
    )
    return out.stdout.split()


class HealthChecks:
    """The health scheduler podman lacks without systemd: each container's check, run on a
    short interval (the files' intervals are 5-30 s; a check past its start period counts)."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(2):
            try:
                for name in _project_containers():
                    podman("healthcheck", "run", name, check=False, timeout=30)
            except subprocess.SubprocessError as error:
                # a podman call that hangs or fails must not end the scheduler: every
                # status would freeze where it was
                print(f"health scheduler: {error}")

    def __enter__(self) -> HealthChecks:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _inspect(name: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(podman("inspect", name).stdout)[0]
    return found


def _health_of(found: dict[str, Any]) -> dict[str, Any]:
    state = found["State"]
    return dict(state.get("Health") or state.get("Healthcheck") or {})


def _health(name: str) -> str:
    return str(_health_of(_inspect(name)).get("Status", "none"))


def _unhealthy(name: str) -> str:
    """Why a container is not healthy: its last checks (exit code, output), its state and
    the last lines it logged (for a failure's message)."""
    found = _inspect(name)
    health, state = _health_of(found), found["State"]
    logs = podman("logs", "--tail", "20", name, check=False)
    return (
        f"{name}: {health.get('Status', 'none')}; checks {json.dumps((health.get('Log') or [])[-5:])[-2500:]}; "
        f"status {state.get('Status')} restarts {found.get('RestartCount', '?')} "
        f"exit {state.get('ExitCode')} oom {state.get('OOMKilled')}\n"
        f"{(logs.stdout + logs.stderr)[-2500:]}"
    )


@pytest.fixture(scope="module")
def stack(
    request: pytest.FixtureRequest,
    gateway_image: str,
    triton_image: str,
    model_build_image: str,
    base: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Stack]:
    for name, package in STAND_INS.items():
        build(f"{PREFIX}-{name}:local", "tests/containers/images/Dockerfile.debian", "tests/containers/images",
              args={"BASE_IMAGE": base, "PACKAGES": package})  # fmt: skip
    # the names compose gives the images it would build
    for built, named in ((gateway_image, "triton-gateway:local"), (triton_image, "triton-gateway-triton:local"),
                         (model_build_image, "triton-gateway-model-build:local")):  # fmt: skip
        podman("tag", built, f"localhost/{named}")

    work = tmp_path_factory.mktemp("compose")
    secrets = work / "secrets"
    secrets.mkdir()
    (secrets / "api-keys").write_text(
        f"client {hash_key(CLIENT_KEY)}\nprometheus {hash_key(PROMETHEUS_KEY)}\n"
    )
    (secrets / "prometheus-key").write_text(PROMETHEUS_KEY)
    for path in (secrets / "api-keys", secrets / "prometheus-key"):
        path.chmod(0o644)  # read by the containers' own users, as `make keys` leaves them
    socket = work / "podman.sock"
    service = subprocess.Popen(
        ["podman", "system", "service", "--time=0", f"unix://{socket}"],
        env=environment(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 20
    while not socket.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    http, grpc, prometheus = free_ports(3)
    env = {
        **environment(),
        "DOCKER_HOST": f"unix://{socket}",
        "COMPOSE_INTERACTIVE_NO_CLI": "1",
        "TRITON_REPOSITORY_KEY": "a" * 64,
        "REDIS_PASSWORD": "b" * 64,
        "GRAFANA_ADMIN_PASSWORD": "not-started",
        "API_KEYS_FILE": str(secrets / "api-keys"),
        "PROMETHEUS_KEY_FILE": str(secrets / "prometheus-key"),
        "MODEL_BUILD_USER": f"{os.getuid()}:{os.getgid()}",  # the checkout's owner
        "TRACING_ENABLED": "false",  # no Jaeger here
        "GATEWAY_PORT": str(http),
        "GATEWAY_GRPC_PORT": str(grpc),
        "PROMETHEUS_PORT": str(prometheus),
    }
    found = Stack(env, f"http://127.0.0.1:{http}", f"127.0.0.1:{grpc}", f"http://127.0.0.1:{prometheus}")
    try:
        assert found.compose("config", "-q").returncode == 0
        with HealthChecks():
            up = found.compose("up", "-d", "--no-build", "--scale", "gateway=2", *SERVICES)
            assert up.returncode == 0, up.stderr[-4000:]
            yield found
    finally:
        if request.session.testsfailed:  # what each container said, for the failure
            for name in _project_containers():
                state = _inspect(name)["State"]
                logs = podman("logs", "--tail", "30", name, check=False)
                print(f"--- {name}: {json.dumps(state.get('Health') or state.get('Healthcheck'))[-1500:]}")
                print((logs.stdout + logs.stderr)[-3000:])
        down = found.compose("down", "--volumes", "--remove-orphans")
        service.terminate()
        service.wait(timeout=30)
        assert down.returncode == 0, down.stderr[-3000:]
        assert not _project_containers()
        assert not [
            n
            for n in podman("network", "ls", "--format", "{{.Name}}").stdout.split()
            if n.startswith(PROJECT)
        ]
        assert not [
            v for v in podman("volume", "ls", "--format", "{{.Name}}").stdout.split() if v.startswith(PROJECT)
        ]


def _logs(stack: Stack) -> str:
    """The last lines Triton and each gateway logged (for a failure's message): the
    gateways' without their health checks and scrapes, each line cut short, so both
    gateways fit in what CI shows of a failure (stop 59's showed only the first)."""
    found = []
    for name in (stack.container("triton"), stack.container("gateway", 1), stack.container("gateway", 2)):
        logs = podman("logs", "--tail", "200", name, check=False)
        lines = [
            line[:300]
            for line in (logs.stdout + logs.stderr).splitlines()
            if "GET /readyz 200" not in line and "GET /metrics 200" not in line
        ]
        found.append(f"\n--- {name} ---\n" + "\n".join(lines[-15:]))
    return "".join(found)


def _classify(stack: Stack, key: str | None, **kw: object) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"{stack.url}/classify", headers=headers, timeout=30, **kw)  # type: ignore[arg-type]


def test_the_stack_comes_up_healthy_and_answers_through_haproxy(stack: Stack) -> None:
    for service in ("triton", "gateway", "redis", "proxy"):
        names = [n for n in _project_containers() if n.startswith(f"{PROJECT}_{service}_")]
        assert names, service
        for name in names:
            deadline = time.monotonic() + 60
            while _health(name) != "healthy" and time.monotonic() < deadline:
                time.sleep(1)
            assert _health(name) == "healthy", _unhealthy(name)
    assert len([n for n in _project_containers() if n.startswith(f"{PROJECT}_gateway_")]) == 2
    # the README's two curls, with the client's key. The first image calls have taken past
    # the gateway's 10 s Triton deadline (504) in clean-clone runs, right after the
    # 20-minute suite, twice in a row once (a cold model in a cold container on a loaded
    # machine; 0.1 s here): tried again for up to 60 s while Triton answers 504, then what
    # Triton and the gateways logged. (Triton's model_warmup would make the first call warm.)
    deadline = time.monotonic() + 60
    image = _classify(stack, CLIENT_KEY, files={"file": ("cat.jpg", chelsea_jpeg(), "image/jpeg")})
    while image.status_code == 504 and time.monotonic() < deadline:
        print(f"an early image call: {image.status_code} {image.text}")
        image = _classify(stack, CLIENT_KEY, files={"file": ("cat.jpg", chelsea_jpeg(), "image/jpeg")})
    assert image.status_code == 200, image.text + _logs(stack)
    assert any("cat" in p["label"] for p in image.json()["results"][0]["predictions"][:3])
    # the first text call meets a cold text model the same way (504 once, 2026-11-28, right
    # after the suite): tried again as the image was
    deadline = time.monotonic() + 60
    text = _classify(stack, CLIENT_KEY, json={"text": "The striker scored twice in the final."})
    while text.status_code == 504 and time.monotonic() < deadline:
        print(f"an early text call: {text.status_code} {text.text}")
        text = _classify(stack, CLIENT_KEY, json={"text": "The striker scored twice in the final."})
    assert text.status_code == 200, text.text + _logs(stack)
    assert text.json()["results"][0]["predictions"][0]["label"] == "sports"
    assert _classify(stack, None, json={"text": "no key"}).status_code == 401
    # the gRPC door, through HAProxy's gRPC frontend
    client = tritongrpc.InferenceServerClient(stack.grpc)
    assert client.is_model_ready("text_classifier", headers={"authorization": f"Bearer {CLIENT_KEY}"})


def test_prometheus_scrapes_both_replicas_and_triton_with_its_key(stack: Stack) -> None:
    deadline = time.monotonic() + 60
    up: dict[str, list[str]] = {}
    while time.monotonic() < deadline:
        found = httpx.get(f"{stack.prometheus}/api/v1/targets", timeout=5).json()["data"]["activeTargets"]
        up = {}
        for target in found:
            up.setdefault(target["labels"]["job"], []).append(target["health"])
        if up.get("triton-gateway") == ["up", "up"] and up.get("triton") == ["up"]:
            break
        time.sleep(2)
    assert up.get("triton-gateway") == ["up", "up"], up
    assert up.get("triton") == ["up"], up


def test_triton_killed_is_503_at_once_then_200_after_its_restart(stack: Stack) -> None:
    body = {"json": {"text": "The central bank raised interest rates again."}}
    assert _classify(stack, CLIENT_KEY, **body).status_code == 200
    podman("kill", stack.container("triton"))
    time.sleep(1)  # the replicas' connections see the reset
    started = time.monotonic()
    refused = _classify(stack, CLIENT_KEY, **body)
    took = time.monotonic() - started
    assert refused.status_code == 503, refused.text
    print(f"503 after {took * 1000:.1f} ms")
    # at once: the breaker (or a refused connection), never the Triton call's deadline of
    # seconds; the bound leaves room for a shared 2-core machine (57 ms was seen against 50)
    assert took < 0.5, f"503 after {took * 1000:.0f} ms"
    podman("start", stack.container("triton"))
    # Each replica recovers on its own (its breaker's probe, then one trial call), so while the
    # second is still half-open a call may get its 503 after the first answered 200 (seen in
    # CI): recovered means five 200s in a row, and then it stays recovered.
    restarted = time.monotonic()
    deadline = restarted + 120
    seen: list[str] = []
    in_a_row = 0
    while in_a_row < 5 and time.monotonic() < deadline:
        answer = _classify(stack, CLIENT_KEY, **body)
        seen.append(
            f"{time.monotonic() - restarted:.1f} s: {answer.status_code} "
            f"request_id={answer.headers.get('x-request-id', '-')} {answer.text[:100]}"
        )
        in_a_row = in_a_row + 1 if answer.status_code == 200 else 0
        time.sleep(0.25)
    print(f"recovered {time.monotonic() - restarted:.1f} s after the restart")
    assert in_a_row == 5, "\n".join(seen) + _logs(stack)
    after = [_classify(stack, CLIENT_KEY, **body) for _ in range(10)]
    assert [a.status_code for a in after] == [200] * 10, (
        "\n".join(seen)
        + f"\nthen {[(a.status_code, a.headers.get('x-request-id', '-')) for a in after]}"
        + _logs(stack)
    )
