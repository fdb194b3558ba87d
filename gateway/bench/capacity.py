"""Where the in-flight limit sits under steady overload (`make bench-capacity`).

    .venv/bin/python -m gateway.bench.capacity [--seconds 30] [--rounds 3] [--clients 100]
        [--limits 1 2 4 8 16 32 64] [--speeds 1 5] [--no-gate] [--out .reports/capacity]
        [--no-sweep] [--refusal-rounds 3] [--refusal-seconds 8] [--refusal-ways WAY ...]

A real tritonserver on the real model repository (the CPU twins: Triton is the bottleneck,
as in production; ``--repository trivial``: fixed answers, the gateway's own cost is) and, one after another, a gateway process with each static limit
(``max_in_flight`` N, the gate off) and one with the default, each model's gate on
Triton's batches (gateway.serving.queuegate) under a ceiling of the largest, each flooded by ``hey`` (a Go program: a few % of a core, and
each of its connections sends again the moment an answer, 503 or not, comes back: the
retry-at-once client). At Triton's speed and with Triton made ``speed`` times slower (its
processes stopped most of each 20 ms). Each row: goodput (answers 200 a second), the
admitted p50 and p99, refusals a second, and the limit the gated gateway reports at the
end (``gateway_inflight_limit``).

Each limit is measured ``--rounds`` times, interleaved: every round runs every limit, in an
order rotated by one from the round before, so a slow minute of the machine falls on
different limits each time. A row is the median of its rounds, with the spread (lowest
and highest) of its goodput and p99 beside it; the verdict is read from the medians (one
flood per limit was a coin toss: the best static limit changed between runs of the same
sweep).

The verdict per speed, what issues 42 and 54 ask of the default: its goodput against the
best static's (>= 90 %), its p99 against the p99 of the smallest static limit that reaches
90 % of that goodput (<= 1.5x), and against the static cap of the ceiling (goodput >= 90 %,
p99 <= half), and which static limits meet that last bound themselves.

    .venv/bin/python -m gateway.bench.capacity --cross RUN.json RUN.json ... [--out X]

holds each saved run's rows (static and adaptive) to every other run's static limits: a
bound that a static limit meets against its own run and not against another run of the
same sweep is set by the machine's noise more than by the stack.
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from gateway.bench.quantiles import percentile
from gateway.bench.side_by_side import REPOSITORIES, _cpu_seconds
from gateway.dev.gatewayprocess import GatewayProcess
from gateway.dev.tritonserver import TritonServer, free_port, throttled

TEXT = json.dumps({"texts": ["the film was a delight from start to finish"]})
GATE = "gate"  # the default: each model gated on Triton's batches (gateway.serving.queuegate)
# the best static limit loaded by as many clients as it has slots: its goodput without a
# retry storm, against which the adaptive limit's under the storm is read
CALM = "no storm, static"
GRPC_WAY = "on the gRPC door, from its metadata"
# goodput and p99 are the flood's after this many seconds (the whole flood's p99 too)
STEADY_AFTER = 2.0
# what issue 42 asks of the adaptive limit: goodput at least this share of the best static
# limit's and of the cap's; p99 at most OVER_SMALLEST times that of the smallest static limit
# at that share, and at most UNDER_CEILING times the cap's
GOODPUT_SHARE = 0.9
OVER_SMALLEST = 1.5
UNDER_CEILING = 0.5


@dataclass
class Row:
    speed: int  # Triton this many times slower
    limit: str  # "static N" or GATE
    seconds: float
    goodput: float  # answers 200 a second, after STEADY_AFTER
    p50_ms: float
    p99_ms: float
    whole_p99_ms: float  # over the whole flood, its first seconds included
    refused_per_second: float
    other_statuses: dict[str, int]
    final_limit: int | None = None
    rounds: int = 1  # the floods it is the median of
    # lowest and highest of its rounds: goodput, p99_ms
    spread: dict[str, list[float]] | None = None


def median_row(runs: list[Row]) -> Row:
    """The median of one limit's rounds at one speed, with their spread."""
    first = runs[0]

    def mid(values: list[float]) -> float:
        return float(statistics.median(values))

    others: dict[str, int] = {}
    for run in runs:
        for status, count in run.other_statuses.items():
            others[status] = others.get(status, 0) + count
    limits = [run.final_limit for run in runs if run.final_limit is not None]
    return Row(
        speed=first.speed,
        limit=first.limit,
        seconds=first.seconds,
        goodput=mid([run.goodput for run in runs]),
        p50_ms=mid([run.p50_ms for run in runs]),
        p99_ms=mid([run.p99_ms for run in runs]),
        whole_p99_ms=mid([run.whole_p99_ms for run in runs]),
        refused_per_second=mid([run.refused_per_second for run in runs]),
        other_statuses=others,
        final_limit=int(statistics.median(limits)) if limits else None,
        rounds=len(runs),
        spread={
            "goodput": [min(run.goodput for run in runs), max(run.goodput for run in runs)],
            "p99_ms": [min(run.p99_ms for run in runs), max(run.p99_ms for run in runs)],
        },
    )


