"""`triton-gateway local`: one command brings up Triton and the gateway, and takes both down."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import tritonclient.grpc as tritongrpc

from gateway.dev.tritonserver import TritonServer, free_port, free_ports
from gateway.shared.keyfiles import hash_key

from helpers.support import chelsea_jpeg, processes_under

CATS = {"tiger cat", "tabby", "Egyptian cat"}


def _health(port: int) -> str:
    """What the gRPC health service (Kubernetes' gRPC probe) says of the server."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        answer = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=""), timeout=5
        )
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status))


def _readme_image() -> Path:
    """The file the README's first curl uploads (``curl -F file=@<path> ...``), in the clone."""
    import re

    root = Path(__file__).resolve().parents[2]
    found = re.search(r"curl -F file=@(\S+) localhost:8080/classify", (root / "README.md").read_text())
    assert found, "the README's first curl is not an image upload any more"
    path = root / found.group(1)
    assert path.is_file(), f"the README's first curl uploads {found.group(1)}, which the clone lacks"
    return path


def _tritonservers_in(workdir: Path) -> list[int]:
    """PIDs of tritonserver processes using this workdir (its backends dir is only on their command line)."""
    text = f"--backend-directory={workdir / 'backends'}"
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
            except OSError:
                continue
            # the server itself (its keeper carries the same arguments after its own)
            if argv[0].endswith("tritonserver") and text in argv:
                found.append(int(entry.name))
    return found


def test_local_command_serves_and_shuts_down_cleanly(
    tmp_path: Path, triton_python_env: Path, model_repository: Path
) -> None:
    port, admin_port, grpc_port = free_ports(3)
    workdir = tmp_path / "local-triton"
    keys = tmp_path / "admin-keys"
    keys.write_text(f"ops {hash_key('ops-secret')}\n")
    # make run with the admin surface on a port of its own (README "Model control")
    environment = {
        **os.environ,
        "GATEWAY_ADMIN__KEYS_FILE": str(keys),
        "GATEWAY_ADMIN__PORT": str(admin_port),
        # a load balancer's time to take the replica out (local ignored it once)
        "GATEWAY_SERVER__DRAIN_DELAY_SECONDS": "5",
        # the gRPC door, with no API keys: on local's loopback address, as the HTTP port
        # (it once bound 0.0.0.0, and local refused to start open to anyone)
        "GATEWAY_GRPC__PORT": str(grpc_port),
    }
    command = [
        sys.executable, "-m", "gateway", "local",
        "--port", str(port),
        "--triton-env", str(triton_python_env),
        "--model-repository", str(model_repository),
        "--workdir", str(workdir),
    ]  # fmt: skip
    log = (tmp_path / "local.log").open("wb")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=environment)
    try:
        deadline = time.monotonic() + 180
        ready = None
        while time.monotonic() < deadline and process.poll() is None:
            try:
                ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2)
                if ready.status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        assert ready is not None, (tmp_path / "local.log").read_text()
        assert ready.status_code == 200, (tmp_path / "local.log").read_text()
        # The banner follows uvicorn's start by up to one poll; /readyz may answer first.
        banner = f"docs http://localhost:{port}/docs"
        deadline = time.monotonic() + 10
        while banner not in (tmp_path / "local.log").read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert banner in (tmp_path / "local.log").read_text()

        # the README's first curl, with the image it names (shipped in the clone)
        photo = _readme_image()
        response = httpx.post(
            f"http://127.0.0.1:{port}/classify", files={"file": (photo.name, photo.read_bytes())}, timeout=60
        )
        assert response.json()["results"][0]["predictions"][0]["label"] in CATS
        assert _tritonservers_in(workdir), "tritonserver should be running"

        # Triton runs in explicit mode behind a key made for this run, which the gateway holds:
        admin = httpx.get(
            f"http://127.0.0.1:{admin_port}/admin/repository",
            headers={"X-API-Key": "ops-secret"},
            timeout=30,
        )
        assert admin.status_code == 200, admin.text
        assert {m["state"] for m in admin.json()["models"]} == {"READY"}
        assert "model control: /admin on 127.0.0.1:" in (tmp_path / "local.log").read_text()
        assert httpx.get(f"http://127.0.0.1:{port}/admin/repository", timeout=10).status_code == 404

        door = tritongrpc.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        assert door.is_server_ready()
        assert _health(grpc_port) == "SERVING"

        process.send_signal(signal.SIGTERM)
        # During the drain delay every door's readiness says no while requests are still served.
        deadline = time.monotonic() + 2
        while httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).status_code != 503:
            assert time.monotonic() < deadline, "/readyz did not turn 503 at SIGTERM"
            time.sleep(0.05)
        assert httpx.get(f"http://127.0.0.1:{port}/v2/health/ready", timeout=5).status_code == 503
        assert not door.is_server_ready()
        deadline = time.monotonic() + 3  # the health service reads readiness every 2 s
        while _health(grpc_port) != "NOT_SERVING":
            assert time.monotonic() < deadline, "gRPC health still SERVING while draining"
            time.sleep(0.1)
        served = httpx.post(
            f"http://127.0.0.1:{port}/classify", files={"file": ("cat.jpg", chelsea_jpeg())}, timeout=60
        )
        assert served.status_code == 200, served.text
        assert process.wait(timeout=60) == 0
        assert _tritonservers_in(workdir) == [], "tritonserver must exit with the gateway"
        assert "stopping tritonserver" in (tmp_path / "local.log").read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        log.close()


