"""A real ``tritonserver`` process on this machine, from NVIDIA's ``nvidia-pytriton`` wheel.

Used by ``triton-gateway local`` and by the integration tests. The wheel bundles a
CPU-capable tritonserver with the Python backend; it is installed in a dedicated
virtual environment that is also the environment of Triton's Python stub (the first
``python3`` on the server's PATH), which must have ``numpy<2``.

This module only manages the process: the gateway talks to it like any other Triton.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from gateway.dev.keeper import region_prefix, unlink_prefixed
from gateway.errors import ConfigurationError
from gateway.triton.client import REPOSITORY_KEY_HEADER

_LOCATE = """
import importlib.util, json, sys, sysconfig
spec = importlib.util.find_spec("pytriton")
print(json.dumps({
    "package": None if spec is None else spec.submodule_search_locations[0],
    "libdir": sysconfig.get_config_var("LIBDIR"),
    "python": f"{sys.version_info.major}.{sys.version_info.minor}",
}))
"""


def free_port(host: str = "127.0.0.1") -> int:
    return free_ports(1, host)[0]


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct free ports: each socket stays bound until all are chosen (ports
    taken one after another can come back twice: Triton once got the same port for HTTP
    and metrics and refused to start)."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind((host, 0))
        return [int(sock.getsockname()[1]) for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def _die_with_parent() -> list[str]:
    """A prefix for the command: Linux sends SIGTERM to Triton if the gateway dies first,
    so a killed gateway never leaves an orphan server holding the ports. util-linux's
    `setpriv --pdeathsig` sets it and execs the command: no Python runs between fork and
    exec (a preexec_fn there is unsafe with threads: it crashed a test process once)."""
    setpriv = shutil.which("setpriv")
    if sys.platform != "linux" or setpriv is None:
        return []
    return [setpriv, "--pdeathsig", "TERM", "--"]


# What a client of Triton must never reach without that key: model control (loading a
# model runs its code: older releases had a remote-code flaw there), shared-memory
# registration, and the trace and log settings.
RESTRICTED_PROTOCOLS = "model-repository,shared-memory,trace,logging"


def restricted_api_args(key: str) -> list[str]:
    """tritonserver flags that put its admin APIs behind ``key`` (none without a key)."""
    if not key:
        return []
    setting = f"{RESTRICTED_PROTOCOLS}:{REPOSITORY_KEY_HEADER}={key}"
    return [f"--grpc-restricted-protocol={setting}", f"--http-restricted-api={setting}"]


@dataclass(frozen=True)
class TritonInstall:
    """Where the bundled tritonserver and its pieces live inside a Python environment."""

    binary: Path
    backends: Path
    caches: Path
    stub: Path
    library_path: tuple[Path, ...]
    python_bin: Path

    @classmethod
    def locate(cls, python_env: Path) -> TritonInstall:
        """Ask the environment's interpreter where ``pytriton`` is, without importing it."""
        python = python_env / "bin" / "python"
        if not python.exists():
            raise ConfigurationError(f"no Python interpreter at {python}")
        found = subprocess.run([str(python), "-c", _LOCATE], capture_output=True, text=True, check=True)
        facts = json.loads(found.stdout)
        if facts["package"] is None:
            raise ConfigurationError(f"nvidia-pytriton is not installed in {python_env}")
        root = Path(facts["package"]) / "tritonserver"
        return cls(
            binary=root / "bin" / "tritonserver",
            backends=root / "backends",
            caches=root / "caches",
            stub=root / "python_backend_stubs" / facts["python"] / "triton_python_backend_stub",
            library_path=(Path(facts["libdir"]), Path(facts["package"]).parent / "nvidia_pytriton.libs"),
            python_bin=python.parent,
        )