def medians(runs: list[Row]) -> list[Row]:
    """One row per (speed, limit): the median of its rounds, in first-measured order."""
    grouped: dict[tuple[int, str], list[Row]] = {}
    for run in runs:
        grouped.setdefault((run.speed, run.limit), []).append(run)
    return [median_row(group) for group in grouped.values()]


def interleaved(configs: list[str], round_index: int) -> list[str]:
    """``configs`` in round ``round_index``'s order: rotated by one each round."""
    shift = round_index % len(configs)
    return configs[shift:] + configs[:shift]


@dataclass
class Verdict:
    speed: int
    best_static: str
    best_goodput: float
    smallest_at_90: str
    smallest_at_90_p99_ms: float
    goodput_vs_best: float
    whole_p99_vs_steady: float
    p99_vs_smallest_at_90: float
    goodput_vs_ceiling: float
    p99_vs_ceiling: float
    storm_goodput_vs_calm: float | None  # the adaptive limit under the storm / no storm
    # the static limits that meet the cap's bound themselves (none: no limit can, this run)
    statics_meeting_ceiling_bound: list[str]
    adaptive: str = GATE  # which adaptive limit was judged


def hey(
    url: str,
    clients: int,
    seconds: float,
    headers: dict[str, str] | None = None,
    rate: float | None = None,
    requests: int | None = None,
) -> list[tuple[float, float, int]]:
    """(offset, latency, status) of every request ``clients`` connections sent for
    ``seconds`` (``requests``: that many in all instead; ``rate``: each connection at
    most that many a second, not back to back; ``headers``: sent with each)."""
    command = [
        "hey", *(["-n", str(requests)] if requests else ["-z", f"{seconds}s"]), "-c", str(clients),
        "-m", "POST", "-T", "application/json", "-d", TEXT, "-o", "csv",
    ]  # fmt: skip
    for name, value in (headers or {}).items():
        command += ["-H", f"{name}: {value}"]
    if rate is not None:
        command += ["-q", f"{rate:g}"]
    output = subprocess.run(
        [*command, f"{url}/classify"], capture_output=True, text=True, check=True, timeout=seconds + 60
    ).stdout
    answers = []
    for line in csv.DictReader(output.splitlines()):
        answers.append((float(line["offset"]), float(line["response-time"]), int(line["status-code"])))
    return answers


def final_limit(url: str) -> int | None:
    for line in httpx.get(f"{url}/metrics", timeout=5).text.splitlines():
        if line.startswith("gateway_inflight_limit "):
            return int(float(line.split()[1]))
    return None