def _stubs(processes: dict[int, str]) -> dict[int, str]:
    return {pid: command for pid, command in processes.items() if "triton_python_backend_stub" in command}


def _shm_regions(processes: dict[int, str]) -> set[str]:
    return {word for command in processes.values() for word in command.split()
            if word.startswith("triton_python_backend_shm_region_")}  # fmt: skip


def _gone(workdir: Path, seconds: float) -> dict[int, str]:
    deadline = time.monotonic() + seconds
    while (left := processes_under(workdir)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def _local(
    workdir: Path, triton_python_env: Path, model_repository: Path, log: Path
) -> subprocess.Popen[bytes]:
    command = [
        sys.executable, "-m", "gateway", "local",
        "--port", str(free_port()),
        "--triton-env", str(triton_python_env),
        "--model-repository", str(model_repository),
        "--workdir", str(workdir),
    ]  # fmt: skip
    with log.open("wb") as sink:
        return subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)


def test_a_launcher_killed_while_models_load_leaves_nothing_behind(
    tmp_path: Path, triton_python_env: Path, model_repository: Path
) -> None:
    """SIGKILL (no cleanup code runs in the launcher) as soon as the first Python-backend
    stub runs: every process of the workdir goes, stubs included, and so does their shared
    memory. (Before the keeper, 1 to 4 stubs outlived such a kill, parented to init.)"""
    workdir = tmp_path / "orphan-check"
    process = _local(workdir, triton_python_env, model_repository, tmp_path / "local.log")
    try:
        deadline = time.monotonic() + 120
        seen = processes_under(workdir)
        # a stub whose command line already names its shared-memory region: one caught
        # between its fork and its exec shows its parent's (seen twice in the suite)
        while not _shm_regions(_stubs(seen)) and time.monotonic() < deadline:
            time.sleep(0.05)
            seen = processes_under(workdir)
        assert _stubs(seen), "no Python-backend stub ever started"
    finally:
        process.kill()
        process.wait()
    left = _gone(workdir, 30)
    assert left == {}, left
    regions = _shm_regions(seen)
    assert regions
    assert not [name for name in regions if (Path("/dev/shm") / name).exists()]


def test_a_triton_killed_under_the_launcher_is_reaped_said_and_cleared(
    tmp_path: Path, triton_python_env: Path, model_repository: Path
) -> None:
    """SIGKILL of tritonserver alone (an OOM kill, a crash) under a running launcher: its
    stubs and their shared memory go, the launcher says so and exits 1 (the documented
    rule). (Before: eight stubs lived on holding 1.2 GiB, Triton a zombie, the gateway up.)"""
    workdir = tmp_path / "crash-check"
    log = tmp_path / "local.log"
    process = _local(workdir, triton_python_env, model_repository, log)
    try:
        deadline = time.monotonic() + 180
        while "ready: API" not in log.read_text() and time.monotonic() < deadline:
            assert process.poll() is None, log.read_text()[-3000:]
            time.sleep(0.2)
        assert "ready: API" in log.read_text(), log.read_text()[-3000:]
        running = processes_under(workdir)
        assert len(_stubs(running)) >= 8, running  # every Python-backend model loaded
        (server,) = _tritonservers_in(workdir)
        os.kill(server, signal.SIGKILL)
        assert process.wait(timeout=60) == 1
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert "tritonserver exited unexpectedly (killed by SIGKILL)" in log.read_text()
    left = _gone(workdir, 15)
    assert left == {}, left
    assert not [name for name in _shm_regions(running) if (Path("/dev/shm") / name).exists()]


def test_killed_gateway_takes_triton_down(
    tmp_path: Path, triton_python_env: Path, model_repository: Path
) -> None:
    """Even SIGKILL (no cleanup code runs) must not leave an orphan tritonserver."""
    workdir = tmp_path / "orphan-check"
    command = [
        sys.executable, "-m", "gateway", "local",
        "--port", str(free_port()),
        "--triton-env", str(triton_python_env),
        "--model-repository", str(model_repository),
        "--workdir", str(workdir),
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not _tritonservers_in(workdir) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _tritonservers_in(workdir), "tritonserver never started"
    finally:
        process.kill()
        process.wait()
    deadline = time.monotonic() + 30
    while _tritonservers_in(workdir) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _tritonservers_in(workdir) == []


def test_a_triton_killed_the_moment_its_first_region_appears_leaves_no_shared_memory(
    tmp_path: Path, triton_python_env: Path, model_repository: Path
) -> None:
    """SIGKILL of Triton, its keeper and its stubs as soon as Triton has made its first
    Python-backend region, before that stub runs: nothing of this server stays in
    /dev/shm. (Before, the regions were read off the stubs' command lines, and a stub
    forked but not yet exec'd carries Triton's: 5 kills out of 5 left 1 to 4 regions.)"""
    for attempt in range(3):
        server = TritonServer.on_free_ports(triton_python_env, model_repository, tmp_path / f"kill-{attempt}")
        ours = Path("/dev/shm").glob  # this server's regions only: other Tritons run beside it
        server.start()
        try:
            deadline = time.monotonic() + 60
            while not list(ours(f"{server.shm_prefix}*")) and time.monotonic() < deadline:
                time.sleep(0.001)
            assert list(ours(f"{server.shm_prefix}*")), "Triton made no shared-memory region"
        finally:
            server.kill()
        assert not list(ours(f"{server.shm_prefix}*")), f"attempt {attempt}"
