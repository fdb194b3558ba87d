"""The gateway side by side with Triton direct, in the same run (`make bench`).

    .venv/bin/python -m gateway.bench.side_by_side [--seconds 5] [--rounds 3]
        [--concurrency 1 8 32] [--repositories trivial real] [--out .reports/bench]

For each model repository (``trivial``: gateway/bench/trivial_repository, Python models
with the real ensembles' inputs and outputs and fixed answers, so only the cost in front
of Triton shows; ``real``: model_repository on its CPU twins) it starts a real
tritonserver and a gateway process, then, interleaved over rounds (each in the reverse
order of the one before), loads:

- Triton direct: an async gRPC client (tritonclient.grpc.aio), the way the gateway calls it;
- the gateway: wrk (C, a few % of a core), posting the same inputs over HTTP;
- the reference gateway (gateway/bench/reference_gateway.py: FastAPI and
  tritonclient.grpc.aio, no checks, no metrics, no logs), loaded by wrk the same way: the
  yardstick of what the gateway's own work costs ("vs reference" columns).

A/B in the same run: ``--variant KEY=VALUE ...`` runs a second gateway process beside the
first with those GATEWAY_* settings, measured in the same interleaved rounds (the
"variant" columns, what it changes per request, and that change's spread over the
rounds' pairs). ``--tracing`` is the variant with
tracing on at 100 % sampling (spans to an OTLP receiver in this process; Triton started
with OpenTelemetry, tracing exactly the requests that carry a traceparent).

``--pin`` puts Triton (with its stubs) on CPU 0, and the gateway and the load generators
(this process, so the direct client, and wrk) on CPU 1: each side gets a core of its own.

Scenarios: one text, one ~250 KiB JPEG, eight JPEGs in one request, and an error path
(gateway only: a body that is not an image, refused before Triton). It reports req/s,
p50/p99, the ratio to direct, and CPU per request of the gateway and of Triton (with its
stubs), from the processes' own CPU time, so the figure does not depend on how busy the
machine is. Writes <out>.json and <out>.png (throughput and p99 against concurrency).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import tritonclient.grpc.aio as grpcclient
from PIL import Image

from gateway.dev.gatewayprocess import GatewayProcess
from gateway.dev.otlpsink import OtlpReceiver
from gateway.dev.redisserver import RedisServer
from gateway.dev.tritonserver import TritonServer, free_port, free_ports
from gateway.observe.tracing import triton_trace_args
from gateway.settings import TracingSettings
from gateway.shared.keyfiles import hash_key
from gateway.triton.tensors import encode_bytes

ROOT = Path(__file__).resolve().parents[2]
REPOSITORIES = {
    "trivial": Path(__file__).resolve().with_name("trivial_repository"),
    "real": ROOT / "model_repository",
}
SENTENCE = "The striker scored twice in the final minutes of the match."


def photo_jpeg() -> bytes:
    """About 250 KiB: a real photo at 1200x1200, quality 90."""
    from skimage import data

    photo = data.astronaut()  # type: ignore[no-untyped-call]
    image = Image.fromarray(photo).resize((1200, 1200), Image.Resampling.BICUBIC)
    buffer = io.BytesIO()
    image.save(buffer, "JPEG", quality=90)
    return buffer.getvalue()


@dataclass(frozen=True)
class Scenario:
    name: str
    http_body: bytes
    http_type: str
    direct: Callable[[], tuple[str, list[grpcclient.InferInput]]] | None  # model, inputs
    # the same call on /v2 with the binary tensor extension: model, body, JSON header length
    v2: Callable[[], tuple[str, bytes, int]] | None = None


def _tensor(name: str, array: np.ndarray, datatype: str) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def _v2_body(tensors: list[tuple[str, str, np.ndarray]]) -> tuple[bytes, int]:
    """An OIP request in the binary tensor extension (what tritonclient.http sends): a JSON
    header and the raw tensors; with its header's length."""
    raws = [
        encode_bytes([bytes(item) for item in array.reshape(-1)])
        if datatype == "BYTES"
        else np.ascontiguousarray(array, dtype=array.dtype.newbyteorder("<")).tobytes()
        for _, datatype, array in tensors
    ]
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": name,
                    "shape": list(array.shape),
                    "datatype": datatype,
                    "parameters": {"binary_data_size": len(raw)},
                }
                for (name, datatype, array), raw in zip(tensors, raws, strict=True)
            ],
            "parameters": {"binary_data_output": True},
        }
    ).encode()
    return header + b"".join(raws), len(header)


