"""Capacity against the real stack: the adaptive in-flight limit against a static cap when
Triton slows down 5x mid-run and recovers, and one key flooding beside another.

The slowdown is CPU taken from Triton: its processes (server, keeper, Python-backend
stubs) stopped 16 ms of every 20. Load comes from :mod:`helpers.rawload` (tens of
microseconds a request), so the generator does not take the CPU being measured."""

from __future__ import annotations

import json
import math
import os
import signal
import statistics
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from gateway.bench.capacity import hey
from gateway.bench.quantiles import percentile
from gateway.dev.gatewayprocess import GatewayProcess
from gateway.dev.tritonserver import TritonServer, throttled
from gateway.shared.keyfiles import hash_key

from helpers.rawload import Flow, load, request_bytes

pytestmark = pytest.mark.alone  # it times or loads the machine: run with nothing beside it

TEXT = json.dumps({"texts": ["the film was a delight from start to finish"]}).encode()
JSON = {"content-type": "application/json"}


SETTLE_SECONDS = 3.0
# each throttled flow lasts FLOW_SECONDS and is judged from JUDGED_FROM on (the limits move
# within seconds)
FLOW_SECONDS = 8.0
JUDGED_FROM = 3.0


def text_load(gateway: GatewayProcess, clients: int, seconds: float, name: str) -> Flow:
    flow = Flow(name)
    load(seconds, (flow, gateway.url, request_bytes(gateway.url, "/classify", TEXT, JSON), clients, 0.0))
    return flow


def ms(value: float) -> str:
    return f"{value * 1000:.0f} ms"