@dataclass
class TritonServer:
    """One tritonserver process, listening on loopback only."""

    python_env: Path
    model_repository: Path
    workdir: Path
    grpc_port: int
    http_port: int
    metrics_port: int
    host: str = "127.0.0.1"
    model_config_name: str = "cpu"
    log_verbose: int = 0
    # Triton's response cache, for the models whose config enables it (the ensembles);
    # 0: no cache (those models then simply run every request).
    response_cache_bytes: int = 64 * 1024 * 1024
    # "explicit": models load and unload through Triton's repository API, and at start
    # only ``load_models`` (with what they compose) load; "none": everything, fixed.
    model_control_mode: str = "none"
    load_models: tuple[str, ...] = ()
    # With a key, Triton refuses its repository, shared-memory, trace and logging APIs to
    # any call without the header ``REPOSITORY_KEY_HEADER: <key>`` (the gateway sends it).
    repository_key: str = ""
    # More tritonserver flags (say gateway.observe.tracing.triton_trace_args), appended as given.
    extra_args: tuple[str, ...] = ()
    _process: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    # This server's Python-backend shared memory is /dev/shm/<shm_prefix>*: whoever clears
    # it after a kill finds it by name, made a moment ago or long before.
    shm_prefix: str = field(default_factory=lambda: region_prefix(uuid.uuid4().hex[:12]), init=False)

    @classmethod
    def on_free_ports(
        cls, python_env: Path, model_repository: Path, workdir: Path, **options: Any
    ) -> TritonServer:
        """A server for this repository on three free local ports."""
        grpc, http, metrics = free_ports(3)
        return cls(
            python_env=python_env,
            model_repository=model_repository,
            workdir=workdir,
            grpc_port=grpc,
            http_port=http,
            metrics_port=metrics,
            **options,
        )

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{self.host}:{self.metrics_port}/metrics"

    @property
    def log_file(self) -> Path:
        return self.workdir / "tritonserver.log"

    def _prepare(self, install: TritonInstall) -> Path:
        """Backends dir with the Python stub for this interpreter placed beside the backend."""
        backends = self.workdir / "backends"
        if backends.exists():
            shutil.rmtree(backends)
        shutil.copytree(install.backends, backends)
        shutil.copy2(install.stub, backends / "python" / install.stub.name)
        return backends

    def start(self) -> None:
        install = TritonInstall.locate(self.python_env)
        self.workdir.mkdir(parents=True, exist_ok=True)
        backends = self._prepare(install)
        env = dict(os.environ)
        # The stub runs the first python3 on PATH: make it the Triton environment's.
        env["PATH"] = f"{install.python_bin}{os.pathsep}{env.get('PATH', '')}"
        library_path = [str(p) for p in install.library_path]
        if env.get("LD_LIBRARY_PATH"):
            library_path.append(env["LD_LIBRARY_PATH"])
        env["LD_LIBRARY_PATH"] = os.pathsep.join(library_path)
        command = [
            str(install.binary),
            f"--model-repository={self.model_repository.resolve()}",
            f"--backend-directory={backends}",
            f"--cache-directory={install.caches}",
            f"--model-config-name={self.model_config_name}",
            f"--grpc-address={self.host}",
            f"--grpc-port={self.grpc_port}",
            f"--http-address={self.host}",
            f"--http-port={self.http_port}",
            f"--metrics-address={self.host}",
            f"--metrics-port={self.metrics_port}",
            "--allow-metrics=true",
            "--allow-cpu-metrics=true",
            f"--model-control-mode={self.model_control_mode}",
            *(f"--load-model={name}" for name in self.load_models),
            *restricted_api_args(self.repository_key),
            "--exit-timeout-secs=5",
            f"--log-verbose={self.log_verbose}",
            f"--backend-config=python,shm-region-prefix-name={self.shm_prefix}",
        ]
        if self.response_cache_bytes > 0:
            command.append(f"--cache-config=local,size={self.response_cache_bytes}")
        command.extend(self.extra_args)
        log = self.log_file.open("ab")
        self.pid_file.unlink(missing_ok=True)
        # Triton runs under its keeper (gateway.dev.keeper): whatever Triton starts goes
        # when Triton goes or when this process goes, SIGKILL included.
        keeper = [sys.executable, "-m", "gateway.dev.keeper", str(self.pid_file), self.shm_prefix, "--"]
        self._process = subprocess.Popen(
            [*_die_with_parent(), *keeper, *command],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Block until Triton says it is ready (all models loaded), or raise."""
        deadline = time.monotonic() + timeout
        url = f"http://{self.host}:{self.http_port}/v2/health/ready"
        while time.monotonic() < deadline:
            if self._process is None or self._process.poll() is not None:
                raise ConfigurationError(
                    f"tritonserver exited during start-up; the end of {self.log_file}:\n{self.log_tail()}"
                )
            try:
                if httpx.get(url, timeout=1.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise ConfigurationError(
            f"tritonserver not ready after {timeout:.0f} s; the end of {self.log_file}:\n{self.log_tail()}"
        )

    def log_tail(self, lines: int = 15) -> str:
        """The last lines of Triton's log (what an error message shows of it)."""
        try:
            text = self.log_file.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    @property
    def pid_file(self) -> Path:
        return self.workdir / "tritonserver.pid"

    def _server_pid(self, timeout: float = 10.0) -> int:
        """tritonserver's own PID (the keeper writes it once it has started it)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return int(self.pid_file.read_text())
            except (OSError, ValueError):
                if time.monotonic() > deadline:
                    raise ConfigurationError(
                        f"tritonserver's PID never appeared in {self.pid_file}"
                    ) from None
                time.sleep(0.05)

    @property
    def process_group(self) -> int | None:
        """The process group of the server, its keeper and its stubs (None: not running)."""
        return None if self._process is None else self._process.pid

    def send_signal(self, sig: int, *, group: bool = True) -> None:
        """Signal the server, its keeper and its Python-backend stubs (their process
        group), or with ``group=False`` the server alone: tests use SIGKILL of both (a
        crash, which must not leave stubs behind), and SIGSTOP/SIGCONT of the server (a
        hung Triton)."""
        if self._process is None:
            return
        if group:
            os.killpg(self._process.pid, sig)
        else:
            os.kill(self._server_pid(), sig)

    def kill(self) -> None:
        """Stop at once: SIGKILL to the server, its keeper and its stubs, their shared
        memory cleared, the ports free on return. For harnesses (tests, benchmarks) done
        with a server that has nothing in flight: :meth:`stop` unloads each model and Triton
        polls for that every second, 3-5 s for the shipped repository."""
        if self.running:
            self.send_signal(signal.SIGKILL)
        self.wait_exited()

    def wait_exited(self, timeout: float = 30.0) -> None:
        """After SIGKILL: wait for the PID to exit (its ports are free after), forget it,
        and remove its shared memory (the keeper, killed too, could not)."""
        if self._process is not None:
            self._process.wait(timeout=timeout)
            self._process = None
        unlink_prefixed(self.shm_prefix)

    @property
    def pid(self) -> int | None:
        """The server's own PID (its stubs are its children), while it runs."""
        return self._server_pid() if self.running else None

    @property
    def exit_code(self) -> int | None:
        """How the server (its keeper) ended: None while it runs; 128 + signal when killed."""
        return None if self._process is None else self._process.poll()

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def stop(self, timeout: float = 15.0) -> None:
        """SIGINT to the keeper (Triton stops gracefully, then the keeper clears what is
        left), wait for it to exit (the ports are free after), SIGKILL of all if it hangs."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            unlink_prefixed(self.shm_prefix)


@contextmanager
def throttled(triton: TritonServer, running: float = 0.004, stopped: float = 0.016) -> Iterator[None]:
    """Triton's process group (server, keeper, Python-backend stubs) runs ``running``
    seconds of every ``running + stopped``: the defaults make it 5x slower. The cycle
    runs in a process of its own (gateway.dev.throttle): a thread of this one kept
    the time badly while a load generator here held the interpreter."""
    group = triton.process_group
    if group is None:
        raise ConfigurationError("tritonserver is not running")
    cycler = subprocess.Popen(
        [sys.executable, "-m", "gateway.dev.throttle", str(group), str(running), str(stopped)],
        start_new_session=True,
    )
    try:
        yield
    finally:
        cycler.terminate()
        try:
            cycler.wait(timeout=5)
        except subprocess.TimeoutExpired:
            cycler.kill()
            cycler.wait()
        triton.send_signal(signal.SIGCONT)
