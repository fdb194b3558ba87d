"""Latency and throughput of /classify against a running gateway (e.g. `make run`).

    .venv/bin/python -m gateway.bench.checks [--url http://localhost:8080]
        [--seconds 15] [--concurrency 1 4 16]

Prints one line per scenario and concurrency: requests/s and latency p50/p95/p99. Also
times the gateway's own header-only image checks in-process (no server needed). Numbers
depend on the machine: compare runs on the same one.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import io
import statistics
import struct
import sys
import time
import zlib
from collections.abc import Callable
from typing import Any

import httpx
from PIL import Image

from gateway.bench.side_by_side import photo_jpeg
from gateway.errors import GatewayError
from gateway.serving.validation import inspect_image
from gateway.settings import ImageLimits

Request = Callable[[httpx.AsyncClient], Any]


def _png(jpeg: bytes) -> bytes:
    with Image.open(io.BytesIO(jpeg)) as image:
        buffer = io.BytesIO()
        image.resize((224, 224)).save(buffer, "PNG")
    return buffer.getvalue()


def _png_header_only(width: int, height: int) -> bytes:
    """A PNG signature and IHDR chunk claiming ``width`` x ``height``, and no pixels."""
    ihdr = b"IHDR" + struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + ihdr + struct.pack(">I", zlib.crc32(ihdr))


def scenarios() -> dict[str, Request]:
    cat = photo_jpeg()
    eight = [("file", (f"{i}.jpg", cat)) for i in range(8)]
    sentence = "The striker scored twice in the final."
    encoded = base64.b64encode(_png(cat)).decode()
    return {
        "image, 1 jpeg (multipart)": lambda c: c.post("/classify", files={"file": ("cat.jpg", cat)}),
        "image, 8 jpegs (multipart)": lambda c: c.post("/classify", files=eight),
        "image, 1 png (base64 json)": lambda c: c.post("/classify", json={"image": encoded}),
        "text, 1 sentence": lambda c: c.post("/classify", json={"text": sentence}),
        "text, 16 sentences": lambda c: c.post("/classify", json={"texts": [sentence] * 16}),
        "text, candidate labels": lambda c: c.post(
            "/classify", json={"text": "Whisk the eggs.", "candidate_labels": ["cooking", "travel"]}
        ),
        "rejected (bad format)": lambda c: c.post(
            "/classify", content=b"not an image", headers={"content-type": "image/jpeg"}
        ),
    }


async def run(url: str, request: Request, concurrency: int, seconds: float) -> tuple[int, list[float], int]:
    latencies: list[float] = []
    errors = 0
    deadline = time.perf_counter() + seconds
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:

        async def worker() -> None:
            nonlocal errors
            while time.perf_counter() < deadline:
                started = time.perf_counter()
                response = await request(client)
                latencies.append(time.perf_counter() - started)
                errors += response.status_code >= 500

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return len(latencies), latencies, errors


def percentile(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def header_checks(rounds: int = 2000) -> None:
    limits = ImageLimits()
    for name, data in (
        ("photo jpeg", photo_jpeg()),
        ("png header 50000x50000", _png_header_only(50_000, 50_000)),
    ):
        started = time.perf_counter()
        for _ in range(rounds):
            with contextlib.suppress(GatewayError):  # the bomb is refused: that is the point
                inspect_image(data, limits)
        print(f"  header check, {name:<24} {(time.perf_counter() - started) / rounds * 1e6:8.1f} µs")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://localhost:8080")
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    args = parser.parse_args()
    print("in-process gateway checks:")
    header_checks()
    print(f"against {args.url} ({args.seconds:.0f} s each):")
    for name, request in scenarios().items():
        for concurrency in args.concurrency:
            count, latencies, errors = asyncio.run(run(args.url, request, concurrency, args.seconds))
            print(
                f"  {name:<28} c={concurrency:<3} {count / args.seconds:8.1f} req/s"
                f"  p50 {percentile(latencies, 50) * 1000:7.1f} ms"
                f"  p95 {percentile(latencies, 95) * 1000:7.1f} ms"
                f"  p99 {percentile(latencies, 99) * 1000:7.1f} ms"
                f"  5xx {errors}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
