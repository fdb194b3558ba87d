"""Placement across two Tritons, one of them 5x slower (its process group stopped 16 ms of
every 20): one gateway in front of both, calls placed by shortest queue and by
round-robin, against the two each behind a gateway of its own, loaded at once.

Each round, interleaved: a flood (``--clients`` connections sending back to back, split
evenly when the two are apart; fewer than the in-flight cap, so nothing is refused and
the placement alone is measured), then half of what the two served apart, paced, on the
fast one alone and on the two placed. Rows are medians over the rounds, with their spread.

The verdicts are issue 54's: shortest-queue's flood goodput at least 90 % of the two
apart; its p99 at half load within 1.5x the fast one's alone at that load.

    python -m gateway.bench.placement --out .reports/placement   (make bench-placement)
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gateway.bench.capacity import hey
from gateway.bench.quantiles import percentile
from gateway.bench.side_by_side import REPOSITORIES
from gateway.dev.gatewayprocess import GatewayProcess
from gateway.dev.tritonserver import TritonServer, throttled

STEADY_AFTER = 2.0  # seconds: the placement learns each replica's call time in the first calls
FLOOD = ("apart", "shortest queue", "round robin")
HALF = ("fast alone", "shortest queue", "round robin")


@dataclass(frozen=True)
class Measured:
    """One load on one configuration."""

    goodput: float
    p50_ms: float
    p99_ms: float
    statuses: dict[str, int]


@dataclass
class Report:
    """Every measurement, their medians and the verdicts."""

    rounds: int
    seconds: float
    clients: int
    flood: dict[str, list[Measured]] = field(default_factory=dict)
    half: dict[str, list[Measured]] = field(default_factory=dict)
    half_rate: list[float] = field(default_factory=list)

    def median(self, table: dict[str, list[Measured]], name: str, what: str) -> float:
        return float(statistics.median(getattr(m, what) for m in table[name]))

    def spread(self, table: dict[str, list[Measured]], name: str, what: str) -> tuple[float, float]:
        values = [getattr(m, what) for m in table[name]]
        return min(values), max(values)

    @property
    def goodput_share(self) -> float:
        """Shortest queue's flood goodput over the two apart's (medians)."""
        return self.median(self.flood, "shortest queue", "goodput") / self.median(
            self.flood, "apart", "goodput"
        )

    @property
    def half_p99_ratio(self) -> float:
        """Shortest queue's p99 at half load over the fast one's alone (medians)."""
        return self.median(self.half, "shortest queue", "p99_ms") / self.median(
            self.half, "fast alone", "p99_ms"
        )

    def lines(self) -> list[str]:
        out = []
        for title, table in (("flood", self.flood), ("half load", self.half)):
            for name in table:
                low, high = self.spread(table, name, "goodput")
                p_low, p_high = self.spread(table, name, "p99_ms")
                out.append(
                    f"{title:>9} {name:>14}: {self.median(table, name, 'goodput'):6.1f}/s ({low:.1f}-{high:.1f})  "
                    f"p50 {self.median(table, name, 'p50_ms'):6.0f} ms  p99 {self.median(table, name, 'p99_ms'):6.0f} ms "
                    f"({p_low:.0f}-{p_high:.0f})"
                )
        out.append(
            f"shortest queue's flood goodput is {self.goodput_share:.0%} of the two apart (>= 90 %: "
            f"{'met' if self.goodput_share >= 0.9 else 'NOT met'}); round robin's "
            f"{self.median(self.flood, 'round robin', 'goodput') / self.median(self.flood, 'apart', 'goodput'):.0%}"
        )
        out.append(
            f"its p99 at half load is {self.half_p99_ratio:.2f}x the fast one's alone (<= 1.5x: "
            f"{'met' if self.half_p99_ratio <= 1.5 else 'NOT met'}); round robin's "
            f"{self.median(self.half, 'round robin', 'p99_ms') / self.median(self.half, 'fast alone', 'p99_ms'):.2f}x"
        )
        return out


def measured(answers: list[tuple[float, float, int]], seconds: float) -> Measured:
    served = sorted(latency for at, latency, status in answers if status == 200 and at >= STEADY_AFTER)
    statuses: dict[str, int] = {}
    for _, _, status in answers:
        statuses[str(status)] = statuses.get(str(status), 0) + 1
    return Measured(
        goodput=len(served) / (seconds - STEADY_AFTER),
        p50_ms=statistics.median(served) * 1000 if served else float("nan"),
        p99_ms=percentile(served, 0.99) * 1000 if served else float("nan"),
        statuses=statuses,
    )


@dataclass(frozen=True)
class Gateways:
    fast: GatewayProcess
    slow: GatewayProcess
    shortest: GatewayProcess
    turns: GatewayProcess


@contextmanager
def gateways(fast: TritonServer, slow: TritonServer, workdir: Path) -> Iterator[Gateways]:
    both = f"{fast.grpc_url},{slow.grpc_url}"
    # the static cap, not the gate on Triton's batches: the placement alone is measured
    # (its clients under the cap, nothing refused)
    quiet = {"GATEWAY_LOG_LEVEL": "warning", "GATEWAY_SERVER__ADAPTIVE__ENABLED": "false"}
    with ExitStack() as stack:

        def start(triton: TritonServer, **env: str) -> GatewayProcess:
            started = GatewayProcess.start(triton, workdir, cwd=workdir, env={**quiet, **env})
            stack.callback(started.stop)
            return started.wait("/readyz", timeout=60)

        yield Gateways(
            fast=start(fast),
            slow=start(slow),
            shortest=start(fast, GATEWAY_TRITON__URL=both),
            turns=start(fast, GATEWAY_TRITON__URL=both, GATEWAY_TRITON__LOAD_BALANCING="round_robin"),
        )


def run_round(found: Gateways, report: Report) -> None:
    seconds, clients = report.seconds, report.clients
    with ThreadPoolExecutor(2) as pool:  # the two apart, at once
        apart = [
            pool.submit(hey, found.fast.url, clients // 2, seconds),
            pool.submit(hey, found.slow.url, clients - clients // 2, seconds),
        ]
        both = [measured(job.result(), seconds) for job in apart]
    report.flood.setdefault("apart", []).append(
        Measured(
            goodput=sum(m.goodput for m in both),
            p50_ms=max(m.p50_ms for m in both),
            p99_ms=max(m.p99_ms for m in both),
            statuses={
                k: sum(m.statuses.get(k, 0) for m in both) for k in {s for m in both for s in m.statuses}
            },
        )
    )
    for name, gateway in (("shortest queue", found.shortest), ("round robin", found.turns)):
        report.flood.setdefault(name, []).append(measured(hey(gateway.url, clients, seconds), seconds))
    # half of what the two served apart, paced over 10 connections
    rate = report.flood["apart"][-1].goodput / 2
    report.half_rate.append(rate)
    pacers = 10
    for name, gateway in (
        ("fast alone", found.fast),
        ("shortest queue", found.shortest),
        ("round robin", found.turns),
    ):
        answers = hey(gateway.url, pacers, seconds, rate=rate / pacers)
        report.half.setdefault(name, []).append(measured(answers, seconds))


def measure(triton_env: Path, repository: Path, rounds: int, seconds: float, clients: int) -> Report:
    """Two Tritons of ``repository`` (the second throttled 5x), four gateways, ``rounds``
    rounds."""
    report = Report(rounds=rounds, seconds=seconds, clients=clients)
    with tempfile.TemporaryDirectory(prefix="bench-placement-") as folder, ExitStack() as stack:
        workdir = Path(folder)
        tritons = []
        for name in ("fast", "slow"):
            server = TritonServer.on_free_ports(
                triton_env.resolve(), repository, workdir / name, response_cache_bytes=0
            )
            server.start()
            stack.callback(server.kill)
            tritons.append(server)
        for server in tritons:
            server.wait_ready(timeout=180)
        fast, slow = tritons
        found = stack.enter_context(gateways(fast, slow, workdir))
        for gateway in (found.fast, found.slow, found.shortest, found.turns):
            hey(gateway.url, 4, 1.0)  # every model warm
        with throttled(slow):
            for index in range(rounds):
                run_round(found, report)
                print(f"round {index + 1} of {rounds} done", flush=True)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=12.0, help="each load")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--clients", type=int, default=48, help="the flood's connections (under the cap of 64)"
    )
    parser.add_argument("--repository", choices=sorted(REPOSITORIES), default="real")
    parser.add_argument("--triton-env", type=Path, default=Path(".venv-triton"))
    parser.add_argument("--out", type=Path, default=Path(".reports/placement"))
    options = parser.parse_args(argv)
    if shutil.which("hey") is None:
        print("hey is not installed (apt-get install hey; `make bench-placement` does)", file=sys.stderr)
        return 2
    report = measure(
        options.triton_env, REPOSITORIES[options.repository], options.rounds, options.seconds, options.clients
    )
    lines = report.lines()
    print("\n".join(lines))
    options.out.parent.mkdir(parents=True, exist_ok=True)
    document = {**asdict(report), "verdicts": lines[-2:], "goodput_share": report.goodput_share,
                "half_p99_ratio": report.half_p99_ratio}  # fmt: skip
    options.out.with_suffix(".json").write_text(json.dumps(document, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
