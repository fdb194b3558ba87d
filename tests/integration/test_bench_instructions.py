"""A short run of `make bench-instructions` (gateway/bench/instructions.py): the gateway and
the reference gateway counted by callgrind in front of a real Triton. No figure is
asserted beyond what any working count gives: the counts are a process's, with its idle
taken off, each a Python request's order of size. Which of the two counts more is the
benchmark's answer, not this test's: since the gateway's hot path was cut (2026-12-03), 20
requests of it read 0.92-1.1x the reference's."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path


def test_instructions_are_counted_per_request_with_the_idle_taken_off(
    tmp_path: Path, triton_python_env: Path
) -> None:
    for tool in ("valgrind", "callgrind_control"):
        assert shutil.which(tool), f"{tool}: make test installs valgrind (apt)"
    out = tmp_path / "instructions.json"
    result = subprocess.run(
        [sys.executable, "-m", "gateway.bench.instructions", "--requests", "20", "--rounds", "1",
         "--scenarios", "text", "--out", str(out), "--triton-env", str(triton_python_env)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "| text | ratios | gateway/reference" in result.stdout
    report = json.loads(out.read_text())
    counts = {c["target"]: c for c in report["counts"]}
    assert set(counts) == {"gateway", "reference"}
    for c in counts.values():
        assert c["requests"] == 20
        # counted while requests were served, and a count with none: less, not nothing
        # (the process's timers run), never the whole
        assert 0 < c["idle"] < c["instructions"], c
    text = report["summary"]["text"]
    # a Python request through FastAPI and grpc.aio is hundreds of thousands of
    # instructions, not a handful (a count that missed the requests) nor billions
    assert 2e5 < text["reference"] < 2e7, text
    assert 2e5 < text["gateway"] < 2e7, text
    assert text["gateway/reference"] == text["gateway"] / text["reference"]