def test_a_5x_slowdown_is_followed_by_the_gate_and_a_recovery_too(
    triton: TritonServer, spawn_gateway: Callable[..., GatewayProcess]
) -> None:
    """100 clients sending back to back, Triton at speed, then 5x slower, then at speed
    again, against the static cap of 64 in the same run. Issue 54's gate (the default:
    each model's limit from what Triton's statistics say its batches cost,
    gateway.serving.queuegate) settles near the knee at speed: about the cap's goodput at
    a fraction of its p99; slowed, every batch is dearer by the same factor and the limit
    moves little, or opens towards the cap where the slowed batches' fit says larger ones
    pay (with Triton stopped 16 ms of every 20, a deeper queue fills more of the 4 ms it
    runs): never worse than the cap's p99, at part of its goodput or all of it
    (bench-capacity, four floods: 64-102 % of the cap's goodput at 0.24-0.97x its p99); the excess hears
    a 503 at once (or held up to its Retry-After when it retries at once); after the
    recovery it serves about what it did before.

    The knee controller it replaces (the default before) ended floods at speed at 32-64 in
    flight, its p99 1.4-1.6 s against static 8's 0.24-0.33 s (bench-capacity, 2026-11-28).

    Quarantined until 2026-11-29: the gate then read a line ``a + c*b`` through the batch
    sizes, whose cost per batch drifted up as a flood's batches grew (limit 26 in one
    suite run, p99 894 ms). Read per size, seven runs in a row passed (limit 8-14 at
    speed, p99 419-610 ms against the cap's 1.8-2.3 s; 5x slower, p99 1.2-2.2 s against
    4.5-5.6 s)."""
    gate = spawn_gateway(triton)
    static = spawn_gateway(triton, GATEWAY_SERVER__ADAPTIVE__ENABLED="false")
    text_load(gate, 8, 3, "warm-up")  # a light load first, as a replica has before a flood
    before = text_load(static, 100, 4, "static, Triton at speed")
    ahead = text_load(gate, 100, 6, "gate, Triton at speed")
    limit_at_speed = _metric(gate, "gateway_inflight_limit")
    # the cap on both sides of the gate: a machine that slows or speeds up between two
    # flows (a clean-clone CI run on 2026-12-01: the cap 76/s, then the gate 52/s, its three
    # reruns 74-78/s against 71-85) moves the gate's yardstick with it
    again = text_load(static, 100, 4, "static again, Triton at speed")
    with throttled(triton):
        one = text_load(static, 1, 4, "one client, Triton slowed")
        slow = text_load(gate, 100, FLOW_SECONDS, "gate, Triton slowed")
        limit_slowed = _metric(gate, "gateway_inflight_limit")
        # what the last flow left queued in Triton (up to 64 requests, 2 s on a slowed
        # Triton, more on a loaded machine) is gone before the next one is judged
        time.sleep(SETTLE_SECONDS)
        stuck = text_load(static, 100, FLOW_SECONDS, "static, Triton slowed")
    time.sleep(SETTLE_SECONDS)
    recovered = text_load(gate, 100, 4, "gate, Triton recovered")
    flows = (before, ahead, again, one, slow, stuck, recovered)
    report = {
        flow.name: {"statuses": flow.statuses(), "p50": ms(flow.p(0.5)), "p99": ms(flow.p(0.99))}
        for flow in flows
    }
    print(json.dumps(report, indent=1))
    if path := os.environ.get("CAPACITY_REPORT"):
        Path(path).write_text(json.dumps(report, indent=1))
    single = one.p(0.99)
    speed_p99 = ahead.p(0.99, after=2.0)
    cap_speed_p99 = percentile(before.latencies(after=1.0) + again.latencies(after=1.0), 0.99)
    speed_rate = ahead.rate(200, 2.0, 6.0)
    cap_speed_rate = (before.rate(200, 1.0, 4.0) + again.rate(200, 1.0, 4.0)) / 2
    gate_p99, cap_p99 = (flow.p(0.99, after=JUDGED_FROM) for flow in (slow, stuck))
    if math.isnan(cap_p99):
        # the cap served none of what was sent after JUDGED_FROM within the flow (its first
        # wave held every slot to the end: with a core busy beside it, 1 run in 10 on
        # 2026-11-30): a p99 beyond the flow, the problem at its worst
        cap_p99 = math.inf
    gate_rate, cap_rate = (flow.rate(200, JUDGED_FROM, FLOW_SECONDS) for flow in (slow, stuck))
    print(
        f"at speed: the gate {speed_rate:.0f}/s p99 {ms(speed_p99)} (limit {limit_at_speed:.0f}); the cap "
        f"{cap_speed_rate:.0f}/s ({before.rate(200, 1.0, 4.0):.0f} before, {again.rate(200, 1.0, 4.0):.0f} after) "
        f"p99 {ms(cap_speed_p99)}. Triton 5x slower, after {JUDGED_FROM:.0f} s: one "
        f"client p99 {ms(single)}; the gate {gate_rate:.0f}/s p99 {ms(gate_p99)}; the cap {cap_rate:.0f}/s "
        f"p99 {ms(cap_p99)} (the gate's limit {limit_slowed:.0f}); recovered {recovered.rate(200, 1.0, 4.0):.0f}/s"
    )
    for flow in (ahead, slow, recovered):
        assert set(flow.statuses()) <= {200, 503}, (flow.name, flow.statuses())  # no 504 storm
    # the cap, slowed, is what the gate is compared with: its requests may wait past their
    # deadline (11 of 2,619 did, with a core busy beside it, 1 run in 10 on 2026-11-30)
    assert set(stuck.statuses()) <= {200, 503, 504}, stuck.statuses()
    assert cap_p99 > 3 * single  # the scenario reproduces the problem
    # at speed, near the knee: at most half the ceiling it started at, most of the cap's
    # goodput at a fraction of its p99 (bench-capacity: 92-100 % at 0.19-0.25x). The p99
    # is the bound that matters; the limit ends where this flood's batch sizes put it
    # (10-18 in six runs on 2026-12-01, 26 in a clean-clone CI run that day, its p99 276 ms
    # against the cap's 566), and the knee controller before it ended at 32-64
    assert limit_at_speed <= 32
    assert speed_rate >= 0.7 * cap_speed_rate
    assert speed_p99 <= 0.5 * cap_speed_p99
    # slowed: part of the cap's goodput or all of it (52-146 % in the suite's runs on
    # 2026-11-28: the throttled cap moved from 13/s to 29/s between them), never more than
    # its latency
    assert gate_rate >= 0.35 * cap_rate
    assert gate_p99 <= 1.25 * cap_p99
    shed = [a for a in slow.answers if a.status == 503]
    assert shed, "nothing was shed at 100 clients on a slowed Triton"
    assert all(a.retry_after for a in shed)
    # a refusal comes at once, and a retry sent the moment it came is held, twice as long
    # each time, never longer than the Retry-After it was told (gateway.serving.retries)
    assert all(a.seconds <= float(a.retry_after or 0) + 0.3 for a in shed)
    # back toward what it served before the slowdown, within a second of the recovery
    assert recovered.rate(200, 1.0, 4.0) > 0.5 * ahead.rate(200, 2.0, 6.0)


