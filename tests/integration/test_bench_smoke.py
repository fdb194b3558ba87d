"""A smoke run of `make bench` (`triton-gateway bench`, which runs
gateway/bench/side_by_side.py): it runs against a real Triton and gateway and its
output is well formed. No timing asserts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_bench_runs_and_writes_a_table_json_and_plot(tmp_path: Path, triton_python_env: Path) -> None:
    out = tmp_path / "bench"
    result = subprocess.run(
        [
            sys.executable, "-m", "gateway", "bench",
            "--seconds", "1", "--rounds", "1", "--concurrency", "2",
            "--repositories", "trivial", "--scenarios", "text", "raw", "error",
            "--out", str(out), "--triton-env", str(triton_python_env), "--tracing", "--pin",
        ],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "| trivial | text | 2 |" in result.stdout
    report = json.loads(out.with_suffix(".json").read_text())
    rows = {(r["scenario"].split()[0], r["concurrency"]): r for r in report["rows"]}
    assert set(rows) == {(s, 2) for s in ("text", "raw", "error")}
    for (scenario, _), row in rows.items():
        assert row["gateway_rps"] > 0
        assert 0 < row["gateway_p50_ms"] <= row["gateway_p99_ms"]  # parsed from wrk (NaN fails)
        assert row["gateway_cpu_ms"] > 0
        assert row["variant_rps"] > 0  # the gateway with tracing on, measured in the same rounds
        assert row["variant_cpu_ms"] > 0
        assert len(row["variant_adds_by_round"]) == 1  # one round: one pair
        assert (row["direct_rps"] is None) == (scenario == "error")
        # the reference gateway, measured in the same rounds (not on the error path)
        assert (row["reference_cpu_ms"] is None) == (scenario == "error")
        if scenario != "error":
            assert row["reference_rps"] > 0
            assert row["cpu_vs_reference"] > 0
            # the KServe transformer (its own venv in .cache), in the same rounds
            assert row["kserve_rps"] > 0
            assert row["cpu_vs_kserve"] > 0
        if scenario != "error":
            assert row["direct_rps"] > 0
            assert row["errors"] == 0
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert report["spans_received"] > 0  # the traced gateway (and Triton) really exported
    assert "variant adds" in result.stdout
    assert "Against the reference gateway" in result.stdout
    assert "a KServe 0.21 custom transformer" in result.stdout
    assert "GATEWAY_TRACING__ENABLED=true" in result.stdout
    assert report["machine"]["pinned"] == "Triton on CPU 0; gateway and load generators on CPU 1"


def test_bench_key_variants_check_keys_in_redis_and_verify_a_token(
    tmp_path: Path, triton_python_env: Path
) -> None:
    """The short forms of `make bench-shared-state` and `triton-gateway bench --token`, in
    one run: the base's callers send an API key, the variant's an OpenID Connect token
    (verified against a key set the bench serves) and its rate limits go through a real
    redis-server; none is refused."""
    out = tmp_path / "bench"
    result = subprocess.run(
        [
            sys.executable, "-m", "gateway", "bench",
            "--seconds", "1", "--rounds", "1", "--concurrency", "2",
            "--repositories", "trivial", "--scenarios", "text",
            "--out", str(out), "--triton-env", str(triton_python_env), "--shared-state", "--token",
            "--no-kserve",
        ],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert (
        "Variant: rate limits in Redis (both with an API key) callers with an OpenID Connect token"
        in result.stdout
    )
    (row,) = json.loads(out.with_suffix(".json").read_text())["rows"]
    assert row["errors"] == 0  # no 401 or 429: the key and the token were both taken, never limited
    assert row["gateway_rps"] > 0
    assert row["variant_rps"] > 0
    assert row["variant_cpu_ms"] > 0


def test_bench_measures_the_grpc_door_beside_triton_direct(tmp_path: Path, triton_python_env: Path) -> None:
    """The short form of `triton-gateway bench --grpc`: the door loaded by the same gRPC
    client as Triton direct and the same call on HTTP /v2 (wrk, binary tensors), its table
    printed and its measures recorded without errors."""
    out = tmp_path / "bench"
    result = subprocess.run(
        [
            sys.executable, "-m", "gateway", "bench",
            "--seconds", "1", "--rounds", "1", "--concurrency", "2",
            "--repositories", "trivial", "--scenarios", "text",
            "--out", str(out), "--triton-env", str(triton_python_env), "--grpc", "--no-kserve",
        ],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "The gRPC door" in result.stdout
    measures = json.loads(out.with_suffix(".json").read_text())["measures"]
    for target in ("door", "v2"):  # the gRPC door, and the same call on HTTP /v2
        found = [m for m in measures if m["target"] == target]
        assert found, target
        assert all(m["errors"] == 0 and m["requests"] > 0 and m["gateway_cpu_ms"] > 0 for m in found), found


def test_triton_config_bench_compares_instance_counts_and_queue_delays(
    tmp_path: Path, triton_python_env: Path
) -> None:
    out = tmp_path / "config"
    result = subprocess.run(
        [
            sys.executable, "-m", "gateway.bench.triton_config", "--model", "image_preprocess", "--variants", "count=1,delay=0",
            "count=2,delay=500", "--seconds", "1", "--rounds", "1", "--concurrency", "2",
            "--out", str(out), "--triton-env", str(triton_python_env),
        ],
        capture_output=True, text=True, timeout=400, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = {row["variant"]: row for row in json.loads(out.with_suffix(".json").read_text())["rows"]}
    assert set(rows) == {"count=1,delay=0us", "count=2,delay=500us"}
    for row in rows.values():
        assert row["rps"] > 0
        assert row["errors"] == 0
        assert 0 < row["p50_ms"] <= row["p99_ms"]
    assert "| count=2,delay=500us | 2 |" in result.stdout


def test_processes_bench_runs_one_and_two_gateways(tmp_path: Path, triton_python_env: Path) -> None:
    out = tmp_path / "processes.json"
    result = subprocess.run(
        [
            sys.executable, "-m", "gateway.bench.processes", "--seconds", "1", "--rounds", "1", "--concurrency", "4",
            "--scenarios", "text", "--out", str(out), "--triton-env", str(triton_python_env),
        ],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = {row["processes"]: row for row in json.loads(out.read_text())["rows"]}
    assert set(rows) == {1, 2}
    for row in rows.values():
        assert row["concurrency"] == 4
        assert row["rps"] > 0
        assert row["errors"] == 0
        assert 0 < row["p50_ms"] <= row["p99_ms"]
        assert row["gateway_cpu_ms"] > 0


def test_cost_ledger_attributes_a_profile_to_the_stages(tmp_path: Path, triton_python_env: Path) -> None:
    out = tmp_path / "ledger.json"
    result = subprocess.run(
        [sys.executable, "-m", "gateway.bench.ledger", "--seconds", "3", "--scenarios", "text",
         "--out", str(out), "--triton-env", str(triton_python_env)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (targets,) = json.loads(out.read_text()).values()
    gateway, reference = targets["gateway"], targets["reference"]
    for row in (gateway, reference):
        assert row.pop("cpu_ms") > 0
        assert abs(sum(row.values()) - 1) < 1e-6
        assert row.get("other", 0) < 0.1, row  # the rules name nearly every sample
    # real profiles of the real paths: the gateway's own stages show in its profile only
    # the access line is about 1 % of a request since it skips logging's machinery: a 3 s
    # profile may not catch it; it must not be back to what it cost through logging (5 %+)
    assert gateway.get("access log", 0.0) < 0.05, gateway
    for stage in (
        "gRPC call machinery (grpc.aio)",
        "metrics",
        "HTTP server (uvicorn, httptools)",
    ):
        assert gateway[stage] > 0, gateway
    assert "metrics" not in reference
    assert "| access log |" in result.stdout


def test_bench_capacity_sweeps_static_limits_and_the_gate(tmp_path: Path, triton_python_env: Path) -> None:
    """The short form of `make bench-capacity`: a static limit and the default (each model
    gated on Triton's batches) under a hey flood, and a refusal's CPU four ways (the gRPC
    door's too); well formed, and the flood really overloads (refusals) while the gate
    moved from its ceiling or held it. (One static limit, the ceiling: each flood costs a gateway start, about 6 s.)"""
    out = tmp_path / "capacity"
    result = subprocess.run(
        [
            sys.executable, "-m", "gateway.bench.capacity",
            "--seconds", "3", "--rounds", "2", "--clients", "40", "--limits", "16", "--speeds", "1",
            "--repository", "trivial", "--triton-env", str(triton_python_env), "--out", str(out),
            "--refusal-seconds", "1",
        ],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(out.with_suffix(".json").read_text())
    rows = {row["limit"]: row for row in report["rows"]}
    # two floods of each, interleaved; a row is their median, with their spread
    assert len(report["runs"]) == 2 * 2
    assert [run["limit"] for run in report["runs"]][:2] != [run["limit"] for run in report["runs"]][2:]
    for name in ("static 16", "gate"):
        row = rows[name]
        floods = [run for run in report["runs"] if run["limit"] == name]
        assert row["rounds"] == 2
        assert row["spread"]["goodput"] == [
            min(r["goodput"] for r in floods),
            max(r["goodput"] for r in floods),
        ]
        assert row["goodput"] == sum(r["goodput"] for r in floods) / 2  # the median of two
    [calm] = [name for name in rows if name.startswith("no storm, static ")]
    assert set(rows) == {"static 16", "gate", calm}
    for row in rows.values():
        assert row["goodput"] > 0
        assert 0 < row["p50_ms"] <= row["p99_ms"]
        assert row["other_statuses"] == {}  # 200 and 503 only
    assert rows["static 16"]["refused_per_second"] > 0  # 40 connections on 16 slots
    assert rows[calm]["refused_per_second"] == 0  # as many clients as slots
    assert 1 <= rows["gate"]["final_limit"] <= 16
    assert [v["adaptive"] for v in report["verdicts"]] == ["gate"]
    for verdict in report["verdicts"]:
        assert verdict["goodput_vs_best"] > 0
        assert verdict["storm_goodput_vs_calm"] > 0
        assert set(verdict["statics_meeting_ceiling_bound"]) <= {"static 16"}
    costs = {cost["way"]: cost for cost in report["refusal_cost"]}
    assert set(costs) == {
        "after the queue wait",
        "from the headers, in the route",
        "from the request head",
        "on the gRPC door, from its metadata",
    }
    for cost in costs.values():
        assert cost["refusals"] > 0
        assert cost["gateway_cpu_ms_per_answer"] > 0
        assert cost["storm_cores"] > 0
        assert cost["calm_goodput"] > 0
    assert "gate: goodput" in result.stdout
