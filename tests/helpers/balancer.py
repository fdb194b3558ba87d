"""Debian's HAProxy running the shipped deploy/haproxy/haproxy.cfg in front of real
gateway processes (each on an address of its own, as replicas are), with a DNS stub
playing Docker's DNS: what the load-balancer and shared-state tests run."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from gateway.dev.gatewayprocess import GatewayProcess
from gateway.dev.tritonserver import TritonServer, free_port, free_ports

from helpers.dnsstub import DnsStub

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "deploy" / "haproxy" / "haproxy.cfg"
REPLICAS = ("127.0.0.2", "127.0.0.3")
# What docker-compose.yml gives the gateways, bar the addresses.
REPLICA_ENV = {"GATEWAY_TRITON__METRICS_URL": "", "GATEWAY_SERVER__DRAIN_DELAY_SECONDS": "5"}


def haproxy() -> str:
    found = shutil.which("haproxy") or "/usr/sbin/haproxy"
    if not Path(found).exists():
        pytest.fail("haproxy is not installed: `make test` installs it (apt package haproxy)")
    return found


@dataclass
class Balanced:
    url: str
    replicas: list[GatewayProcess]
    dns: DnsStub
    grpc: str = ""  # the balancer's gRPC door (host:port): the replicas' when they run one


def classified(replica: GatewayProcess, headers: dict[str, str] | None = None) -> int:
    """Successful /classify answers this replica gave, from its own /metrics (``headers``:
    a key, which /metrics needs when the replica has keys)."""
    text = httpx.get(f"{replica.url}/metrics", headers=headers, timeout=5).text
    pattern = r'^gateway_requests_total\{(?=[^}]*route="/classify")(?=[^}]*status="200")[^}]*\} (\S+)$'
    return int(sum(float(value) for value in re.findall(pattern, text, re.MULTILINE)))


@contextmanager
def balanced_replicas(
    triton: TritonServer, tmp_path: Path, headers: dict[str, str] | None = None, **env: str
) -> Iterator[Balanced]:
    """Two replicas with ``env`` (GATEWAY_* settings) behind HAProxy, both seen up by it;
    ``headers`` go with the warm-up requests (an API key)."""
    port = free_port()
    replicas = [
        GatewayProcess.start(triton, tmp_path, host=host, port=port, env={**REPLICA_ENV, **env})
        for host in REPLICAS
    ]
    public, admin, grpc = free_ports(3)
    with DnsStub({"gateway": list(REPLICAS)}) as dns:
        environment = {
            **os.environ,
            "DNS_SERVER": dns.address,
            "PUBLIC_BIND": f"127.0.0.1:{public}",
            "ADMIN_BIND": f"127.0.0.1:{admin}",
            "GRPC_BIND": f"127.0.0.1:{grpc}",
            "GATEWAY_GRPC_PORT": env.get("GATEWAY_GRPC__PORT", str(port)),
            "GATEWAY_HOST": "gateway",
            "GATEWAY_PORT": str(port),
            "GATEWAY_ADMIN_PORT": str(port),
            "GATEWAY_SLOTS": "4",
        }
        log = (tmp_path / "haproxy.log").open("wb")
        balancer = subprocess.Popen(
            [haproxy(), "-db", "-f", str(CONFIG)], env=environment, stdout=log, stderr=subprocess.STDOUT
        )
        try:
            for replica in replicas:
                replica.wait("/readyz", timeout=60)
            url = f"http://127.0.0.1:{public}"
            # Until HAProxy has resolved both replicas and checked them up.
            deadline = time.monotonic() + 30
            while not all(classified(replica, headers) for replica in replicas):
                assert balancer.poll() is None, (tmp_path / "haproxy.log").read_text()
                assert time.monotonic() < deadline, (tmp_path / "haproxy.log").read_text()
                httpx.post(f"{url}/classify", json={"text": "warming up"}, headers=headers, timeout=30)
            yield Balanced(url, replicas, dns, f"127.0.0.1:{grpc}")
        finally:
            balancer.terminate()
            balancer.wait(timeout=10)
            for replica in replicas:
                replica.stop()