def measure(
    triton: TritonServer,
    workdir: Path,
    limit: str,
    ceiling: int,
    speed: int,
    clients: int,
    seconds: float,
    extra: dict[str, str],
) -> Row:
    if limit == GATE:
        env = {"GATEWAY_SERVER__MAX_IN_FLIGHT": str(ceiling), "GATEWAY_SERVER__ADAPTIVE__ENABLED": "true"}
    else:
        env = {
            "GATEWAY_SERVER__MAX_IN_FLIGHT": limit.split()[1],
            "GATEWAY_SERVER__ADAPTIVE__ENABLED": "false",
        }
    env["GATEWAY_LOG_LEVEL"] = "warning"
    env.update(extra)
    gateway = GatewayProcess.start(triton, workdir, cwd=workdir, env=env).wait("/readyz", timeout=60)
    try:
        hey(gateway.url, 2, 1.0)  # a light load first, as a replica has before a flood
        slow = throttled(triton, 0.004, 0.004 * (speed - 1)) if speed > 1 else nullcontext()
        with slow:
            answers = hey(gateway.url, clients, seconds)
        reported = final_limit(gateway.url) if limit == GATE else None
    finally:
        gateway.stop()
    served = sorted(latency for at, latency, status in answers if status == 200 and at >= STEADY_AFTER)
    whole = sorted(latency for _, latency, status in answers if status == 200)
    steady = seconds - STEADY_AFTER
    others: dict[str, int] = {}
    for _, _, status in answers:
        if status not in (200, 503):
            others[str(status)] = others.get(str(status), 0) + 1
    return Row(
        speed=speed,
        limit=limit,
        seconds=seconds,
        goodput=len(served) / steady,
        p50_ms=statistics.median(served) * 1000 if served else float("nan"),
        p99_ms=percentile(served, 0.99) * 1000 if served else float("nan"),
        whole_p99_ms=percentile(whole, 0.99) * 1000 if whole else float("nan"),
        refused_per_second=sum(1 for _, _, status in answers if status == 503) / seconds,
        other_statuses=others,
        final_limit=reported,
    )


# where a refusal is decided: after the queue wait (bodies read), from the headers in the
# route, from the request head in the HTTP protocol (gateway.http.headshed), and on the
# gRPC door from a call's metadata
REFUSAL_WAYS = {
    "after the queue wait": {"GATEWAY_SERVER__SHED_FROM_HEADERS": "false"},
    "from the headers, in the route": {"GATEWAY_SERVER__SHED_AT_HEAD": "false"},
    "from the request head": {},
    # Triton's ModelInfer on the gRPC door, refused from its metadata (gateway.bench.grpcstorm)
    GRPC_WAY: {},
}


@dataclass
class RefusalCost:
    way: str  # a key of REFUSAL_WAYS
    shed_from_headers: bool
    refusals: int
    served: int
    # what the storm added to the gateway's CPU (the same seconds with one client, as many
    # as slots, subtracted: the served requests and the idle work), per refusal
    gateway_cpu_ms_per_refusal: float
    # all of the gateway's CPU in the storm, per answer (served ones and idle work included)
    gateway_cpu_ms_per_answer: float
    storm_cores: float  # the gateway's CPU in the storm, in cores
    calm_cores: float  # the same without the storm
    goodput: float  # answers 200 a second in the storm
    calm_goodput: float  # the same without the storm


