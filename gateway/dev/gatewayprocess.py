"""`triton-gateway serve` as a process of its own, in front of a real Triton: what the
benchmark, the soak and the integration tests start."""

from __future__ import annotations

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
        port = port or free_port()
        log = log_dir / f"gateway-{host}-{port}.log"
        environment = {
            **os.environ,
            "GATEWAY_TRITON__URL": triton.grpc_url,
            "GATEWAY_TRITON__METRICS_URL": triton.metrics_url,
            "GATEWAY_TRITON__REPOSITORY_KEY": triton.repository_key,
            **(env or {}),
        }
        command = [sys.executable, "-m", "gateway", "serve", "--host", host, "--port", str(port)]
        with log.open("wb") as sink:
            process = subprocess.Popen(
                command, env=environment, stdout=sink, stderr=subprocess.STDOUT, cwd=cwd
            )
        return cls(process, port, log, host)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def wait(self, path: str = "/livez", timeout: float = 30.0) -> GatewayProcess:
        """Until ``path`` answers 200 (``/readyz``: Triton's models too), or raise."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the gateway exited: {self.log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{self.url}{path}", timeout=1).status_code == 200:
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
