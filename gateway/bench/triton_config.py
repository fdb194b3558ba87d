"""How a model's instance count and dynamic-batching delay change Triton's own
throughput and latency, measured on the real model repository (CPU twins), Triton direct.

    .venv/bin/python -m gateway.bench.triton_config --model image_preprocess \\
        --variants count=1,delay=0 count=2,delay=0 count=2,delay=2000 [--scenario raw]

Every variant is a copy of model_repository with that model's ``instance_group`` count
and ``max_queue_delay_microseconds`` replaced, served by a tritonserver of its own; all of
them run at once (an idle Triton costs next to nothing) and rounds interleave them, so
each variant sees the same machine. Load: the direct async gRPC client of
side_by_side at each concurrency. Writes <out>.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import statistics
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import gateway.bench.side_by_side as side
from gateway.dev.tritonserver import TritonServer

ROOT = side.ROOT


@dataclass(frozen=True)
class Variant:
    count: int
    delay_us: int

    @classmethod
    def parse(cls, text: str) -> Variant:
        fields = dict(item.split("=", 1) for item in text.split(","))
        return cls(int(fields["count"]), int(fields["delay"]))

    @property
    def name(self) -> str:
        return f"count={self.count},delay={self.delay_us}us"


def configure(repository: Path, model: str, variant: Variant) -> None:
    """Rewrite the model's instance count and queue delay in every config it has."""
    for config in [repository / model / "config.pbtxt", *(repository / model / "configs").glob("*.pbtxt")]:
        text = config.read_text()
        text, counts = re.subn(
            r"(instance_group \[ \{ kind: KIND_CPU count: )\d+", rf"\g<1>{variant.count}", text
        )
        text, delays = re.subn(r"(max_queue_delay_microseconds: )\d+", rf"\g<1>{variant.delay_us}", text)
        if counts != 1 or delays != 1:
            raise SystemExit(f"{config}: expected one CPU instance_group and one queue delay")
        config.write_text(text)


@dataclass
class Result:
    variant: str
    concurrency: int
    rps: float
    p50_ms: float
    p99_ms: float
    errors: int


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="image_preprocess")
    parser.add_argument(
        "--variants", nargs="+", default=["count=1,delay=0", "count=2,delay=0", "count=2,delay=2000"]
    )
    parser.add_argument("--scenario", default="raw", help="a side_by_side scenario name prefix")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--triton-env", type=Path, default=ROOT / ".venv-triton")
    parser.add_argument("--out", type=Path, default=ROOT / ".reports" / "triton-config")
    options = parser.parse_args(argv)
    variants = [Variant.parse(v) for v in options.variants]
    scenario = next(s for s in side.scenarios() if s.name.startswith(options.scenario) and s.direct)
    results: list[Result] = []
    servers: list[tuple[Variant, TritonServer]] = []
    with tempfile.TemporaryDirectory(prefix="bench-config-") as folder:
        try:
            for index, variant in enumerate(variants):
                workdir = Path(folder) / str(index)
                repository = workdir / "models"
                shutil.copytree(ROOT / "model_repository", repository, symlinks=True)
                configure(repository, options.model, variant)
                server = TritonServer.on_free_ports(
                    options.triton_env, repository, workdir, response_cache_bytes=0
                )
                server.start()
                servers.append((variant, server))
            for _, server in servers:
                server.wait_ready(timeout=300)
                asyncio.run(side._direct(server.grpc_url, scenario, 1, 1.0))  # warm
            for _ in range(options.rounds):
                for concurrency in options.concurrency:
                    for variant, server in servers:
                        count, errors, latencies = asyncio.run(
                            side._direct(server.grpc_url, scenario, concurrency, options.seconds)
                        )
                        p50, p99 = side.percentiles_ms(latencies)
                        results.append(
                            Result(variant.name, concurrency, count / options.seconds, p50, p99, errors)
                        )
        finally:
            for _, server in servers:
                server.kill()
    print(f"{options.model}, {scenario.name}, Triton direct, median of {options.rounds} interleaved rounds\n")
    print("| variant | c | req/s | p50 ms | p99 ms | errors |\n|---|---|---|---|---|---|")
    summary = []
    for variant in variants:
        for concurrency in options.concurrency:
            mine = [r for r in results if r.variant == variant.name and r.concurrency == concurrency]
            row = {
                "variant": variant.name,
                "concurrency": concurrency,
                "rps": statistics.median(r.rps for r in mine),
                "p50_ms": statistics.median(r.p50_ms for r in mine),
                "p99_ms": statistics.median(r.p99_ms for r in mine),
                "errors": sum(r.errors for r in mine),
            }
            summary.append(row)
            print(
                f"| {row['variant']} | {concurrency} | {row['rps']:.1f} | {row['p50_ms']:.1f} | "
                f"{row['p99_ms']:.1f} | {row['errors']} |"
            )
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.with_suffix(".json").write_text(
        json.dumps(
            {
                "model": options.model,
                "scenario": scenario.name,
                "rows": summary,
                "measures": [asdict(r) for r in results],
            },
            indent=1,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
