"""A private redis-server (Debian's; `make test` and `make bench-shared-state` install it) on a
loopback port, for the tests and the benchmark: started, killed (SIGKILL), paused (SIGSTOP)
and started again on the same port."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from gateway.dev.tritonserver import free_port


def redis_server_binary() -> str:
    found = shutil.which("redis-server") or "/usr/bin/redis-server"
    if not Path(found).exists():
        raise RuntimeError(
            "redis-server is not installed: `make test` installs it (apt package redis-server)"
        )
    return found


@dataclass
class RedisServer:
    folder: Path
    password: str = "s3cret-for-tests"  # loopback only
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://:{self.password}@127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        self.folder.mkdir(parents=True, exist_ok=True)
        command = [redis_server_binary(), "--port", str(self.port), "--bind", "127.0.0.1",
                   "--requirepass", self.password, "--save", "", "--appendonly", "no",
                   "--dir", str(self.folder)]  # fmt: skip
        log = (self.folder / "redis.log").open("ab")
        self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            assert self.process.poll() is None, (self.folder / "redis.log").read_text()
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as conn:
                    conn.sendall(f"AUTH {self.password}\r\nPING\r\n".encode())
                    answer = b""
                    while b"PONG" not in answer and (chunk := conn.recv(100)):
                        answer += chunk
                    if b"PONG" in answer:
                        return self
            except OSError:
                pass
            time.sleep(0.05)
        raise AssertionError("redis-server did not start")

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def pause(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
