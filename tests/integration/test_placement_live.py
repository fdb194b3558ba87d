"""Placement across two real Tritons (gateway.serving.placement), one of them slowed 5x
from outside (its process group stopped 16 ms of every 20): each call goes to the
replica whose queue drains first, against round-robin in the same run, and a replica
that stops answering is taken out and put back. Issue 54 item 5.

Load comes from :mod:`helpers.rawload` (tens of microseconds a request). Each gateway
has the Tritons to itself while it is measured; the "separately" baseline is the two
Tritons each behind a gateway of its own, loaded at once."""

from __future__ import annotations

import json
import re
import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from gateway.bench.capacity import hey
from gateway.bench.placement import Report, gateways, run_round
from gateway.dev.gatewayprocess import GatewayProcess
from gateway.dev.tritonserver import TritonServer, throttled

from helpers.rawload import Flow, load, request_bytes
from helpers.triton_fixtures import REPOSITORY, _servers, start_triton

pytestmark = pytest.mark.alone  # it times or loads the machine: run with nothing beside it

TEXT = json.dumps({"texts": ["the film was a delight from start to finish"]}).encode()
JSON = {"content-type": "application/json"}
SECONDS = 6.0
JUDGED_FROM = 2.0  # the placement's call times are learnt in the first calls
# each load of the bench's round here (six of them; the bench's own default is longer):
# its goodput is read after the bench's first 2 s
ROUND_SECONDS = 4.5


@pytest.fixture(scope="module")
def second_triton(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TritonServer]:
    server = start_triton(REPOSITORY, tmp_path_factory.mktemp("second-triton"))
    yield server
    server.kill()
    _servers.remove(server)


def flow(
    gateway: GatewayProcess, name: str, clients: int, pace: float = 0.0
) -> tuple[Flow, str, bytes, int, float]:
    request = request_bytes(gateway.url, "/classify", TEXT, JSON)
    return (Flow(name), gateway.url, request, clients, pace)


def goodput(found: Flow) -> float:
    return found.rate(200, JUDGED_FROM, SECONDS)


def ms(value: float) -> str:
    return f"{value * 1000:.0f} ms"


def replica_calls(gateway: GatewayProcess) -> dict[str, float]:
    text = httpx.get(f"{gateway.url}/metrics", timeout=5).text
    found = re.findall(r'^gateway_triton_replica_calls_total\{replica="([^"]+)"\} (\S+)$', text, re.M)
    return {address: float(value) for address, value in found}


def replica_up(gateway: GatewayProcess) -> dict[str, float]:
    text = httpx.get(f"{gateway.url}/metrics", timeout=5).text
    found = re.findall(r'^gateway_triton_replica_up\{replica="([^"]+)"\} (\S+)$', text, re.M)
    return {address: float(value) for address, value in found}


def test_calls_go_where_the_queue_is_shortest_and_round_robin_waits_on_the_slow_one(
    triton: TritonServer, second_triton: TritonServer, tmp_path: Path
) -> None:
    """One round of `make bench-placement` (gateway.bench.placement): a flood of 48
    clients (under the cap: nothing refused, the placement alone measured) and half of
    what the two served apart, paced. The bench's medians hold the issue's bounds; one
    round on a shared 2-core machine, whose two Tritons share its cores, holds where the
    calls went; its figures are printed, the bench judges them."""
    report = Report(rounds=1, seconds=ROUND_SECONDS, clients=48)
    with gateways(triton, second_triton, tmp_path) as found:
        for gateway in (found.fast, found.slow, found.shortest, found.turns):
            hey(gateway.url, 4, 1.0)  # every model warm on both
        with throttled(second_triton):
            run_round(found, report)
        placed = {
            name: replica_calls(g) for name, g in (("shortest", found.shortest), ("turns", found.turns))
        }
    lines = report.lines()
    print("\n".join(lines), placed, sep="\n")
    for table in (report.flood, report.half):
        for name, (only,) in table.items():
            assert set(only.statuses) == {"200"}, (name, only.statuses)
    flood = {name: runs[0] for name, runs in report.flood.items()}
    # the slow replica gets fewer of the calls placed by queue, half of those by turns
    slow_share = placed["shortest"][second_triton.grpc_url] / sum(placed["shortest"].values())
    assert slow_share < 0.4, placed
    assert 0.45 < placed["turns"][second_triton.grpc_url] / sum(placed["turns"].values()) < 0.55, placed
    # the figures (goodput, p99) are the bench's to judge, over rounds (`make
    # bench-placement`): one round on a shared machine is a coin toss for them (CI on
    # 2026-11-29 saw shortest queue's half-load p99 at 2.4x the fast one's alone, round
    # robin's 2.4x too, where the bench's medians are 0.59x and 1.47x). What the test holds
    # is the behaviour under them: the queue-placed flood is not served worse than
    # round-robin's by more than noise, and it still serves at least half of the two apart
    assert flood["shortest queue"].goodput >= 0.8 * flood["round robin"].goodput, lines
    assert flood["shortest queue"].goodput >= 0.5 * flood["apart"].goodput, lines