def refusal_cost(triton: TritonServer, workdir: Path, way: str, clients: int, seconds: float) -> RefusalCost:
    """The gateway's CPU per 503: one slot, Triton made 5x slower (it still answers, so the
    gateway knows how fast its queue moves and may refuse from the headers), and
    ``clients`` connections (``hey``'s, or gRPC channels for :data:`GRPC_WAY`) sending
    again as soon as they are answered; against the same
    seconds with one client (the storm's served answers and the gateway's idle work),
    whose CPU the storm's is measured above."""
    env = {
        "GATEWAY_SERVER__MAX_IN_FLIGHT": "1",
        "GATEWAY_SERVER__ADAPTIVE__ENABLED": "false",
        "GATEWAY_LOG_LEVEL": "warning",
        **REFUSAL_WAYS[way],
    }
    door = None
    if way == GRPC_WAY:
        door = f"127.0.0.1:{free_port()}"
        env["GATEWAY_GRPC__PORT"] = door.rsplit(":", 1)[1]
    gateway = GatewayProcess.start(triton, workdir, cwd=workdir, env=env).wait("/readyz", timeout=60)
    pid = gateway.process.pid

    def load(clients: int, seconds: float) -> tuple[int, int]:
        """(served, refused) by ``clients`` that send again at once, for ``seconds``."""
        if door is None:
            answers = hey(gateway.url, clients, seconds)
            statuses = [status for _, _, status in answers]
            return statuses.count(200), statuses.count(503)
        counts = grpc_storm(door, clients, seconds)
        return counts.get("OK", 0), counts.get("UNAVAILABLE", 0)

    try:
        with throttled(triton):
            load(2, 1.0)  # completions, so the queue's pace is known
            before = _cpu_seconds(pid, with_children=False)
            calm_served, _ = load(1, seconds)
            calm_cpu = _cpu_seconds(pid, with_children=False) - before
            before = _cpu_seconds(pid, with_children=False)
            served, refused = load(clients, seconds)
            spent = _cpu_seconds(pid, with_children=False) - before
    finally:
        gateway.stop()
    return RefusalCost(
        way,
        way != "after the queue wait",
        refused,
        served,
        (spent - calm_cpu) * 1000 / max(1, refused),
        spent * 1000 / max(1, served + refused),
        spent / seconds,
        calm_cpu / seconds,
        served / seconds,
        calm_served / seconds,
    )


def grpc_storm(door: str, clients: int, seconds: float) -> dict[str, int]:
    """The calls answered by gateway.bench.grpcstorm's clients, by status code name (in a
    process of its own: its CPU is not the gateway's)."""
    output = subprocess.run(
        [sys.executable, "-m", "gateway.bench.grpcstorm", door, "--clients", str(clients), "--seconds", f"{seconds}"],
        capture_output=True, text=True, check=True, timeout=seconds + 60,
    ).stdout  # fmt: skip
    counts: dict[str, int] = json.loads(output)
    return counts


def statics(rows: list[Row], speed: int) -> list[Row]:
    return [row for row in rows if row.speed == speed and row.limit.startswith("static")]


@dataclass(frozen=True)
class Judged:
    """One row held to the bounds a run's static limits set."""

    limit: str
    goodput_vs_best: float
    p99_vs_smallest_at_90: float
    goodput_vs_ceiling: float
    p99_vs_ceiling: float

    @property
    def meets_knee_bound(self) -> bool:
        return self.goodput_vs_best >= GOODPUT_SHARE and self.p99_vs_smallest_at_90 <= OVER_SMALLEST

    @property
    def meets_ceiling_bound(self) -> bool:
        return self.goodput_vs_ceiling >= GOODPUT_SHARE and self.p99_vs_ceiling <= UNDER_CEILING


@dataclass(frozen=True)
class Reference:
    """What one run's static limits at one speed set the bounds by: the best goodput, the
    smallest limit at ``GOODPUT_SHARE`` of it, and the cap (the largest limit)."""

    best: Row
    smallest: Row
    cap: Row

    @classmethod
    def of(cls, rows: list[Row], speed: int) -> Reference:
        measured = statics(rows, speed)
        best = max(measured, key=lambda row: row.goodput)
        smallest = min((row for row in measured if row.goodput >= GOODPUT_SHARE * best.goodput), key=_slots)
        return cls(best, smallest, max(measured, key=_slots))

    def judge(self, row: Row) -> Judged:
        return Judged(
            row.limit,
            goodput_vs_best=row.goodput / self.best.goodput,
            p99_vs_smallest_at_90=row.p99_ms / self.smallest.p99_ms,
            goodput_vs_ceiling=row.goodput / self.cap.goodput,
            p99_vs_ceiling=row.p99_ms / self.cap.p99_ms,
        )


