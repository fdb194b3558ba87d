"""The compose stack's load balancer, for real: Debian's HAProxy runs
deploy/haproxy/haproxy.cfg in front of two real gateway processes (each on an address of
its own, as replicas are) and a real Triton. Docker's DNS is played by a DNS stub that
answers the service name with both addresses."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from dnsstub import DnsStub
from load import LoadResult, run_load
from support import GatewayProcess, chelsea_jpeg

from gateway.tritonserver import TritonServer, free_port

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


def classified(replica: GatewayProcess) -> int:
    """Successful /classify answers this replica gave, from its own /metrics."""
    text = httpx.get(f"{replica.url}/metrics", timeout=5).text
    pattern = r'^gateway_requests_total\{(?=[^}]*route="/classify")(?=[^}]*status="200")[^}]*\} (\S+)$'
    return int(sum(float(value) for value in re.findall(pattern, text, re.MULTILINE)))


@pytest.fixture
def balanced(triton: TritonServer, tmp_path: Path) -> Iterator[Balanced]:
    port = free_port()
    replicas = [
        GatewayProcess.start(triton, tmp_path, host=host, port=port, **REPLICA_ENV) for host in REPLICAS
    ]
    public, admin = free_port(), free_port()
    with DnsStub({"gateway": list(REPLICAS)}) as dns:
        environment = {
            **os.environ,
            "DNS_SERVER": dns.address,
            "PUBLIC_BIND": f"127.0.0.1:{public}",
            "ADMIN_BIND": f"127.0.0.1:{admin}",
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
            while not all(classified(replica) for replica in replicas):
                assert balancer.poll() is None, (tmp_path / "haproxy.log").read_text()
                assert time.monotonic() < deadline, (tmp_path / "haproxy.log").read_text()
                httpx.post(f"{url}/classify", json={"text": "warming up"}, timeout=30)
            yield Balanced(url, replicas, dns)
        finally:
            balancer.terminate()
            balancer.wait(timeout=10)
            for replica in replicas:
                replica.stop()


def test_the_balancer_spreads_requests_over_every_replica(balanced: Balanced) -> None:
    before = [classified(replica) for replica in balanced.replicas]
    with httpx.Client(base_url=balanced.url, timeout=30) as client:
        statuses = [
            client.post("/classify", json={"text": f"The match ended {i} to nil."}).status_code
            for i in range(40)
        ]
    assert statuses == [200] * 40
    served = [classified(replica) - then for replica, then in zip(balanced.replicas, before, strict=True)]
    assert sum(served) == 40, served  # each answer from exactly one replica
    assert min(served) >= 5, f"one replica got almost nothing: {served}"
    # Triton's metrics are scraped from Triton itself, not merged by each replica
    metrics = httpx.get(f"{balanced.replicas[0].url}/metrics", timeout=5).text
    assert "nv_inference_request_success" not in metrics
    assert "gateway_triton_metrics_up" not in metrics


def send_mixed(client: httpx.AsyncClient) -> object:
    # An image body is larger than HAProxy's buffer, so it cannot be retried elsewhere.
    if time.monotonic_ns() % 2:
        return client.post("/classify", files={"file": ("cat.jpg", chelsea_jpeg(), "image/jpeg")})
    return client.post("/classify", json={"text": "Whisk the eggs and fold in the flour."})


def test_a_replica_leaving_on_sigterm_loses_no_request(balanced: Balanced) -> None:
    leaving, staying = balanced.replicas
    result: list[LoadResult] = []
    load = threading.Thread(target=lambda: result.append(run_load(balanced.url, send_mixed, 4, 12.0)))
    load.start()
    time.sleep(2.0)
    served_before = classified(staying)
    leaving.process.send_signal(signal.SIGTERM)
    code = leaving.process.wait(timeout=40)
    load.join(timeout=60)
    statuses = result[0].statuses()
    print(f"one of two replicas left under load: answers {statuses}")
    assert code in (0, -signal.SIGTERM), code  # uvicorn re-raises the signal it drained on
    log = leaving.log.read_text()
    assert "leaving: /readyz is 503" in log
    assert "draining" in log
    assert statuses == {200: statuses.get(200, 0)}, f"a request failed while a replica left: {statuses}"
    assert classified(staying) > served_before
    assert statuses[200] > 40