def test_a_replica_that_stops_answering_is_taken_out_within_a_second_and_put_back(
    triton: TritonServer, second_triton: TritonServer, spawn_gateway: Callable[..., GatewayProcess]
) -> None:
    fast, hung = triton, second_triton
    gateway = spawn_gateway(fast, GATEWAY_TRITON__URL=f"{fast.grpc_url},{hung.grpc_url}")
    load(1.0, flow(gateway, "warm-up", 4))
    assert replica_up(gateway) == {fast.grpc_url: 1.0, hung.grpc_url: 1.0}
    hung.send_signal(signal.SIGSTOP)
    try:
        stopped = time.monotonic()
        during = flow(gateway, "one replica hung", 4, 0.05)
        # where calls went a second after the stop, read while the load runs
        after_a_second: dict[str, float] = {}
        reader = threading.Timer(1.0, lambda: after_a_second.update(replica_calls(gateway)))
        reader.start()
        load(3.0, during)
        reader.join()
        up_while_hung = replica_up(gateway)
        placed_while_hung = replica_calls(gateway)
        # what the gateway said of its replicas, for a failure's message
        said = [line for line in gateway.log.read_text().splitlines() if "Triton replica" in line]
        # a call placed on it before it was found out is moved to the other when its probe
        # fails (half a second, under the probe's own deadline); every call sent a second
        # after it stopped goes to the other
        answers = during[0].answers
        assert answers
        assert {a.status for a in answers} == {200}, during[0].statuses()
        slowest = max(a.seconds for a in answers)
        assert slowest < 2.0, (f"a call waited {slowest:.2f} s", said)
        assert placed_while_hung[hung.grpc_url] == after_a_second[hung.grpc_url], (
            after_a_second,
            placed_while_hung,
            said,
        )
        # and is not slowed by it: none waits as long as the probe's deadline and a call
        # (CI once saw 0.527 s at the last instant of a 0.5 s bound on a shared machine)
        later = [a for a in answers if a.at >= 1.0]
        assert later
        assert all(a.seconds < 1.0 for a in later), (
            [(round(a.at, 2), round(a.seconds, 3)) for a in later if a.seconds >= 1.0],
            said,
        )
        assert up_while_hung[hung.grpc_url] == 0.0, up_while_hung
    finally:
        hung.send_signal(signal.SIGCONT)
    print(
        f"hung {time.monotonic() - stopped:.1f} s; placed {placed_while_hung}; slowest call {slowest:.2f} s"
    )
    deadline = time.monotonic() + 10
    while replica_up(gateway)[hung.grpc_url] != 1.0 and time.monotonic() < deadline:
        time.sleep(0.1)
    back_after = time.monotonic()
    print(f"put back {back_after - stopped:.1f} s after the stop")
    assert replica_up(gateway)[hung.grpc_url] == 1.0
    load(2.0, flow(gateway, "both again", 8))
    assert replica_calls(gateway)[hung.grpc_url] > placed_while_hung[hung.grpc_url]


def test_a_name_is_resolved_into_replicas_as_a_headless_service_gives_them(
    triton: TritonServer, spawn_gateway: Callable[..., GatewayProcess]
) -> None:
    """``dns:///name:port`` under shortest_queue: the name resolved by the system's
    resolver (here to this host's one Triton), each address a replica of its own."""
    gateway = spawn_gateway(triton, GATEWAY_TRITON__URL=f"dns:///localhost:{triton.grpc_port}")
    load(1.0, flow(gateway, "through the name", 2))
    calls = replica_calls(gateway)
    assert set(calls) == {f"127.0.0.1:{triton.grpc_port}"}, calls
    assert calls[f"127.0.0.1:{triton.grpc_port}"] > 0
    assert replica_up(gateway) == {f"127.0.0.1:{triton.grpc_port}": 1.0}


def test_the_gate_on_tritons_queue_reads_every_replica_and_allows_each_its_own(
    triton: TritonServer, second_triton: TritonServer, spawn_gateway: Callable[..., GatewayProcess]
) -> None:
    """The gate on Triton's batches (the default) with two replicas: it reads both
    replicas' statistics (each its own counters) and allows each replica its batches, not
    the first replica's limit for the two together (before: the first one's statistics
    alone, one replica's limit). Issue 54 items 1 and 5 together."""
    gateway = spawn_gateway(
        triton,
        GATEWAY_TRITON__URL=f"{triton.grpc_url},{second_triton.grpc_url}",
    )
    load(4.0, flow(gateway, "flood", 32))
    judged = re.findall(
        r"the gate of text_classifier is (\d+), on (\d+) replica\(s\)", gateway.log.read_text()
    )
    print(judged)
    assert judged, gateway.log.read_text()[-2000:]
    assert judged[-1][1] == "2", judged
    limit = int(judged[-1][0])
    assert limit % 2 == 0 or limit == 64, judged  # one replica's limit on each (or the ceiling)
    calls = replica_calls(gateway)
    assert all(count > 0 for count in calls.values()), calls