def _slots(row: Row) -> int:
    return int(row.limit.split()[1])


def verdict(rows: list[Row], speed: int, name: str = GATE) -> Verdict:
    """Adaptive limit ``name``'s row at ``speed`` held to the run's static limits."""
    [adaptive] = [row for row in rows if row.speed == speed and row.limit == name]
    reference = Reference.of(rows, speed)
    judged = reference.judge(adaptive)
    calm = [row for row in rows if row.speed == speed and row.limit.startswith(CALM)]
    return Verdict(
        speed=speed,
        best_static=reference.best.limit,
        best_goodput=reference.best.goodput,
        smallest_at_90=reference.smallest.limit,
        smallest_at_90_p99_ms=reference.smallest.p99_ms,
        goodput_vs_best=judged.goodput_vs_best,
        whole_p99_vs_steady=adaptive.whole_p99_ms / adaptive.p99_ms,
        p99_vs_smallest_at_90=judged.p99_vs_smallest_at_90,
        goodput_vs_ceiling=judged.goodput_vs_ceiling,
        p99_vs_ceiling=judged.p99_vs_ceiling,
        storm_goodput_vs_calm=adaptive.goodput / calm[0].goodput if calm else None,
        statics_meeting_ceiling_bound=[
            row.limit for row in statics(rows, speed) if reference.judge(row).meets_ceiling_bound
        ],
        adaptive=name,
    )


@dataclass
class Crossed:
    """Run ``candidate``'s rows at ``speed`` held to the bounds run ``reference``'s static
    limits set: whether the bounds are a property of the stack or of one run's noise (a
    static limit that meets them in one run and not against another run of the same sweep)."""

    speed: int
    reference: str
    candidate: str
    smallest_at_90: str
    meeting_knee_bound: list[str]
    meeting_ceiling_bound: list[str]
    judged: list[Judged]


def cross(runs: dict[str, list[Row]]) -> list[Crossed]:
    """Every run's rows (static and adaptive) against every other run's reference, by speed."""
    crossed = []
    for reference_name, reference_rows in runs.items():
        for speed in sorted({row.speed for row in reference_rows}):
            if not statics(reference_rows, speed):
                continue
            reference = Reference.of(reference_rows, speed)
            for name, rows in runs.items():
                if name == reference_name:
                    continue
                judged = [
                    reference.judge(row)
                    for row in rows
                    if row.speed == speed and (row.limit.startswith("static") or row.limit == GATE)
                ]
                crossed.append(
                    Crossed(
                        speed, reference_name, name, reference.smallest.limit,
                        [j.limit for j in judged if j.meets_knee_bound],
                        [j.limit for j in judged if j.meets_ceiling_bound],
                        judged,
                    )
                )  # fmt: skip
    return crossed


