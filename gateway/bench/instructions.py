"""Instructions per request: the gateway's and the reference gateway's, counted by
valgrind's callgrind (`make bench-instructions`).

    .venv/bin/python -m gateway.bench.instructions [--requests 400] [--rounds 2]
        [--scenarios text raw] [--against REV] [--out .reports/instructions.json]

CPU time per request, as `make bench` measures it, moves with everything else the machine
does: the same code read 1.13x and 1.36x the reference's in two runs of one afternoon, so a
change of a few percent cannot be shown with it. An instruction count does not move with
the machine's load. Each target runs under callgrind with its counting off; once it
answers and is warmed, counting is turned on (``callgrind_control``) for ``--requests``
requests sent one after another, then for as long again with none sent, and the second
count, what the process does with no requests (its timers), is taken from the first. The
gateway's reads of Triton's statistics, which run only while requests are sent, are made
rare (:data:`QUIET_TIMERS`). What is left, over the requests, is the instructions each took in the
process, every thread's: not the kernel's (its socket calls), nor what a cache miss costs.
``--against REV`` adds the gateway at another revision (a git worktree), in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from gateway.bench import side_by_side as bench
from gateway.dev.gatewayprocess import GatewayProcess, environment_for
from gateway.dev.tritonserver import TritonServer, free_port

WARM_REQUESTS = 50
# Triton's statistics, which the gateway reads every 0.25 s while requests are sent (its
# queue gate), read only once a minute: under valgrind a request takes about 50 times as
# long, so each read would be counted against 50 times fewer requests than it serves at
# speed, and only while requests are sent, so the idle count would not take it off. (Its
# other timers, the catalog's reads and the breaker's probe, run whether or not requests
# are sent: the idle count takes them off.)
QUIET_TIMERS = {"GATEWAY_SERVER__ADAPTIVE__STATISTICS_INTERVAL_SECONDS": "60"}
# Python's hashing seeded the same in every target: dict and set layouts (and so the
# instructions a lookup takes) alike from run to run.
HASH_SEED = "0"


@dataclass
class Target:
    """One process to count: its command, environment and working directory."""

    name: str
    command: list[str]
    env: dict[str, str]
    cwd: Path | None
    ready: str  # the path that answers 200 once it serves


@dataclass
class Count:
    target: str
    scenario: str
    requests: int
    instructions: int  # while the requests were sent
    idle: int  # for as long again, with none sent
    seconds: float

    @property
    def per_request(self) -> float:
        return (self.instructions - self.idle) / self.requests


def _callgrind(command: Sequence[str], out: Path) -> list[str]:
    return ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}.%p", *command]


def _control(pid: int, *arguments: str) -> None:
    subprocess.run(["callgrind_control", *arguments, str(pid)], check=True, capture_output=True, timeout=120)


def _dumped(out: Path, pid: int, before: set[Path]) -> int:
    """The count in the dump callgrind has just written (``out.<pid>.<n>``)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for path in sorted(out.parent.glob(f"{out.name}.{pid}.*")):
            if path in before:
                continue
            text = path.read_text(errors="replace")
            for line in text.splitlines():
                if line.startswith("totals:"):
                    before.add(path)
                    return int(line.split()[1])
        time.sleep(0.2)
    raise RuntimeError(f"callgrind wrote no dump for process {pid}")


def _post(client: httpx.Client, scenario: bench.Scenario) -> httpx.Response:
    return client.post("/classify", content=scenario.http_body, headers={"Content-Type": scenario.http_type})


def _send(client: httpx.Client, scenario: bench.Scenario, count: int) -> int:
    failed = 0
    for _ in range(count):
        failed += _post(client, scenario).status_code != 200
    return failed


def _serves(client: httpx.Client, scenario: bench.Scenario, seconds: float) -> None:
    """Until ``scenario``'s request is answered 200 (the catalog read, the model ready)."""
    deadline = time.monotonic() + seconds
    while (answer := _post(client, scenario)).status_code != 200:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{scenario.name}: {answer.status_code} {answer.text[:500]}")
        time.sleep(1)