def _metric(gateway: GatewayProcess, name: str) -> float:
    text = httpx.get(f"{gateway.url}/metrics", timeout=5).text
    return float(next(line.split()[1] for line in text.splitlines() if line.startswith(f"{name} ")))


def percentile_of(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@pytest.mark.quarantine
@pytest.mark.xfail(
    strict=False,
    reason="issue 54 item 4, not met. With the gate on Triton's batches (the default since "
    "2026-11-30, floor 8): 28 of 28 answered, all 200, median 128-155 ms, 4.0-4.5x, three runs "
    "on a faster machine on 2026-11-30 evening; 19 answered, median 354 ms (4.8x) that morning "
    "(2026-11-29, floor 1: "
    "10-14 answered, 499-710 ms, 5.1-8.1x): the key waits behind the batch running in "
    "Triton, 2x slower, and the one formed behind it with its own. The knee "
    "before it: 16-17 of 28 answered, median 1.9-2.1x, its first two 1.5-1.8 s behind the "
    "flood's first wave. Quarantined: make test-quarantine runs it (XPASS when it holds)",
)
def test_a_flooding_key_leaves_another_its_latency(
    triton: TritonServer, spawn_gateway: Callable[..., GatewayProcess], tmp_path: Path
) -> None:
    """Issue 42's fairness row, measured with hey (a Go program: neither load costs the
    CPU being measured) on a Triton 2x slower: 150 connections of one key that send again
    the moment an answer comes (503 or not), beside a key at 4 requests a second. Filed
    on 3de95b9: the quiet key got 11 of 36 requests refused, median 293 ms against 74 ms
    alone. Now each freed slot goes to the key holding fewer, the flood's retries are
    refused from their headers and held (a few hundred refusals a second, not thousands,
    on the cores Triton uses), and a key under its share is admitted at once: no 503,
    within 3x."""
    keys = tmp_path / "api-keys"
    keys.write_text(f"flood {hash_key('flood-key')}\nquiet {hash_key('quiet-key')}\n")
    # the defaults, but for who reads /metrics: the quiet key reads its gauges
    gateway = spawn_gateway(
        triton, GATEWAY_AUTH__KEYS_FILE=str(keys), GATEWAY_AUTH__METRICS_READERS='["quiet"]'
    )
    flood_key = {"authorization": "Bearer flood-key"}
    quiet_key = {"authorization": "Bearer quiet-key"}
    hey(gateway.url, 8, 3, flood_key)  # warm
    with throttled(triton, 0.010, 0.010), ThreadPoolExecutor(1) as pool:
        alone = hey(gateway.url, 1, 5, quiet_key, rate=4)
        flood = pool.submit(hey, gateway.url, 150, 10, flood_key)
        time.sleep(1.5)  # the flood under way, its limit moved
        beside = hey(gateway.url, 1, 7, quiet_key, rate=4)
        flooded = flood.result()
    median_alone = statistics.median(latency for _, latency, _ in alone)
    median_beside = statistics.median(latency for _, latency, _ in beside)
    statuses = Counter(status for _, _, status in beside)
    flood_statuses = Counter(status for _, _, status in flooded)
    print(
        f"quiet alone: median {ms(median_alone)}; beside 150 flood connections: {dict(statuses)}, "
        f"median {ms(median_beside)} ({median_beside / median_alone:.1f}x); flood: {dict(flood_statuses)}; "
        f"the quiet key's, in order: {[(round(at, 2), ms(latency)) for at, latency, _ in beside]}"
    )
    assert statuses == {200: len(beside)}, statuses
    assert len(beside) >= 20  # 4 a second for 7 s
    assert flood_statuses[503] > flood_statuses[200]  # the flood was far over capacity
    # the issue asks 3x: 3.0x on 3de95b9; 2.0-3.6x with the baseline anchor the default
    assert median_beside < 3 * median_alone


def test_a_flood_after_a_light_load_is_learnt_fast_and_a_cold_burst_is_served(
    triton: TritonServer, spawn_gateway: Callable[..., GatewayProcess]
) -> None:
    """Issue 42's third point, with the defaults (each model's gate on Triton's batches,
    refusals from the headers, retries at once held). A cold replica takes a burst of 24
    requests at once (a gate starts at the ceiling until measured: nothing is shed that it
    can serve). Then a light load (2
    connections for 12 s), then 100 connections (hey) that send again the moment an
    answer comes, for 12 s: the p99 of what is admitted over the whole flood, its first
    seconds included, is within 2x the p99 once the limit has learnt (after 2 s).

    Filed on 3de95b9: p99 1.28 s after the first 2 s, 2.2 s over the whole flood. With
    the baseline anchor the default, which never moves while it does not bind, the
    flood's first wave queued 64 deep in Triton: 5.5-9.8x (its ``idle`` setting, 8, read
    1.06-1.15x but shed 10 steady clients). The knee reached its rung in the first
    windows: 0.98x. The gate starts the flood from what the light load's batches of 1 and
    2 measured (a few requests) and opens as larger batches are measured.

    One stall in a flood's first seconds decides its p99 (a 12 s flood admits about
    1,500, the first 2 s about 250): a clean-clone CI run on 035a291 read 2.57x (477 ms
    against 186), where 20 runs here on 2026-12-01 read 0.97-1.07x, 10 of them beside a
    busy core, the gate at 8-10 from the flood's first read in each. Triton's batcher can
    sleep 500 ms on a wake-up lost between its check and its wait (core's
    DynamicBatchScheduler::WaitForPayloadSlotAvailable waits on a mutex the notifier does
    not hold), which nothing here can prevent. So a sequence over the bound is run once
    more on a fresh gateway, and that one decides; both are printed. The regressions it
    guards against (a first wave 64 deep: 5.5-9.8x) fail both."""
    _within_twice_the_steady_p99(lambda: _burst_light_then_flood(spawn_gateway(triton)))


def test_a_flood_after_a_light_load_of_one_batch_size_starts_from_it_not_the_ceiling(
    triton: TritonServer, spawn_gateway: Callable[..., GatewayProcess]
) -> None:
    """One client for 4 s (batches all of 1), then the same flood: that one size measured
    the model (the batch worth making, room for twice it), so the flood's first wave does
    not go in at the ceiling. Before (one size counted as unmeasured) a light load of 2
    clients whose batches were all of 2 left the gate at 64, and the flood's p99 read
    2.7x the steady one's in two runs (0.96x now)."""
    _within_twice_the_steady_p99(lambda: _burst_light_then_flood(spawn_gateway(triton), burst=False, light=1))


def _within_twice_the_steady_p99(run: Callable[[], tuple[float, float, list[str]]]) -> None:
    """``run``'s whole flood's admitted p99 within twice its steady p99; a run over the
    bound is followed by one more on a fresh gateway, which decides (see the test above)."""
    tries = []
    for attempt in range(2):
        whole, steady, windows = run()
        tries.append(f"{ms(whole)} against {ms(steady)} ({whole / steady:.2f}x)")
        print(f"attempt {attempt + 1}: the flood's admitted p99 {tries[-1]}; by 0.5 s from its start, "
              f"admitted/p99: {windows}")  # fmt: skip
        if whole <= 2 * steady:
            break
    assert whole <= 2 * steady, tries


def _burst_light_then_flood(
    gateway: GatewayProcess, burst: bool = True, light: int = 2
) -> tuple[float, float, list[str]]:
    """A burst of 24 at once on the cold gateway (all served), ``light`` clients for 12 s
    (past the 10 s for which the burst is kept; without the burst, 4 s), then 100 clients
    for 12 s: the whole flood's admitted p99, the p99 of what it sent from 2 s on, and its
    first 4 s by half-second window (admitted and their p99)."""
    if burst:
        answers = hey(gateway.url, 24, 0, requests=24)
        assert Counter(status for _, _, status in answers) == {200: 24}
    hey(gateway.url, light, 12 if burst else 4)
    flood = hey(gateway.url, 100, 12)
    admitted = [(offset, latency) for offset, latency, status in flood if status == 200]
    assert {status for _, _, status in flood} <= {200, 503}
    # (none at all: the gateway stopped answering, e.g. killed under the flood)
    assert admitted, f"nothing admitted of {len(flood)} answers: {Counter(s for _, _, s in flood)}"
    whole = percentile_of([latency for _, latency in admitted], 0.99)
    steady = percentile_of([latency for offset, latency in admitted if offset >= 2.0], 0.99)
    windows = []
    for start in (0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5):
        inside = [latency for offset, latency in admitted if start <= offset < start + 0.5]
        windows.append(f"{len(inside)}/{ms(percentile_of(inside, 0.99)) if inside else '-'}")
    return whole, steady, windows


def _flood_and_quiet(
    triton: TritonServer, spawn_gateway: Callable[..., GatewayProcess], tmp_path: Path, slots: int
) -> GatewayProcess:
    """A gateway with two keys, ``flood-key`` and ``quiet-key``, on ``slots`` static slots."""
    keys = tmp_path / "api-keys"
    keys.write_text(f"flood {hash_key('flood-key')}\nquiet {hash_key('quiet-key')}\n")
    return spawn_gateway(
        triton,
        GATEWAY_AUTH__KEYS_FILE=str(keys),
        GATEWAY_SERVER__ADAPTIVE__ENABLED="false",
        GATEWAY_SERVER__MAX_IN_FLIGHT=str(slots),
    )


def test_under_a_small_static_limit_a_quiet_key_beside_a_flood_is_served(
    triton: TritonServer, spawn_gateway: Callable[..., GatewayProcess], tmp_path: Path
) -> None:
    """A static limit under 16 keeps no reserve, so a flooding key holds every slot. A
    quiet key's request is then next in line for the next slot freed (it holds less than
    its share): it is neither refused from its headers nor timed out after the queue
    wait. Before, beside 150 flood connections on max_in_flight 8 (Triton 2x slower), a
    quiet key's requests were refused from their headers: 13 of 13 (hey), 10 of 12."""
    gateway = _flood_and_quiet(triton, spawn_gateway, tmp_path, slots=8)
    flood_key = {"authorization": "Bearer flood-key"}
    quiet_key = {"authorization": "Bearer quiet-key"}
    hey(gateway.url, 8, 2, flood_key)  # warm
    with throttled(triton, 0.010, 0.010), ThreadPoolExecutor(1) as pool:
        flood = pool.submit(hey, gateway.url, 150, 8, flood_key)
        time.sleep(1.5)  # the flood holds every slot
        beside = hey(gateway.url, 1, 5, quiet_key, rate=4)
        flooded = flood.result()
    statuses = Counter(status for _, _, status in beside)
    flood_statuses = Counter(status for _, _, status in flooded)
    median = statistics.median(latency for _, latency, _ in beside)
    print(
        f"quiet beside the flood on 8 slots: {dict(statuses)}, median {ms(median)}; flood: {dict(flood_statuses)}"
    )
    assert flood_statuses[503] > flood_statuses[200]  # the flood was far over the 8 slots
    assert statuses == {200: len(beside)}, statuses
    # its one connection sends the next when an answer comes: with another process keeping
    # a core busy its answers took 0.37-1.15 s and it sent 6-7 in the 5 s (2026-11-29);
    # what is held is that each was served, none refused, several in a row
    assert len(beside) >= 3


def test_a_quiet_key_next_in_line_outwaits_a_stalled_triton(
    triton: TritonServer, spawn_gateway: Callable[..., GatewayProcess], tmp_path: Path
) -> None:
    """A key under its share that finds every slot taken is next in line, and is served
    when the next slot frees however long that takes, up to the longest Retry-After a
    refusal could give it. Here a flooding key holds both of 2 static slots on a stopped
    Triton for 2.5 s: before, the quiet key's request waited retry_after_seconds (1 s) and
    was refused, every time (with Triton slowed and a core busy, slots came free over a
    second apart: 1 of 7 quiet requests refused in one run of ten)."""
    gateway = _flood_and_quiet(triton, spawn_gateway, tmp_path, slots=2)

    def classify(key: str) -> tuple[int, float, str]:
        started = time.perf_counter()
        answer = httpx.post(
            f"{gateway.url}/classify",
            content=TEXT,
            headers={**JSON, "authorization": f"Bearer {key}"},
            timeout=30,
        )
        return answer.status_code, time.perf_counter() - started, answer.text[:200]

    assert classify("quiet-key")[0] == 200  # warm
    with ThreadPoolExecutor(3) as pool:
        triton.send_signal(signal.SIGSTOP)
        try:
            held = [pool.submit(classify, "flood-key") for _ in range(2)]
            time.sleep(1.0)  # both are in Triton, which answers nothing
            quiet = pool.submit(classify, "quiet-key")
            time.sleep(2.5)  # past retry_after_seconds (1 s): it is still waiting
            waiting = not quiet.done()
        finally:
            triton.send_signal(signal.SIGCONT)
        status, seconds, body = quiet.result()
        flood = [future.result()[0] for future in held]
    print(f"quiet beside a stalled flood: {status} after {ms(seconds)}; flood {flood}")
    assert flood == [200, 200]
    assert (status, waiting) == (200, True), body
    assert seconds >= 2.5
