"""Soak: mixed traffic at ~80 % of the measured capacity, through a real gateway process
in front of a real Triton, sampling the gateway's RSS, open file descriptors and metric
series (and Triton's RSS with its stubs) as it goes.

    make soak                                  # 5 minutes, the figures in the README
    .venv/bin/python tests/helpers/soak.py --seconds 60 --json soak.json

It exits 1 on a problem: a 5xx or a dropped connection, more than 1 % of requests shed
(503 at 80 % load), descriptors or metric series that keep growing after the warm-up, or an
RSS drift over the limit. `make test` runs a 30 s version (tests/integration/test_soak.py).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import psutil
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: tests/ holds helpers
from gateway.dev.gatewayprocess import GatewayProcess
from gateway.dev.tritonserver import TritonServer

from helpers.support import chelsea_jpeg, coffee_png, small_png

ROOT = Path(__file__).resolve().parents[2]
Send = Callable[[httpx.AsyncClient], Awaitable[httpx.Response]]


def traffic() -> list[tuple[str, int, Send]]:
    """(kind, weight, request): what a mixed production day looks like, bad input included."""
    jpeg, png = chelsea_jpeg(), coffee_png()
    encoded = base64.b64encode(small_png(64, 64)).decode()
    sentences = [
        "The striker scored twice in the final.",
        "Whisk the eggs with sugar until pale, then fold in the flour.",
        "Parliament passed the budget after a long night of debate.",
        "The new phone has a faster chip and a brighter screen.",
    ]
    return [
        ("jpeg multipart", 25, lambda c: c.post("/classify", files={"file": ("cat.jpg", jpeg)})),
        ("png raw", 15, lambda c: c.post("/classify", content=png, headers={"content-type": "image/png"})),
        ("base64 json", 10, lambda c: c.post("/classify", json={"image": encoded, "top_k": 3})),
        ("text", 25, lambda c: c.post("/classify", json={"text": random.choice(sentences)})),
        ("texts", 10, lambda c: c.post("/classify", json={"texts": sentences})),
        (
            "candidate labels",
            5,
            lambda c: c.post(
                "/classify", json={"text": sentences[1], "candidate_labels": ["cooking", "sport"]}
            ),
        ),
        (
            "bad image",
            5,
            lambda c: c.post("/classify", content=b"not an image", headers={"content-type": "image/jpeg"}),
        ),
        ("too many texts", 5, lambda c: c.post("/classify", json={"texts": ["a"] * 10_000})),
    ]


@dataclass
class Sample:
    second: float
    gateway_rss_mib: float
    gateway_fds: int
    gateway_threads: int
    series: int
    triton_rss_mib: float


@dataclass
class SoakReport:
    capacity_rps: float
    load: float  # the fraction of capacity offered
    seconds: float
    warmup_seconds: float
    statuses: dict[str, dict[int, int]] = field(default_factory=dict)
    transport_errors: int = 0
    late: int = 0  # requests not sent on time: the generator (or the gateway) fell behind
    latencies_ms: dict[str, float] = field(default_factory=dict)
    samples: list[Sample] = field(default_factory=list)

    @property
    def target_rps(self) -> float:
        return self.load * self.capacity_rps

    def _steady(self) -> list[Sample]:
        return [s for s in self.samples if s.second >= self.warmup_seconds]

    def drift(self, attribute: str) -> float:
        """Last third minus first third of the samples after the warm-up (median of each)."""
        steady = self._steady()
        third = max(1, len(steady) // 3)
        first = statistics.median(getattr(s, attribute) for s in steady[:third])
        last = statistics.median(getattr(s, attribute) for s in steady[-third:])
        return float(last - first)

    def total(self, status: int | None = None) -> int:
        return sum(n for counts in self.statuses.values() for s, n in counts.items() if status in (None, s))

    def problems(self, max_rss_drift_mib: float, max_series_growth: int = 0) -> list[str]:
        """What went wrong. ``max_series_growth`` tolerates a few new label values (say the
        first 503 of a route adds its counter series); a label copied from requests grows by
        hundreds."""
        found = []
        server_errors = sum(n for c in self.statuses.values() for s, n in c.items() if s >= 500 and s != 503)
        if server_errors or self.transport_errors:
            found.append(f"{server_errors} 5xx answers and {self.transport_errors} dropped connections")
        if self.total(503) > 0.01 * self.total():
            found.append(
                f"{self.total(503)} of {self.total()} requests shed with 503 at {self.load:.0%} load"
            )
        if self.drift("gateway_fds") > 8:
            found.append(f"open descriptors grew by {self.drift('gateway_fds'):.0f}")
        if self.drift("series") > max_series_growth:
            found.append(f"metric series grew by {self.drift('series'):.0f} after the warm-up")
        if self.drift("gateway_rss_mib") > max_rss_drift_mib:
            found.append(f"gateway RSS grew by {self.drift('gateway_rss_mib'):.1f} MiB")
        return found

    def summary(self) -> str:
        steady = self._steady()
        lines = [
            f"soak: {self.seconds:.0f} s at {self.target_rps:.1f} req/s "
            f"({self.load:.0%} of a measured {self.capacity_rps:.1f} req/s), {self.total()} requests, {self.late} sent late",
            f"gateway RSS {steady[0].gateway_rss_mib:.1f} -> {steady[-1].gateway_rss_mib:.1f} MiB "
            f"(drift {self.drift('gateway_rss_mib'):+.1f} MiB), descriptors {steady[0].gateway_fds} -> "
            f"{steady[-1].gateway_fds}, threads {steady[0].gateway_threads} -> {steady[-1].gateway_threads}, "
            f"metric series {steady[0].series} -> {steady[-1].series}",
            f"Triton RSS (with stubs) {steady[0].triton_rss_mib:.1f} -> {steady[-1].triton_rss_mib:.1f} MiB "
            f"(drift {self.drift('triton_rss_mib'):+.1f} MiB)",
            f"errors: {self.transport_errors} dropped connections; latency p50 {self.latencies_ms['p50']:.0f} ms, "
            f"p99 {self.latencies_ms['p99']:.0f} ms",
        ]
        for kind, counts in self.statuses.items():
            lines.append(f"  {kind}: " + ", ".join(f"{status} x{n}" for status, n in sorted(counts.items())))
        return "\n".join(lines)


def _rss_mib(pid: int, with_children: bool = False) -> float:
    process = psutil.Process(pid)
    members = [process, *process.children(recursive=True)] if with_children else [process]
    return sum(p.memory_info().rss for p in members) / 2**20


def _series(text: str) -> int:
    return sum(len(family.samples) for family in text_string_to_metric_families(text))


async def _capacity(url: str, kinds: list[tuple[str, int, Send]], seconds: float) -> float:
    """Closed-loop throughput of the same mix with 8 clients: what the stack can do here."""
    done = 0
    until = time.monotonic() + seconds
    weights = [weight for _, weight, _ in kinds]

    async def client(http: httpx.AsyncClient) -> None:
        nonlocal done
        while time.monotonic() < until:
            _, _, send = random.choices(kinds, weights)[0]
            await send(http)
            done += 1

    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        await asyncio.gather(*(client(http) for _ in range(8)))
    return done / seconds


async def _soak(url: str, gateway_pid: int, triton_pid: int, report: SoakReport) -> None:
    kinds = traffic()
    weights = [weight for _, weight, _ in kinds]
    latencies: list[float] = []
    started = time.monotonic()
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)

    async def one(http: httpx.AsyncClient, kind: str, send: Send) -> None:
        sent = time.monotonic()
        try:
            response = await send(http)
        except httpx.TransportError:
            report.transport_errors += 1
            return
        latencies.append(time.monotonic() - sent)
        counts = report.statuses.setdefault(kind, {})
        counts[response.status_code] = counts.get(response.status_code, 0) + 1

    async def sampler(http: httpx.AsyncClient) -> None:
        while True:
            metrics = (await http.get("/metrics")).text
            report.samples.append(
                Sample(
                    second=time.monotonic() - started,
                    gateway_rss_mib=_rss_mib(gateway_pid),
                    gateway_fds=psutil.Process(gateway_pid).num_fds(),
                    gateway_threads=psutil.Process(gateway_pid).num_threads(),
                    series=_series(metrics),
                    triton_rss_mib=_rss_mib(triton_pid, with_children=True),
                )
            )
            await asyncio.sleep(2.0)

    async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as http:
        watcher = asyncio.create_task(sampler(http))
        pending: set[asyncio.Task[None]] = set()
        index = 0
        while (now := time.monotonic() - started) < report.seconds:
            due = index / report.target_rps
            if due > now:
                await asyncio.sleep(due - now)
            elif now - due > 1.0:
                report.late += 1  # more than a second behind schedule
            kind, _, send = random.choices(kinds, weights)[0]
            task = asyncio.create_task(one(http, kind, send))
            pending.add(task)
            task.add_done_callback(pending.discard)
            index += 1
        await asyncio.gather(*pending)
        watcher.cancel()
    latencies.sort()
    report.latencies_ms = {
        "p50": 1000 * latencies[len(latencies) // 2],
        "p99": 1000 * latencies[int(len(latencies) * 0.99)],
    }


def run_soak(
    triton: TritonServer, seconds: float, warmup: float, workdir: Path, load: float = 0.8, **env: str
) -> SoakReport:
    """Start a gateway process in front of ``triton``, measure capacity, then soak it at
    ``load`` times that."""
    gateway = GatewayProcess.start(triton, workdir, env=env)
    try:
        gateway.wait("/readyz")
        kinds = traffic()
        capacity = asyncio.run(_capacity(gateway.url, kinds, seconds=min(10.0, max(5.0, seconds / 10))))
        report = SoakReport(capacity, load, seconds, warmup)
        assert triton.pid is not None
        asyncio.run(_soak(gateway.url, gateway.process.pid, triton.pid, report))
        return report
    finally:
        gateway.stop(graceful=True)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--warmup", type=float, default=30.0, help="seconds before drift is measured")
    parser.add_argument("--max-rss-drift-mib", type=float, default=32.0)
    parser.add_argument("--json", type=Path, help="write the report (with every sample) here")
    parser.add_argument("--triton-env", type=Path, default=ROOT / ".venv-triton")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="soak-") as folder:
        workdir = Path(folder)
        triton = TritonServer.on_free_ports(
            options.triton_env,
            ROOT / "model_repository",
            workdir,
            response_cache_bytes=0,  # every request does the models' work
        )
        triton.start()
        try:
            triton.wait_ready(timeout=180)
            report = run_soak(triton, options.seconds, options.warmup, workdir)
        finally:
            triton.kill()
    print(report.summary())
    if options.json:
        options.json.write_text(json.dumps(asdict(report), indent=2))
    problems = report.problems(options.max_rss_drift_mib)
    for problem in problems:
        print(f"PROBLEM: {problem}")
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
