"""`triton-gateway serve` as a process of its own, in front of a real Triton: what the
benchmark, the soak and the integration tests start."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx

from gateway.dev.tritonserver import TritonServer, free_port


@dataclass
class GatewayProcess:
    """`triton-gateway serve` as its own process (signals, CPU and sockets of its own), in
    front of a real Triton; used by the fixtures, the soak and the benchmark."""

    process: subprocess.Popen[bytes]
    port: int
    log: Path
    host: str = "127.0.0.1"
    # how it was started, to start it again on another port if its own was taken meanwhile
    # (None: started by the caller, on a port the caller chose)
    restart: tuple[Path | None, dict[str, str]] | None = None

    @classmethod
    def start(
        cls,
        triton: TritonServer,
        log_dir: Path,
        host: str = "127.0.0.1",
        port: int = 0,
        cwd: Path | None = None,
        env: Mapping[str, str] | None = None,
    ) -> GatewayProcess:
        """Start it with GATEWAY_* settings ``env``; its output goes to a log in ``log_dir``.
        It listens on ``host`` and ``port`` (a free one by default). ``cwd`` outside a
        checkout lets a PYTHONPATH in ``env`` choose the code (`-m` puts the working
        directory first on the path)."""
        chosen = port or free_port()
        log = log_dir / f"gateway-{host}-{chosen}.log"
        environment = environment_for(triton, env)
        process = _spawn(host, chosen, environment, cwd, log)
        return cls(process, chosen, log, host, None if port else (cwd, environment))

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def wait(self, path: str = "/livez", timeout: float = 30.0) -> GatewayProcess:
        """Until ``path`` answers 200 (``/readyz``: Triton's models too), or raise."""
        deadline = time.monotonic() + timeout
        restarts = 3
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                output = self.log.read_text()
                if self.restart is not None and restarts and "Address already in use" in output[-500:]:
                    # its port, free when chosen, was taken before it bound it (by another
                    # test's process on the same machine): again, on another
                    restarts -= 1
                    self.port = free_port()
                    self.process = _spawn(self.host, self.port, self.restart[1], self.restart[0], self.log)
                    continue
                raise RuntimeError(f"the gateway exited: {output[-3000:]}")
            try:
                # (only its own listener's answer: another process on the port is not it)
                if httpx.get(f"{self.url}{path}", timeout=1).status_code == 200 and _listens(
                    self.process.pid, self.port
                ):
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise RuntimeError(
            f"{path} did not answer 200 within {timeout:.0f} s: {self.log.read_text()[-3000:]}"
        )

    def stop(self, graceful: bool = False) -> None:
        """SIGKILL (or SIGTERM and its drain, with ``graceful``) and wait for the exit."""
        if self.process.poll() is None:
            if graceful:
                self.process.terminate()
            else:
                self.process.kill()
            self.process.wait(timeout=60)


def environment_for(triton: TritonServer, env: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment, with what points a gateway at ``triton``, then ``env``."""
    return {
        **os.environ,
        "GATEWAY_TRITON__URL": triton.grpc_url,
        "GATEWAY_TRITON__METRICS_URL": triton.metrics_url,
        "GATEWAY_TRITON__REPOSITORY_KEY": triton.repository_key,
        **(env or {}),
    }


def _spawn(
    host: str, port: int, environment: dict[str, str], cwd: Path | None, log: Path
) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "gateway", "serve", "--host", host, "--port", str(port)]
    with log.open("ab") as sink:
        return subprocess.Popen(command, env=environment, stdout=sink, stderr=subprocess.STDOUT, cwd=cwd)


def _listens(pid: int, port: int) -> bool:
    """Whether process ``pid`` (or a worker it started) holds the socket listening on TCP
    ``port``."""
    import psutil  # (a dev dependency, as this module is: the benchmarks and the tests)

    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.Error:
        return False
    for process in processes:
        with contextlib.suppress(psutil.Error):
            for connection in process.net_connections(kind="tcp"):
                if connection.status == psutil.CONN_LISTEN and connection.laddr.port == port:
                    return True
    return False