def count(target: Target, scenarios: Sequence[bench.Scenario], requests: int, folder: Path) -> list[Count]:
    """Start ``target`` under callgrind and count each scenario's requests."""
    port = free_port()
    out = folder / f"callgrind-{target.name}-{port}"
    log = folder / f"{target.name}-{port}.log"
    command = [*target.command, "--port", str(port)]
    with log.open("wb") as sink:
        process = subprocess.Popen(
            _callgrind(command, out),
            env={**target.env, "PYTHONHASHSEED": HASH_SEED},
            cwd=target.cwd,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    served = GatewayProcess(process, port, log)
    dumps: set[Path] = set()
    counts: list[Count] = []
    try:
        served.wait(target.ready, timeout=600)  # a start under valgrind takes tens of seconds
        with httpx.Client(base_url=served.url, timeout=120) as client:
            for scenario in scenarios:
                _serves(client, scenario, 300)
                failed = _send(client, scenario, WARM_REQUESTS)
                _control(process.pid, "--instr=on")
                started = time.monotonic()
                failed += _send(client, scenario, requests)
                seconds = time.monotonic() - started
                _control(process.pid, "--instr=off")
                _control(process.pid, "--dump=requests")
                busy = _dumped(out, process.pid, dumps)
                _control(process.pid, "--instr=on")
                time.sleep(seconds)
                _control(process.pid, "--instr=off")
                _control(process.pid, "--dump=idle")
                idle = _dumped(out, process.pid, dumps)
                if failed:
                    raise RuntimeError(
                        f"{target.name}: {failed} {scenario.name} requests were not answered 200"
                    )
                counts.append(Count(target.name, scenario.name, requests, busy, idle, seconds))
    finally:
        served.stop()  # its counts are dumped already
    return counts


def targets(triton: TritonServer, folder: Path, against: str | None) -> list[Target]:
    gateway_env = environment_for(triton, QUIET_TIMERS)
    serve = [sys.executable, "-m", "gateway", "serve", "--host", "127.0.0.1"]
    reference = Path(bench.__file__).with_name("reference_gateway.py")
    found = [
        Target("gateway", serve, gateway_env, bench.ROOT, "/readyz"),
        Target("reference", [sys.executable, str(reference), "--triton", triton.grpc_url], dict(os.environ), None, "/livez"),
    ]  # fmt: skip
    if against is not None:
        tree = bench._worktree(against, folder / "against")
        found.append(Target("against", serve, gateway_env, tree, "/readyz"))
    return found


def summary(counts: Sequence[Count]) -> dict[str, dict[str, float]]:
    """scenario -> target -> the median instructions per request over the rounds, and the
    ratios to the reference (and of the gateway to the revision it is measured against)."""
    report: dict[str, dict[str, float]] = {}
    for scenario in dict.fromkeys(c.scenario for c in counts):
        medians = {
            target: statistics.median(
                c.per_request for c in counts if c.scenario == scenario and c.target == target
            )
            for target in dict.fromkeys(c.target for c in counts if c.scenario == scenario)
        }
        row = dict(medians)
        for target, value in medians.items():
            if target != "reference":
                row[f"{target}/reference"] = value / medians["reference"]
        if "against" in medians:
            row["gateway/against"] = medians["gateway"] / medians["against"]
        report[scenario] = row
    return report


def table(report: Mapping[str, Mapping[str, float]], counts: Sequence[Count]) -> str:
    lines = ["| scenario | target | instructions per request (each round) | median |", "|---|---|---|---|"]
    for scenario, row in report.items():
        for target in (name for name in row if "/" not in name):
            rounds = ", ".join(
                f"{c.per_request / 1e6:.3f} M"
                for c in counts
                if c.scenario == scenario and c.target == target
            )
            lines.append(f"| {scenario} | {target} | {rounds} | {row[target] / 1e6:.3f} M |")
        ratios = ", ".join(f"{name} {value:.3f}" for name, value in row.items() if "/" in name)
        lines.append(f"| {scenario} | ratios | {ratios} | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--scenarios", nargs="+", default=["text", "raw"])
    parser.add_argument("--against", help="also the gateway at this git revision")
    parser.add_argument("--triton-env", type=Path, default=bench.ROOT / ".venv-triton")
    parser.add_argument("--out", type=Path, default=bench.ROOT / ".reports" / "instructions.json")
    options = parser.parse_args(argv)
    chosen = [s for s in bench.scenarios() if any(s.name.startswith(n) for n in options.scenarios)]
    if not chosen:
        parser.error(f"no scenario named {options.scenarios}")
    signal.signal(signal.SIGTERM, _stopped)
    counts: list[Count] = []
    with tempfile.TemporaryDirectory(prefix="instructions-") as name:
        folder = Path(name)
        triton = TritonServer.on_free_ports(
            options.triton_env, bench.REPOSITORIES["trivial"], folder, response_cache_bytes=0
        )
        triton.start()
        try:
            triton.wait_ready(timeout=180)
            every = targets(triton, folder, options.against)
            for turn in range(options.rounds):
                for target in every if turn % 2 == 0 else every[::-1]:
                    counts += count(target, chosen, options.requests, folder)
        finally:
            triton.stop()
    report = summary(counts)
    print(table(report, counts))
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(json.dumps({"summary": report, "counts": [vars(c) for c in counts]}, indent=1))
    return 0


def _stopped(signum: int, frame: object) -> None:
    """A run stopped from outside (``kill``) unwinds as an interrupted one does: its
    processes under valgrind stopped, Triton stopped, the worktree's folder removed
    (Python's default for SIGTERM ends at once, leaving them running)."""
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    raise SystemExit(main())
