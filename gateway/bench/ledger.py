"""The hot path's cost ledger: what share of the gateway's CPU each stage takes, from a
py-spy profile of the gateway under load (`make bench-ledger`).

    .venv/bin/python -m gateway.bench.ledger [--seconds 15] [--scenarios text raw]
        [--out .reports/ledger.json]

It starts Triton on the trivial repository, the gateway and the reference gateway, loads
each in turn with wrk at c=8, and samples it with py-spy (a dev dependency): per stage, the share of samples and the ms per request
(the share times the process's CPU per request, both under the profiler).
Each sample goes to the stage of the innermost frame that names one (the rules below, in
order), so a sample inside the logging package under the telemetry middleware counts as
the access log, one in asyncio's socket writes as the event loop.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from gateway.bench import side_by_side as bench

# (stage, pattern over a frame "function (file:line)"), innermost match wins
STAGES: list[tuple[str, re.Pattern[str]]] = [
    (stage, re.compile(pattern))
    for stage, pattern in [
        ("access log", r"logging/|pythonjsonlogger|gateway/observe/logs\.py|gateway/observe/outcome\.py"),
        ("metrics", r"prometheus_client|gateway/observe/metrics\.py"),
        ("spans", r"opentelemetry|gateway/observe/tracing\.py"),
        ("gRPC call machinery (grpc.aio)", r"grpc/|grpc\._cython"),
        ("Triton request building and reading", r"gateway/triton/"),
        ("rendering the answer", r"gateway/http/schemas\.py|jsoncodec\.py:2[0-9]\)|starlette/responses\.py"),
        (
            "body read and JSON parsing",
            r"gateway/http/bodies\.py|starlette/requests\.py|starlette/formparsers|"
            r"python_multipart|multipart/|jsoncodec\.py|pydantic",
        ),
        ("input checks", r"gateway/serving/validation\.py|gateway/serving/kinds/|PIL/"),
        (
            "routing decision (model, pin, rollout, top-k)",
            r"gateway/serving/dispatch\.py|gateway/serving/catalog|"
            r"gateway/shared/routing",
        ),
        ("admission", r"gateway/serving/admission\.py"),
        (
            "plane and breaker",
            r"gateway/serving/plane\.py|gateway/serving/guard\.py|gateway/serving/breaker\.py|"
            r"gateway/serving/workers\.py",
        ),
        (
            "telemetry middleware (request id, headers)",
            r"gateway/http/telemetry\.py|gateway/http/requestid\.py",
        ),
        # uvicorn's protocol as the gateway runs it: its write to the socket is a leaf here
        # (py-spy shows no native frame), which the reference pays inside uvicorn
        ("HTTP server (uvicorn, httptools)", r"uvicorn/|httptools|gateway/http/protocol\.py"),
        ("routes and the fast lane", r"gateway/http/"),
        ("framework (FastAPI, Starlette)", r"fastapi/|starlette/"),
        ("event loop, sockets, threads", r"asyncio/|selectors|threading|concurrent/|anyio/"),
    ]
]
OTHER = "other"


def stage_of(stack: str) -> str:
    for frame in reversed(stack.split(";")):
        for stage, pattern in STAGES:
            if pattern.search(frame):
                return stage
    return OTHER


def shares(raw_profile: str) -> dict[str, float]:
    """py-spy's raw (collapsed) output -> stage -> share of the samples."""
    counts: Counter[str] = Counter()
    for line in raw_profile.splitlines():
        stack, _, number = line.rpartition(" ")
        if stack and number.isdigit():
            counts[stage_of(stack)] += int(number)
    total = sum(counts.values()) or 1
    return {stage: counts[stage] / total for stage, _ in [*STAGES, (OTHER, None)] if counts[stage]}


def table(scenario: str, targets: dict[str, dict[str, float]]) -> str:
    """Markdown: per stage, the gateway's share and ms per request beside the reference's."""
    gateway, reference = targets["gateway"], targets["reference"]
    stages = sorted(
        (k for k in gateway.keys() | reference.keys() if k != "cpu_ms"), key=lambda k: -gateway.get(k, 0)
    )
    lines = [
        f"{scenario}: CPU ms per request under py-spy: gateway {gateway['cpu_ms']:.2f}, "
        f"reference {reference['cpu_ms']:.2f}",
        "",
        "| stage | gateway share | gateway ms/req | reference ms/req | difference |",
        "|---|---|---|---|---|",
    ]
    for stage in stages:
        ours, theirs = (
            gateway["cpu_ms"] * gateway.get(stage, 0),
            reference["cpu_ms"] * reference.get(stage, 0),
        )
        lines.append(
            f"| {stage} | {100 * gateway.get(stage, 0):.1f} % | {ours:.3f} | {theirs:.3f} | {ours - theirs:+.3f} |"
        )
    return "\n".join(lines)


def _py_spy() -> Path:
    found = Path(sys.executable).with_name("py-spy")
    if not found.exists():
        raise SystemExit("py-spy is missing: it is a dev dependency (`make bench-ledger` installs it)")
    return found


def _profile(
    stack: bench.Stack, scenario: bench.Scenario, target: str, seconds: float, spy: Path, workdir: Path
) -> dict[str, float]:
    bench.measure(stack, "trivial", scenario, target, 8, 2, workdir)  # warm
    out = workdir / f"profile-{target}.txt"
    command = [str(spy), "record", "--pid", str(stack.process(target).process.pid), "--rate", "250",
               "--duration", str(int(seconds)), "--format", "raw", "--output", str(out), "--nonblocking"]  # fmt: skip
    sampler = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    measured = bench.measure(stack, "trivial", scenario, target, 8, seconds, workdir)
    sampler.wait(timeout=seconds + 30)
    return {"cpu_ms": measured.gateway_cpu_ms, **shares(out.read_text())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--scenarios", nargs="+", default=["text", "raw"])
    parser.add_argument("--triton-env", type=Path, default=bench.ROOT / ".venv-triton")
    parser.add_argument("--out", type=Path, default=bench.ROOT / ".reports" / "ledger.json")
    options = parser.parse_args(argv)
    spy = _py_spy()
    report: dict[str, dict[str, dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="ledger-") as folder:
        workdir = Path(folder)
        stack = bench.start_stack(bench.REPOSITORIES["trivial"], workdir, options.triton_env, None, None)
        try:
            for scenario in bench.scenarios():
                if any(scenario.name.startswith(name) for name in options.scenarios):
                    report[scenario.name] = {
                        target: _profile(stack, scenario, target, options.seconds, spy, workdir)
                        for target in ("gateway", "reference")
                    }
        finally:
            stack.stop()
    for name, targets in report.items():
        print(f"\n{table(name, targets)}")
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