def cross_main(files: list[Path], out: Path) -> int:
    """``--cross``: saved runs held to each other's references (no Triton is started)."""
    runs = {str(path): [Row(**row) for row in json.loads(path.read_text())["rows"]] for path in files}
    crossed = cross(runs)
    for c in crossed:
        print(
            f"{c.speed}x slower, {c.candidate} against {c.reference} (smallest at 90 %: "
            f"{c.smallest_at_90}): the knee's bound met by {', '.join(c.meeting_knee_bound) or 'none'}; "
            f"the cap's by {', '.join(c.meeting_ceiling_bound) or 'none'}"
        )
    limits = sorted(
        {j.limit for c in crossed for j in c.judged},
        key=lambda limit: (limit == GATE, limit.split()[-1].zfill(4)),
    )
    for speed in sorted({c.speed for c in crossed}):
        pairs = [c for c in crossed if c.speed == speed]
        for limit in limits:
            knee = sum(limit in c.meeting_knee_bound for c in pairs)
            capped = sum(limit in c.meeting_ceiling_bound for c in pairs)
            print(
                f"{speed}x slower, {limit:>10}: the knee's bound in {knee} of {len(pairs)} pairs, "
                f"the cap's in {capped}"
            )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps([asdict(c) for c in crossed], indent=1))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=30.0, help="each flood")
    parser.add_argument(
        "--rounds", type=int, default=3, help="floods of each limit, interleaved (rows are their medians)"
    )
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--limits", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    parser.add_argument("--speeds", type=int, nargs="+", default=[1, 5])
    parser.add_argument(
        "--gate",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="measure the default (each model gated on Triton's batches) beside the static limits",
    )
    parser.add_argument(
        "--repository",
        choices=sorted(REPOSITORIES),
        default="real",
        help="real: model_repository on its CPU twins (Triton the bottleneck, as in production); "
        "trivial: fixed answers (the gateway's own cost the bottleneck)",
    )
    parser.add_argument("--triton-env", type=Path, default=Path(".venv-triton"))
    parser.add_argument(
        "--refusals",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="measure a refusal's CPU, refused from the headers and after the queue wait",
    )
    parser.add_argument(
        "--refusal-rounds", type=int, default=1, help="times each way of refusing is measured"
    )
    parser.add_argument("--refusal-seconds", type=float, default=5.0, help="each refusal measurement's storm")
    parser.add_argument(
        "--refusal-ways", nargs="+", choices=list(REFUSAL_WAYS), default=list(REFUSAL_WAYS), metavar="WAY",
        help=f"the ways of refusing measured (of: {', '.join(REFUSAL_WAYS)})",
    )  # fmt: skip
    parser.add_argument(
        "--sweep",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="the sweep of limits (--no-sweep: the refusals' cost only)",
    )
    parser.add_argument(
        "--env",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="GATEWAY_* settings for every gateway measured",
    )
    parser.add_argument("--out", type=Path, default=Path(".reports/capacity"))
    parser.add_argument(
        "--cross",
        type=Path,
        nargs="+",
        metavar="RUN.json",
        help="no sweep: hold the rows of saved runs to each other's static limits (the bounds' own noise)",
    )
    options = parser.parse_args(argv)
    if options.cross:
        return cross_main(options.cross, options.out)
    if shutil.which("hey") is None:
        print("hey is not installed (apt-get install hey; `make bench-capacity` does)", file=sys.stderr)
        return 2
    ceiling = max(options.limits)
    extra = dict(item.split("=", 1) for item in options.env)
    rows: list[Row] = []
    runs: list[Row] = []  # every flood; rows are their medians
    with tempfile.TemporaryDirectory(prefix="bench-capacity-") as folder:
        workdir = Path(folder)
        triton = TritonServer.on_free_ports(
            options.triton_env.resolve(), REPOSITORIES[options.repository], workdir, response_cache_bytes=0
        )
        triton.start()
        try:
            triton.wait_ready(timeout=180)
            adaptive = [GATE] if options.gate else []
            configs = [*(f"static {n}" for n in options.limits), *adaptive]
            for round_index in range(options.rounds if options.sweep else 0):
                for speed in options.speeds:
                    for limit in interleaved(configs, round_index):
                        started = time.monotonic()
                        row = measure(
                            triton, workdir, limit, ceiling, speed, options.clients, options.seconds, extra
                        )
                        runs.append(row)
                        print(
                            f"round {round_index + 1}  {speed}x slower  {limit:>10}: {row.goodput:7.1f}/s  "
                            f"p50 {row.p50_ms:7.1f} ms  p99 {row.p99_ms:7.1f} ms (whole flood "
                            f"{row.whole_p99_ms:7.1f})  refused {row.refused_per_second:7.1f}/s"
                            + (f"  limit at the end {row.final_limit}" if row.final_limit is not None else "")
                            + f"  ({time.monotonic() - started:.0f} s)",
                            flush=True,
                        )
            rows = medians(runs)
            for row in rows:
                spread = row.spread or {}
                print(
                    f"median of {row.rounds}  {row.speed}x slower  {row.limit:>10}: {row.goodput:7.1f}/s "
                    f"({spread['goodput'][0]:.1f}-{spread['goodput'][1]:.1f})  p99 {row.p99_ms:7.1f} ms "
                    f"({spread['p99_ms'][0]:.0f}-{spread['p99_ms'][1]:.0f})",
                    flush=True,
                )
            for speed in options.speeds if options.sweep else []:
                # no storm: the best static limit with as many clients as slots (none refused)
                best = max(
                    (r for r in rows if r.speed == speed and r.limit.startswith("static")),
                    key=lambda r: r.goodput,
                )
                slots = int(best.limit.split()[1])
                calm = measure(triton, workdir, best.limit, ceiling, speed, slots, options.seconds, extra)
                calm.limit = f"{CALM} {slots}"
                rows.append(calm)
                print(
                    f"{speed}x slower  {calm.limit}: {calm.goodput:7.1f}/s  p50 {calm.p50_ms:7.1f} ms  "
                    f"p99 {calm.p99_ms:7.1f} ms  refused {calm.refused_per_second:7.1f}/s",
                    flush=True,
                )
            costs = []
            for turn in range(options.refusal_rounds if options.refusals else 0):
                # each way in turn, the order reversed every other round
                for way in options.refusal_ways[:: 1 if turn % 2 == 0 else -1]:
                    cost = refusal_cost(triton, workdir, way, options.clients, options.refusal_seconds)
                    costs.append(cost)
                    print(
                        f"a refusal {way}: {cost.gateway_cpu_ms_per_refusal:.3f} ms of gateway CPU "
                        f"({cost.gateway_cpu_ms_per_answer:.3f} ms an answer, all counted; {cost.refusals} "
                        f"refused, {cost.served} served); the storm {cost.storm_cores:.2f} cores, "
                        f"{cost.goodput:.1f}/s served (without it {cost.calm_cores:.2f} cores, "
                        f"{cost.calm_goodput:.1f}/s)",
                        flush=True,
                    )
        finally:
            triton.kill()
    judged = [GATE] if options.gate else []
    verdicts = (
        [verdict(rows, speed, name) for speed in options.speeds for name in judged] if options.sweep else []
    )
    for v in verdicts:
        print(
            f"{v.speed}x slower: {v.adaptive}: goodput {v.goodput_vs_best:.0%} of the best static ({v.best_static}, "
            f"{v.best_goodput:.0f}/s), p99 {v.p99_vs_smallest_at_90:.2f}x that of {v.smallest_at_90} "
            f"(the smallest at 90 %: {v.smallest_at_90_p99_ms:.0f} ms); against static {ceiling}: goodput "
            f"{v.goodput_vs_ceiling:.0%}, p99 {v.p99_vs_ceiling:.2f}x; the whole flood's p99 "
            f"{v.whole_p99_vs_steady:.2f}x the steady p99"
            + (
                f"; its goodput under the storm {v.storm_goodput_vs_calm:.0%} of the best static's without one"
                if v.storm_goodput_vs_calm is not None
                else ""
            )
            + f"; the static limits that meet the cap's bound themselves: "
            f"{', '.join(v.statics_meeting_ceiling_bound) or 'none'}"
        )
    options.out.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "repository": options.repository,
        "settings": extra,
        "clients": options.clients,
        "seconds": options.seconds,
        "load_generator": "hey (each connection sends again at once, 503 or not)",
        "rounds": options.rounds,
        "rows": [asdict(row) for row in rows],  # the medians of the rounds
        "runs": [asdict(row) for row in runs],  # every flood
        "verdicts": [asdict(v) for v in verdicts],
        "refusal_cost": [asdict(cost) for cost in costs],
    }
    options.out.with_suffix(".json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
