"""What the gateway builds at start is kept out of the garbage collector's walks: in a
fresh process each (a frozen object stays frozen for the process's life)."""

from __future__ import annotations

import json
import subprocess
import sys

# the gateway's server started as `triton-gateway serve` starts it (its lifespan, then
# its listener, on a free port; no Triton: the gateway starts without one), then stopped
SERVED = """
import asyncio, gc, json
from gateway.app import create_app
from gateway.http.server import gateway_server
from gateway.settings import Settings, TritonSettings

async def main():
    settings = Settings(triton=TritonSettings(url="127.0.0.1:1"))
    server = gateway_server(create_app(settings), settings, "127.0.0.1", 0)
    tracked_before = len(gc.get_objects())
    serving = asyncio.ensure_future(server.serve())
    while not server.started:
        await asyncio.sleep(0.05)
    found = {"tracked_before": tracked_before, "frozen": gc.get_freeze_count(),
             "tracked": len(gc.get_objects())}
    server.should_exit = True
    await serving
    print(json.dumps(found))

asyncio.run(main())
"""


def _run(program: str) -> dict[str, int]:
    out = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, check=True, timeout=120
    )
    found: dict[str, int] = json.loads(out.stdout.strip().splitlines()[-1])
    return found


def test_a_started_gateway_leaves_the_collector_only_what_serving_makes() -> None:
    """Before: every object of the start (about 110,000 here) was walked by each
    collection of the oldest generation, a 61 ms pause in the middle of an upload storm
    (gateway.serving.collector). Once the server has started they are frozen, and what
    the collector walks is a small part of what it walked before."""
    found = _run(SERVED)
    assert found["frozen"] > 50_000, found
    assert found["tracked"] < found["tracked_before"] / 4, found