def scenarios() -> list[Scenario]:
    jpeg = photo_jpeg()
    boundary = "benchboundary"

    def multipart(count: int) -> bytes:
        parts = [
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{i}.jpg"\r\n'
            f"Content-Type: image/jpeg\r\n\r\n".encode()
            + jpeg
            + b"\r\n"
            for i in range(count)
        ]
        return b"".join(parts) + f"--{boundary}--\r\n".encode()

    def images(count: int) -> tuple[str, list[grpcclient.InferInput]]:
        blobs = np.array([[jpeg]] * count, dtype=np.object_)
        top_k = np.full((count, 1), 5, dtype=np.int32)
        return "image_classifier", [_tensor("IMAGE", blobs, "BYTES"), _tensor("TOP_K", top_k, "INT32")]

    def text() -> tuple[str, list[grpcclient.InferInput]]:
        texts = np.array([[SENTENCE.encode()]], dtype=np.object_)
        return "text_classifier", [
            _tensor("TEXT", texts, "BYTES"),
            _tensor("TOP_K", np.array([[5]], dtype=np.int32), "INT32"),
        ]

    def images_v2(count: int) -> tuple[str, bytes, int]:
        blobs = np.array([[jpeg]] * count, dtype=np.object_)
        top_k = np.full((count, 1), 5, dtype=np.int32)
        return "image_classifier", *_v2_body([("IMAGE", "BYTES", blobs), ("TOP_K", "INT32", top_k)])

    def text_v2() -> tuple[str, bytes, int]:
        texts = np.array([[SENTENCE.encode()]], dtype=np.object_)
        top_k = np.array([[5]], dtype=np.int32)
        return "text_classifier", *_v2_body([("TEXT", "BYTES", texts), ("TOP_K", "INT32", top_k)])

    multipart_type = f"multipart/form-data; boundary={boundary}"
    encoded = json.dumps({"image": base64.b64encode(jpeg).decode()}).encode()
    size = f"{len(jpeg) // 1024} KiB"
    return [
        Scenario("text", json.dumps({"text": SENTENCE}).encode(), "application/json", text, text_v2),
        Scenario(f"raw jpeg {size}", jpeg, "image/jpeg", lambda: images(1), lambda: images_v2(1)),
        Scenario(f"multipart jpeg {size}", multipart(1), multipart_type, lambda: images(1)),
        Scenario(f"base64 json jpeg {size}", encoded, "application/json", lambda: images(1)),
        Scenario("8 jpegs (multipart)", multipart(8), multipart_type, lambda: images(8)),
        Scenario("error (not an image)", b"not an image at all", "image/jpeg", None),
    ]


@dataclass
class Measure:
    repository: str
    scenario: str
    target: str  # direct | gateway | variant (the gateway with --variant settings) | reference | kserve
    concurrency: int
    requests: int = 0
    errors: int = 0
    seconds: float = 0.0
    p50_ms: float = float("nan")
    p99_ms: float = float("nan")
    gateway_cpu_ms: float = float("nan")  # per request
    triton_cpu_ms: float = float("nan")  # per request, stubs included

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0


def _cpu_seconds(pid: int, with_children: bool) -> float:
    process = psutil.Process(pid)
    members = [process, *process.children(recursive=True)] if with_children else [process]
    total = 0.0
    for member in members:
        times = member.cpu_times()
        total += times.user + times.system
    return total


async def _direct(
    url: str, scenario: Scenario, concurrency: int, seconds: float
) -> tuple[int, int, list[float]]:
    assert scenario.direct is not None
    latencies: list[float] = []
    errors = 0
    model, inputs = scenario.direct()
    until = time.perf_counter() + seconds
    async with grpcclient.InferenceServerClient(url) as client:

        async def loop() -> None:
            nonlocal errors
            while time.perf_counter() < until:
                started = time.perf_counter()
                try:
                    await client.infer(model, inputs)
                except Exception:
                    errors += 1
                    continue
                latencies.append(time.perf_counter() - started)

        await asyncio.gather(*(loop() for _ in range(concurrency)))
    return len(latencies), errors, latencies


