"""One gateway process against two on the same host, in the same run (README, "Performance").

    .venv/bin/python -m gateway.bench.processes [--seconds 5] [--rounds 3]
        [--concurrency 8 32] [--scenarios text multipart] [--out .reports/processes.json]

A real tritonserver on the trivial repository, and two gateway processes in front of it.
Interleaved over rounds, the same total load (wrk connections) goes either to one gateway
process or, split in halves, to both at once (two wrk runs in parallel: what a load
balancer in front of two replicas does). Reports the combined req/s, p50/p99 (the worse
of the two halves) and CPU per request of the gateway processes and of Triton, from the
processes' own CPU time. One gateway process uses at most one core (one event loop).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from gateway.bench.side_by_side import REPOSITORIES, Scenario, _cpu_seconds, _wrk, scenarios
from gateway.dev.gatewayprocess import GatewayProcess
from gateway.dev.tritonserver import TritonServer

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Measure:
    scenario: str
    processes: int
    concurrency: int
    rps: float
    p50_ms: float
    p99_ms: float
    gateway_cpu_ms: float  # per request, all gateway processes together
    triton_cpu_ms: float
    errors: int


def measure(
    triton: TritonServer,
    gateways: list[GatewayProcess],
    scenario: Scenario,
    concurrency: int,
    seconds: float,
    folder: Path,
) -> Measure:
    assert triton.pid is not None
    share = max(1, concurrency // len(gateways))
    results: list[tuple[int, int, float, float]] = [(0, 0, 0.0, 0.0)] * len(gateways)
    gateway_before = sum(_cpu_seconds(g.process.pid, with_children=False) for g in gateways)
    triton_before = _cpu_seconds(triton.pid, with_children=True)
    started = time.perf_counter()

    def run(index: int) -> None:
        own = folder / f"wrk-{index}"
        own.mkdir(exist_ok=True)
        results[index] = _wrk(f"{gateways[index].url}/classify", scenario, share, seconds, own)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(gateways))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    requests = sum(r[0] for r in results)
    gateway_cpu = sum(_cpu_seconds(g.process.pid, with_children=False) for g in gateways) - gateway_before
    triton_cpu = _cpu_seconds(triton.pid, with_children=True) - triton_before
    return Measure(
        scenario=scenario.name,
        processes=len(gateways),
        concurrency=share * len(gateways),
        rps=requests / elapsed,
        p50_ms=max(r[2] for r in results),
        p99_ms=max(r[3] for r in results),
        gateway_cpu_ms=1000 * gateway_cpu / max(1, requests),
        triton_cpu_ms=1000 * triton_cpu / max(1, requests),
        errors=sum(r[1] for r in results),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--scenarios", nargs="+", default=["text", "multipart"])
    parser.add_argument("--out", type=Path, default=ROOT / ".reports" / "processes.json")
    parser.add_argument("--triton-env", type=Path, default=ROOT / ".venv-triton")
    options = parser.parse_args(argv)
    chosen = [s for s in scenarios() if any(s.name.startswith(n) for n in options.scenarios)]
    measures: list[Measure] = []
    with tempfile.TemporaryDirectory(prefix="bench-processes-") as name:
        folder = Path(name)
        triton = TritonServer.on_free_ports(
            options.triton_env, REPOSITORIES["trivial"], folder, response_cache_bytes=0
        )
        triton.start()
        triton.wait_ready(timeout=180)
        gateways = [
            GatewayProcess.start(triton, folder, env={"GATEWAY_TEXT_LABELS_MODEL": ""}).wait(
                "/readyz", timeout=60
            )
            for _ in range(2)
        ]
        try:
            for scenario in chosen:  # warm both
                for gateway in gateways:
                    _wrk(f"{gateway.url}/classify", scenario, 2, 1, folder)
            for _ in range(options.rounds):
                for scenario in chosen:
                    for concurrency in options.concurrency:
                        for count in (1, 2):
                            measures.append(
                                measure(
                                    triton, gateways[:count], scenario, concurrency, options.seconds, folder
                                )
                            )
        finally:
            for gateway in gateways:
                gateway.stop(graceful=True)
            triton.kill()
    rows = []
    print("| scenario | c | processes | req/s | p50 / p99 ms | gateway CPU ms/req | Triton CPU ms/req |")
    print("|---|---|---|---|---|---|---|")
    keys = sorted({(m.scenario, m.concurrency, m.processes) for m in measures})
    for scenario_name, concurrency, processes in keys:
        group = [
            m
            for m in measures
            if (m.scenario, m.concurrency, m.processes) == (scenario_name, concurrency, processes)
        ]
        row = {
            "scenario": scenario_name,
            "concurrency": concurrency,
            "processes": processes,
            **{
                key: round(statistics.median(getattr(m, key) for m in group), 2)
                for key in ("rps", "p50_ms", "p99_ms", "gateway_cpu_ms", "triton_cpu_ms")
            },
            "errors": sum(m.errors for m in group),
        }
        rows.append(row)
        print(
            f"| {scenario_name} | {concurrency} | {processes} | {row['rps']:.0f} | "
            f"{row['p50_ms']:.1f} / {row['p99_ms']:.1f} | {row['gateway_cpu_ms']:.2f} | {row['triton_cpu_ms']:.2f} |"
        )
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(
        json.dumps({"rows": rows, "measures": [asdict(m) for m in measures]}, indent=2) + "\n"
    )
    print(f"wrote {options.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