def percentiles_ms(latencies: list[float]) -> tuple[float, float]:
    """p50 and p99 in ms of latencies in seconds (NaN when there are none)."""
    if not latencies:
        return float("nan"), float("nan")
    ordered = sorted(latencies)
    return 1000 * ordered[len(ordered) // 2], 1000 * ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


_LATENCY = re.compile(r"^\s+(50|99)%\s+([\d.]+)(us|ms|s)\s*$", re.MULTILINE)


# With --shared-state both gateways take API keys and wrk sends this one (its limit is far
# above any rate reached: every request is checked, none refused).
BENCH_KEY = "bench-key"
SEND_KEY = False
# With --token, the variant's requests carry this bearer token instead of the key.
VARIANT_AUTHORIZATION = ""


def _wrk(
    url: str,
    scenario: Scenario,
    concurrency: int,
    seconds: float,
    folder: Path,
    v2: tuple[bytes, int] | None = None,
    variant: bool = False,
) -> tuple[int, int, float, float]:
    """wrk posting the scenario's /classify body (``v2``: that /v2 body and header length)."""
    body = folder / "body.bin"
    body.write_bytes(scenario.http_body if v2 is None else v2[0])
    script = folder / "post.lua"
    key = f'wrk.headers["X-API-Key"] = "{BENCH_KEY}"\n' if SEND_KEY else ""
    if variant and VARIANT_AUTHORIZATION:
        key = f'wrk.headers["Authorization"] = "{VARIANT_AUTHORIZATION}"\n'
    if v2 is not None:
        key += f'wrk.headers["Inference-Header-Content-Length"] = "{v2[1]}"\n'
    content_type = scenario.http_type if v2 is None else "application/octet-stream"
    script.write_text(
        f'wrk.method = "POST"\nlocal f = io.open("{body}", "rb")\nwrk.body = f:read("*a")\nf:close()\n'
        f'wrk.headers["Content-Type"] = "{content_type}"\n{key}'
        "done = function(summary, latency, requests)\n"
        '  io.write(string.format("STATUS-ERRORS %d\\n", summary.errors.status + summary.errors.connect'
        " + summary.errors.read + summary.errors.write + summary.errors.timeout))\nend\n"
    )
    threads = min(2, concurrency)
    out = subprocess.run(
        ["wrk", "-t", str(threads), "-c", str(concurrency), "-d", f"{max(1, round(seconds))}s", "--latency", "-s", str(script),
         url],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    requests = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    errors = int(re.search(r"STATUS-ERRORS (\d+)", out).group(1))  # type: ignore[union-attr]
    scale = {"us": 0.001, "ms": 1.0, "s": 1000.0}
    found = {p: float(v) * scale[u] for p, v, u in _LATENCY.findall(out)}
    return requests, errors, found.get("50", float("nan")), found.get("99", float("nan"))


PINNED = "Triton on CPU 0; gateway and load generators on CPU 1"


def pin(pid: int, cpu: int, with_children: bool = True) -> None:
    """Every thread of ``pid`` (and of its children) on ``cpu``: affinity is per thread,
    so ``taskset -a``."""
    process = psutil.Process(pid)
    members = [process, *process.children(recursive=True)] if with_children else [process]
    for member in members:
        subprocess.run(
            ["taskset", "-a", "-p", "-c", str(cpu), str(member.pid)], check=True, capture_output=True
        )


@dataclass
class Stack:
    triton: TritonServer
    gateway: GatewayProcess
    reference: GatewayProcess  # gateway/bench/reference_gateway.py
    variant: GatewayProcess | None = None  # the same gateway with other settings (--variant)
    kserve: GatewayProcess | None = None  # gateway/bench/kserve_transformer.py
    door: str = ""  # the gateway's gRPC door (host:port), with --grpc
    variant_door: str = ""  # the variant's, with --grpc and a variant

    def process(self, target: str) -> GatewayProcess:
        if target in ("variant", "variant-door", "variant-v2"):
            assert self.variant is not None
            return self.variant
        if target == "kserve":
            assert self.kserve is not None
            return self.kserve
        if target == "reference":
            return self.reference
        return self.gateway

    def url(self, target: str) -> str:
        """Where a target takes /classify's bodies."""
        if target == "kserve":
            return f"{self.process(target).url}/v1/models/classify:predict"
        return f"{self.process(target).url}/classify"

    def pin(self) -> None:
        """PINNED (the load generators are this process and its wrk children)."""
        assert self.triton.pid is not None
        pin(self.triton.pid, 0)
        for gateway in (self.gateway, self.variant, self.reference, self.kserve):
            if gateway is not None:
                pin(gateway.process.pid, 1)
        pin(os.getpid(), 1, with_children=False)

    def stop(self) -> None:
        for gateway in (self.gateway, self.variant, self.reference, self.kserve):
            if gateway is not None:
                gateway.stop(graceful=True)
        self.triton.kill()


def start_reference(triton: TritonServer, workdir: Path) -> GatewayProcess:
    """The reference gateway in a process of its own, in front of ``triton``."""
    port = free_port()
    log = workdir / f"reference-{port}.log"
    script = Path(__file__).with_name("reference_gateway.py")
    with log.open("wb") as sink:
        process = subprocess.Popen(
            [sys.executable, str(script), "--port", str(port), "--triton", triton.grpc_url],
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    return GatewayProcess(process, port, log).wait("/livez", timeout=60)


KSERVE = "kserve==0.21.0"


def kserve_python(cache: Path) -> Path:
    """The Python of a virtual environment holding KServe (made on first use, ~1 min): the
    transformer never shares the gateway's packages."""
    env = cache / KSERVE.replace("==", "-")
    python = env / "bin" / "python"
    if not (env / ".installed").exists():
        print(f"installing {KSERVE} into {env} (first use)", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(env)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", KSERVE],
            check=True,
        )
        (env / ".installed").touch()
    return python


def start_kserve(triton: TritonServer, workdir: Path, python: Path) -> GatewayProcess:
    """The KServe transformer (its ModelServer, one worker) in front of ``triton``: one access
    log line per request, as the gateway writes (KServe's latency lines off)."""
    port = free_port()
    log = workdir / f"kserve-{port}.log"
    script = Path(__file__).with_name("kserve_transformer.py")
    command = [str(python), str(script), "--model_name", "classify", "--http_port", str(port),
               "--predictor_host", triton.grpc_url, "--predictor_protocol", "grpc-v2",
               "--enable_latency_logging", "false"]  # fmt: skip
    with log.open("wb") as sink:
        process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
    return GatewayProcess(process, port, log).wait("/v1/models/classify", timeout=120)


def start_stack(
    repository: Path,
    workdir: Path,
    triton_env: Path,
    trace_endpoint: str | None,
    variant: dict[str, str] | None,
    base: dict[str, str] | None = None,
    kserve: Path | None = None,
) -> Stack:
    # Without a response cache: every request does the models' work.
    tracing = TracingSettings(
        enabled=trace_endpoint is not None, endpoint=trace_endpoint or "http://127.0.0.1:1/"
    )
    triton = TritonServer.on_free_ports(
        triton_env, repository, workdir, response_cache_bytes=0, extra_args=tuple(triton_trace_args(tracing))
    )
    triton.start()
    triton.wait_ready(timeout=180)
    gateway = GatewayProcess.start(triton, workdir, cwd=workdir, env=base)
    stack = Stack(triton, gateway.wait("/readyz", timeout=60), start_reference(triton, workdir))
    if variant is not None:
        other = GatewayProcess.start(triton, workdir, cwd=workdir, env={**(base or {}), **variant})
        stack.variant = other.wait("/readyz", timeout=60)
    if kserve is not None:
        stack.kserve = start_kserve(triton, workdir, kserve)
    return stack


def in_turn(targets: list[str], turn: int) -> list[str]:
    """The order a round measures its targets in: as given, then reversed the next round, so
    no target always runs after the same one and a place in the order does not read as a
    difference. (In the fixed order, the variant right after the gateway, the same code in
    a second process read 0.07-0.08 ms a request cheaper, 2026-11-30; its rounds' pairs
    spread -0.23 to +0.27 ms, so that was no proof of a place's effect either.)"""
    return targets if turn % 2 == 0 else targets[::-1]


def measure(
    stack: Stack, name: str, scenario: Scenario, target: str, concurrency: int, seconds: float, folder: Path
) -> Measure:
    result = Measure(name, scenario.name, target, concurrency)
    assert stack.triton.pid is not None
    gateway = stack.process(target)
    gateway_before = _cpu_seconds(gateway.process.pid, with_children=False)
    triton_before = _cpu_seconds(stack.triton.pid, with_children=True)
    started = time.perf_counter()
    if target in ("direct", "door", "variant-door"):
        # the same gRPC client and calls: Triton's endpoint, or a gateway's door in front of it
        address = {"direct": stack.triton.grpc_url, "door": stack.door, "variant-door": stack.variant_door}[
            target
        ]
        result.requests, result.errors, latencies = asyncio.run(
            _direct(address, scenario, concurrency, seconds)
        )
        result.p50_ms, result.p99_ms = percentiles_ms(latencies)
    elif target in ("v2", "variant-v2"):
        assert scenario.v2 is not None
        model, body, header_length = scenario.v2()
        result.requests, result.errors, result.p50_ms, result.p99_ms = _wrk(
            f"{gateway.url}/v2/models/{model}/infer",
            scenario,
            concurrency,
            seconds,
            folder,
            (body, header_length),
            variant=target == "variant-v2",
        )
    else:
        result.requests, result.errors, result.p50_ms, result.p99_ms = _wrk(
            stack.url(target), scenario, concurrency, seconds, folder, variant=target == "variant"
        )
    result.seconds = time.perf_counter() - started
    if result.requests:
        result.gateway_cpu_ms = (
            1000 * (_cpu_seconds(gateway.process.pid, False) - gateway_before) / result.requests
        )
        result.triton_cpu_ms = 1000 * (_cpu_seconds(stack.triton.pid, True) - triton_before) / result.requests
    return result


@dataclass
class Row:
    repository: str
    scenario: str
    concurrency: int
    direct_rps: float | None
    gateway_rps: float
    ratio: float | None
    direct_p50_ms: float | None
    direct_p99_ms: float | None
    gateway_p50_ms: float
    gateway_p99_ms: float
    gateway_cpu_ms: float
    triton_cpu_ms_direct: float | None
    triton_cpu_ms_gateway: float
    errors: int = 0
    rounds: list[dict[str, float]] = field(default_factory=list)
    variant_rps: float | None = None
    variant_cpu_ms: float | None = None  # the variant gateway's
    variant_triton_cpu_ms: float | None = None  # Triton's, for the variant's requests
    reference_rps: float | None = None
    reference_cpu_ms: float | None = None  # the reference gateway's, per request
    kserve_rps: float | None = None
    kserve_cpu_ms: float | None = None  # the KServe transformer's, per request
    # the variant's CPU per request less the gateway's, round by round (each pair measured
    # one after the other): its spread is what one A/B on this machine can resolve
    variant_adds_by_round: list[float] = field(default_factory=list)

    @property
    def cpu_vs_reference(self) -> float | None:
        """The gateway's CPU per request over the reference gateway's (1.0: as cheap)."""
        return self.gateway_cpu_ms / self.reference_cpu_ms if self.reference_cpu_ms else None

    @property
    def cpu_vs_kserve(self) -> float | None:
        """The gateway's CPU per request over the KServe transformer's (below 1.0: cheaper)."""
        return self.gateway_cpu_ms / self.kserve_cpu_ms if self.kserve_cpu_ms else None

    @property
    def variant_adds_cpu_ms(self) -> float | None:
        return None if self.variant_cpu_ms is None else self.variant_cpu_ms - self.gateway_cpu_ms


def summarise(measures: list[Measure]) -> list[Row]:
    rows = []
    keys = sorted(
        {(m.repository, m.scenario, m.concurrency) for m in measures}, key=lambda k: (k[0], k[1], k[2])
    )
    for repository, scenario, concurrency in keys:
        mine = [
            m
            for m in measures
            if (m.repository, m.scenario, m.concurrency) == (repository, scenario, concurrency)
        ]
        direct = [m for m in mine if m.target == "direct"]
        gateway = [m for m in mine if m.target == "gateway"]

        def med(items: list[Measure], attribute: str) -> float:
            return float(statistics.median(getattr(m, attribute) for m in items))

        variant = [m for m in mine if m.target == "variant"]
        reference = [m for m in mine if m.target == "reference"]
        kserve = [m for m in mine if m.target == "kserve"]
        direct_rps = med(direct, "rps") if direct else None
        gateway_rps = med(gateway, "rps")
        rows.append(
            Row(
                repository, scenario, concurrency, direct_rps, gateway_rps,
                gateway_rps / direct_rps if direct_rps else None,
                med(direct, "p50_ms") if direct else None, med(direct, "p99_ms") if direct else None,
                med(gateway, "p50_ms"), med(gateway, "p99_ms"), med(gateway, "gateway_cpu_ms"),
                med(direct, "triton_cpu_ms") if direct else None, med(gateway, "triton_cpu_ms"),
                sum(m.errors for m in mine), [],
                med(variant, "rps") if variant else None,
                med(variant, "gateway_cpu_ms") if variant else None,
                med(variant, "triton_cpu_ms") if variant else None,
                med(reference, "rps") if reference else None,
                med(reference, "gateway_cpu_ms") if reference else None,
                med(kserve, "rps") if kserve else None,
                med(kserve, "gateway_cpu_ms") if kserve else None,
                variant_adds_by_round=[
                    theirs.gateway_cpu_ms - ours.gateway_cpu_ms
                    for ours, theirs in zip(gateway, variant, strict=True)
                ] if variant else [],
            )
        )  # fmt: skip
    return rows


def door_table(measures: list[Measure]) -> str:
    """The gRPC door beside Triton's gRPC endpoint (the same client and calls) and the
    gateway's HTTP route: throughput, latency, and the gateway's CPU per request each way."""
    lines = [
        "",
        "The gRPC door (the same tritonclient.grpc.aio client as Triton direct):",
        "",
        "| models | scenario | c | req/s (Triton direct / door / HTTP /v2) | door p50/p99 ms | gateway CPU "
        "ms/req (door / HTTP /v2 / HTTP /classify) | Triton CPU ms/req (direct / via door) "
        "| variant's door req/s, CPU ms/req | variant's /v2 req/s, CPU ms/req |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    keys = sorted({(m.repository, m.scenario, m.concurrency) for m in measures if m.target == "door"})
    for repository, scenario, concurrency in keys:
        mine = [
            m
            for m in measures
            if (m.repository, m.scenario, m.concurrency) == (repository, scenario, concurrency)
        ]

        def med(target: str, attribute: str, mine: list[Measure] = mine) -> float:
            found = [getattr(m, attribute) for m in mine if m.target == target]
            return float(statistics.median(found)) if found else float("nan")

        lines.append(
            f"| {repository} | {scenario} | {concurrency} | {med('direct', 'rps'):.0f} / {med('door', 'rps'):.0f} "
            f"/ {med('v2', 'rps'):.0f} | {med('door', 'p50_ms'):.1f} / {med('door', 'p99_ms'):.1f} "
            f"| {med('door', 'gateway_cpu_ms'):.2f} / {med('v2', 'gateway_cpu_ms'):.2f} "
            f"/ {med('gateway', 'gateway_cpu_ms'):.2f} "
            f"| {med('direct', 'triton_cpu_ms'):.2f} / {med('door', 'triton_cpu_ms'):.2f} "
            f"| {med('variant-door', 'rps'):.0f}, {med('variant-door', 'gateway_cpu_ms'):.2f} "
            f"| {med('variant-v2', 'rps'):.0f}, {med('variant-v2', 'gateway_cpu_ms'):.2f} |"
        )
    return "\n".join(lines)


def table(rows: list[Row], variant_label: str = "") -> str:
    def fmt(value: float | None, spec: str) -> str:
        return "-" if value is None else format(value, spec)

    lines = [
        "| models | scenario | c | direct req/s | gateway req/s | ratio | direct p50/p99 ms | gateway p50/p99 ms "
        "| gateway CPU ms/req | Triton CPU ms/req (direct / via gateway) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.repository} | {r.scenario} | {r.concurrency} | {fmt(r.direct_rps, '.0f')} | {r.gateway_rps:.0f} | "
            f"{fmt(r.ratio and 100 * r.ratio, '.0f')}{'' if r.ratio is None else ' %'} | "
            f"{fmt(r.direct_p50_ms, '.1f')} / {fmt(r.direct_p99_ms, '.1f')} | {r.gateway_p50_ms:.1f} / "
            f"{r.gateway_p99_ms:.1f} | {r.gateway_cpu_ms:.2f} | {fmt(r.triton_cpu_ms_direct, '.2f')} / "
            f"{r.triton_cpu_ms_gateway:.2f} |"
        )
    against = [r for r in rows if r.reference_cpu_ms is not None]
    if against:
        lines += [
            "",
            "Against the reference gateway (FastAPI + tritonclient.grpc.aio, no checks, metrics or logs)",
            "and a KServe 0.21 custom transformer (its ModelServer, one worker, one log line per request):",
            "",
            "| models | scenario | c | req/s (reference / KServe / gateway) | CPU ms/req (reference / KServe / gateway) "
            "| gateway / reference CPU (x) | gateway / KServe CPU (x) |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in against:
            lines.append(
                f"| {r.repository} | {r.scenario} | {r.concurrency} | {fmt(r.reference_rps, '.0f')} / "
                f"{fmt(r.kserve_rps, '.0f')} / {r.gateway_rps:.0f} | {fmt(r.reference_cpu_ms, '.2f')} / "
                f"{fmt(r.kserve_cpu_ms, '.2f')} / {r.gateway_cpu_ms:.2f} | {fmt(r.cpu_vs_reference, '.2f')} "
                f"| {fmt(r.cpu_vs_kserve, '.2f')} |"
            )
    compared = [r for r in rows if r.variant_cpu_ms is not None]
    if compared:
        lines += [
            "",
            f"Variant: {variant_label}",
            "",
            "| models | scenario | c | gateway req/s (base / variant) | gateway CPU ms/req (base / variant) "
            "| variant adds | its rounds, each pair | Triton CPU ms/req (base / variant) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in compared:
            paired = r.variant_adds_by_round
            spread = f"{min(paired):+.2f} to {max(paired):+.2f} ms" if paired else "-"
            lines.append(
                f"| {r.repository} | {r.scenario} | {r.concurrency} | {r.gateway_rps:.0f} / {fmt(r.variant_rps, '.0f')} "
                f"| {r.gateway_cpu_ms:.2f} / {fmt(r.variant_cpu_ms, '.2f')} | {fmt(r.variant_adds_cpu_ms, '+.2f')} ms "
                f"| {spread} | {r.triton_cpu_ms_gateway:.2f} / {fmt(r.variant_triton_cpu_ms, '.2f')} |"
            )
    return "\n".join(lines)


def plot(rows: list[Row], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({(r.repository, r.scenario) for r in rows})
    figure, axes = plt.subplots(2, len(groups), figsize=(4 * len(groups), 7), squeeze=False)
    for column, (repository, scenario) in enumerate(groups):
        mine = sorted(
            (r for r in rows if (r.repository, r.scenario) == (repository, scenario)),
            key=lambda r: r.concurrency,
        )
        xs = [r.concurrency for r in mine]
        top, bottom = axes[0][column], axes[1][column]
        if all(r.direct_rps is not None for r in mine):
            top.plot(xs, [r.direct_rps for r in mine], "o-", label="Triton direct")
            bottom.plot(xs, [r.direct_p99_ms for r in mine], "o-", label="Triton direct")
        top.plot(xs, [r.gateway_rps for r in mine], "s-", label="gateway")
        bottom.plot(xs, [r.gateway_p99_ms for r in mine], "s-", label="gateway")
        top.set_title(f"{repository}: {scenario}", fontsize=9)
        top.set_ylabel("req/s")
        bottom.set_ylabel("p99 ms")
        bottom.set_xlabel("concurrency")
        for axis in (top, bottom):
            axis.set_xscale("log", base=2)
            axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=90)


def perf_analyzer_rows(stack: Stack, workdir: Path, concurrencies: list[int]) -> list[dict[str, Any]]:
    """NVIDIA's perf_analyzer on both shipped models, Triton direct (HTTP) and then the
    gateway's /v2, at each concurrency: throughput and p50/p99 as it reports them."""
    from gateway.bench import perfanalyzer

    jpeg = photo_jpeg()
    inputs: dict[str, dict[str, object]] = {
        "image_classifier": {"IMAGE": perfanalyzer.bytes_input(jpeg), "TOP_K": [5]},
        "text_classifier": {"TEXT": perfanalyzer.bytes_input(SENTENCE.encode()), "TOP_K": [5]},
    }
    rows: list[dict[str, Any]] = []
    for model, row in inputs.items():
        data = perfanalyzer.input_data(workdir / f"pa-{model}.json", [row])
        for concurrency in concurrencies:
            for target, url in (("direct", f"127.0.0.1:{stack.triton.http_port}"),
                                ("gateway", stack.gateway.url.removeprefix("http://"))):  # fmt: skip
                report = workdir / f"pa-{model}-{target}-{concurrency}.csv"
                command = [*perfanalyzer.command(), "-m", model, "-u", url, "-i", "http", "--input-data", str(data),
                           "--concurrency-range", str(concurrency), "--measurement-interval", "3000",
                           "--stability-percentage", "100", "--max-trials", "6", "--percentile", "99", "-f", str(report)]  # fmt: skip
                done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
                if done.returncode != 0:
                    raise SystemExit(f"perf_analyzer failed on {target} {model}:\n{done.stdout[-2000:]}")
                header, values = report.read_text().splitlines()[:2]
                fields = dict(zip(header.split(","), values.split(","), strict=False))
                rows.append({"model": model, "target": target, "concurrency": concurrency,
                             "throughput": float(fields["Inferences/Second"]),
                             "p50_us": float(fields["p50 latency"]), "p99_us": float(fields["p99 latency"])})  # fmt: skip
    return rows


def perf_analyzer_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "perf_analyzer (HTTP): Triton direct vs the gateway's /v2",
        f"{'model':18} {'c':>3} {'direct/s':>9} {'gateway/s':>10} {'ratio':>6} {'p99 direct':>11} {'p99 gateway':>12}",
    ]
    for direct in (r for r in rows if r["target"] == "direct"):
        gateway = next(
            r
            for r in rows
            if r["target"] == "gateway"
            and r["model"] == direct["model"]
            and r["concurrency"] == direct["concurrency"]
        )
        ratio = gateway["throughput"] / max(direct["throughput"], 1e-9)
        lines.append(
            f"{direct['model']:18} {direct['concurrency']:>3} {direct['throughput']:9.1f} "
            f"{gateway['throughput']:10.1f} {ratio:6.2f} {direct['p99_us'] / 1000:9.1f}ms "
            f"{gateway['p99_us'] / 1000:10.1f}ms"
        )
    return "\n".join(lines)


def _bench_keys(folder: Path) -> str:
    """A keys file holding BENCH_KEY, its limit far above any rate reached."""
    keys = folder / "keys"
    keys.write_text(f"bench {hash_key(BENCH_KEY)} 1000000 1000000\n")
    return str(keys)


def token_issuer() -> tuple[dict[str, str], str]:
    """An issuer whose key set is served on a loopback port for the rest of the process
    (read at the gateway's start only), and an hour's token it signed (RS256)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    import jwt
    from cryptography.hazmat.primitives.asymmetric import rsa
    from jwt.algorithms import RSAAlgorithm

    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = json.loads(RSAAlgorithm.to_jwk(private.public_key()))
    jwk.update(kid="bench", use="sig", alg="RS256")
    document = json.dumps({"keys": [jwk]}).encode()

    class KeySet(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(document)))
            self.end_headers()
            self.wfile.write(document)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), KeySet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    issuer = {
        "issuer": "https://bench.invalid",
        "audience": "triton-gateway-bench",
        "jwks_uri": f"http://127.0.0.1:{server.server_address[1]}/jwks",
    }
    now = int(time.time())
    claims = {"iss": issuer["issuer"], "aud": issuer["audience"], "client_id": "bench", "exp": now + 3600}
    return issuer, jwt.encode(claims, private, algorithm="RS256", headers={"kid": "bench"})


def _worktree(ref: str, path: Path) -> Path:
    """This checkout's code at ``ref`` in a detached worktree at ``path`` (removed by git
    when the folder goes: `git worktree prune`)."""
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", "--quiet", str(path), ref], check=True
    )
    subprocess.run(["git", "-C", str(ROOT), "worktree", "prune"], check=False)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument(
        "--repositories", nargs="+", choices=sorted(REPOSITORIES), default=["trivial", "real"]
    )
    parser.add_argument("--scenarios", nargs="+", help="names to keep (default: all)")
    parser.add_argument("--out", type=Path, default=ROOT / ".reports" / "bench")
    parser.add_argument("--triton-env", type=Path, default=ROOT / ".venv-triton")
    parser.add_argument(
        "--variant",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="GATEWAY_* settings of a second gateway (A/B)",
    )
    parser.add_argument("--tracing", action="store_true", help="the variant: tracing on at 100 %% sampling")
    parser.add_argument(
        "--shared-state",
        action="store_true",
        help="the variant: rate limits in a real redis-server (both gateways check an API key "
        "with a limit; the base keeps its buckets in its own memory)",
    )
    parser.add_argument(
        "--token",
        action="store_true",
        help="the variant: callers send an OpenID Connect access token (RS256, verified against a "
        "key set served here) where the base's send an API key",
    )
    parser.add_argument(
        "--against",
        metavar="GIT_REF",
        help="the variant: the gateway's code at GIT_REF (a git worktree of this checkout), "
        "same settings: an A/B of two versions in the same rounds",
    )
    parser.add_argument(
        "--no-kserve",
        action="store_true",
        help=f"leave out the KServe transformer ({KSERVE} in .cache/, installed on first use)",
    )
    parser.add_argument(
        "--grpc",
        action="store_true",
        help="also the gateway's gRPC door (GATEWAY_GRPC__PORT), loaded by the same gRPC client as "
        "Triton direct: its own table beside the HTTP figures",
    )
    parser.add_argument("--pin", action="store_true", help=PINNED)
    parser.add_argument(
        "--perf-analyzer",
        action="store_true",
        help="also NVIDIA's perf_analyzer on the real models, Triton's HTTP endpoint against the "
        "gateway's /v2 (installed on first use: gateway/bench/perfanalyzer.py)",
    )
    options = parser.parse_args(argv)
    variant_env = dict(item.split("=", 1) for item in options.variant)
    base_env: dict[str, str] = {}
    if shutil.which("wrk") is None:
        raise SystemExit("wrk is missing: `make bench` installs it (apt)")
    chosen = [
        s
        for s in scenarios()
        if not options.scenarios or any(s.name.startswith(n) for n in options.scenarios)
    ]
    measures: list[Measure] = []
    analysed: list[dict[str, Any]] = []
    kserve = None if options.no_kserve else kserve_python(ROOT / ".cache")
    references = ["reference"] + ([] if kserve is None else ["kserve"])
    with tempfile.TemporaryDirectory(prefix="bench-") as folder, OtlpReceiver() as receiver:
        if options.against:
            variant_env["PYTHONPATH"] = str(_worktree(options.against, Path(folder) / "against"))
        if options.tracing:
            variant_env.update(
                GATEWAY_TRACING__ENABLED="true",
                GATEWAY_TRACING__ENDPOINT=receiver.endpoint,
                GATEWAY_TRACING__SAMPLE_RATIO="1.0",
            )
        if options.shared_state:
            global SEND_KEY
            SEND_KEY = True
            base_env["GATEWAY_AUTH__KEYS_FILE"] = _bench_keys(Path(folder))
            redis = RedisServer(Path(folder) / "redis").start()
            variant_env["GATEWAY_REDIS__URL"] = redis.url
        if options.token:
            global VARIANT_AUTHORIZATION
            SEND_KEY = True
            base_env["GATEWAY_AUTH__KEYS_FILE"] = _bench_keys(Path(folder))
            issuer, token = token_issuer()
            variant_env["GATEWAY_AUTH__OIDC"] = json.dumps([issuer])
            VARIANT_AUTHORIZATION = f"Bearer {token}"
        if options.grpc:
            door, variant_door = free_ports(2)
            base_env["GATEWAY_GRPC__PORT"] = str(door)
            if variant_env:  # a door of its own (gRPC would share one port between both)
                variant_env["GATEWAY_GRPC__PORT"] = str(variant_door)
        gateways = ["gateway", "variant"] if variant_env else ["gateway"]
        # and "v2" where the scenario has a /v2 form
        doors = (["door", "variant-door"] if variant_env else ["door"]) if options.grpc else []
        v2s = ["v2", "variant-v2"] if variant_env else ["v2"]  # /v2, measured beside the door
        for name in options.repositories:
            workdir = Path(folder) / name
            workdir.mkdir()
            endpoint = receiver.endpoint if options.tracing else None
            stack = start_stack(
                REPOSITORIES[name],
                workdir,
                options.triton_env,
                endpoint,
                variant_env or None,
                base_env,
                kserve,
            )
            if options.grpc:
                stack.door = f"127.0.0.1:{base_env['GATEWAY_GRPC__PORT']}"
                if variant_env:
                    stack.variant_door = f"127.0.0.1:{variant_env['GATEWAY_GRPC__PORT']}"
            try:
                if options.pin:
                    stack.pin()
                for scenario in chosen:  # warm every path once
                    if scenario.direct:
                        measure(stack, name, scenario, "direct", 1, 0.5, workdir)
                        for target in [*references, *doors, *(v2s if doors and scenario.v2 else [])]:
                            measure(stack, name, scenario, target, 1, 1, workdir)
                    for target in gateways:
                        measure(stack, name, scenario, target, 1, 1, workdir)
                if options.perf_analyzer and name == "real":
                    analysed.extend(perf_analyzer_rows(stack, workdir, options.concurrency))
                for turn in range(options.rounds):
                    for scenario in chosen:
                        for concurrency in options.concurrency:
                            # the reference has no checks: it is not measured on the error path
                            targets = (["direct", *references, *doors] if scenario.direct else []) + gateways
                            if doors and scenario.v2:
                                targets.extend(v2s)
                            for target in in_turn(targets, turn):
                                measures.append(
                                    measure(
                                        stack, name, scenario, target, concurrency, options.seconds, workdir
                                    )
                                )
            finally:
                stack.stop()
    if options.shared_state:
        redis.stop()
    rows = summarise(measures)
    # what the variant changes: each option's words, then the settings no option explains
    label = " ".join(
        f"{k}={v}"
        for k, v in variant_env.items()
        if k not in ("GATEWAY_TRACING__ENDPOINT", "GATEWAY_REDIS__URL", "PYTHONPATH", "GATEWAY_AUTH__OIDC")
    )
    if options.against:
        label = f"the code at {options.against} {label}".strip()
    if options.token:
        label = f"callers with an OpenID Connect token (the base: an API key) {label}".strip()
    if options.shared_state:
        label = f"rate limits in Redis (both with an API key) {label}".strip()
    print(table(rows, label))
    if options.grpc:
        print(door_table(measures))
    if analysed:
        print(perf_analyzer_table(analysed))
    options.out.parent.mkdir(parents=True, exist_ok=True)
    options.out.with_suffix(".json").write_text(
        json.dumps(
            {
                "machine": {
                    "cpus": os.cpu_count(),
                    "load_generator": "wrk (gateway), tritonclient.grpc.aio (direct)",
                    "pinned": PINNED if options.pin else None,
                },
                "settings": {
                    "seconds": options.seconds,
                    "rounds": options.rounds,
                    "tracing": options.tracing,
                },
                "spans_received": len(receiver.spans),
                "rows": [
                    {**asdict(r), "cpu_vs_reference": r.cpu_vs_reference, "cpu_vs_kserve": r.cpu_vs_kserve}
                    for r in rows
                ],
                "perf_analyzer": analysed,
                "measures": [{**asdict(m), "rps": m.rps} for m in measures],
            },
            indent=1,
        )
    )
    plot(rows, options.out.with_suffix(".png"))
    print(f"wrote {options.out.with_suffix('.json')} and {options.out.with_suffix('.png')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
