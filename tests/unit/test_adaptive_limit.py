"""The adaptive limit against a simulated Triton: N requests served in parallel, each
costing S seconds (a run-time knob), the rest queued in Triton's FIFO; a closed loop of
clients keeps it overloaded. Time is simulated: the numbers are exact, not timed."""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable

from gateway.serving.limit import AdaptiveLimit, LimitSettings, percentile

from helpers.clock import Clock


def simulate(
    limit: AdaptiveLimit | int,
    clock: Clock,
    cost: Callable[[float], float],
    parallel: int,
    until: float,
) -> list[tuple[float, float]]:
    """(completion time, latency) of every request; the clients always have one waiting."""
    servers = [clock.now] * parallel
    in_flight: list[tuple[float, float, int]] = []
    done: list[tuple[float, float]] = []
    while clock.now < until:
        ceiling = limit if isinstance(limit, int) else limit.limit
        while len(in_flight) < ceiling:
            index = min(range(parallel), key=servers.__getitem__)
            start = max(clock.now, servers[index])
            servers[index] = start + cost(start)
            heapq.heappush(in_flight, (servers[index], clock.now, len(in_flight)))
        finish, admitted, others = heapq.heappop(in_flight)
        clock.now = finish
        if not isinstance(limit, int):
            limit.observe("text", finish - admitted, admitted, others)
        done.append((finish, finish - admitted))
    return done


def between(done: list[tuple[float, float]], start: float, end: float) -> list[float]:
    return [latency for at, latency in done if start <= at < end]


def adaptive(clock: Clock, ceiling: int = 64, idle: int | None = None) -> AdaptiveLimit:
    return AdaptiveLimit(LimitSettings(ceiling=ceiling, idle=idle), clock=clock, rng=random.Random(7))


def test_a_steady_overload_keeps_admitted_latency_near_one_clients() -> None:
    clock = Clock()
    limit = adaptive(clock)
    done = simulate(limit, clock, lambda t: 0.010, parallel=4, until=20.0)
    steady = between(done, 10.0, 20.0)
    static_clock = Clock()
    static = between(simulate(64, static_clock, lambda t: 0.010, 4, 20.0), 10.0, 20.0)
    print(
        f"p99 adaptive {percentile(steady, 0.99) * 1000:.0f} ms at {len(steady) / 10:.0f}/s; "
        f"static 64: {percentile(static, 0.99) * 1000:.0f} ms at {len(static) / 10:.0f}/s"
    )
    # one client's latency is 10 ms; Triton here serves 4 at once, so latency comes in
    # steps of 10 ms: 1 + tolerance (2x) allows up to 8 in flight, a step more in passing
    assert percentile(steady, 0.99) < 3.5 * 0.010
    assert percentile(static, 0.99) > 10 * 0.010  # the static cap queues 64 in Triton
    assert len(steady) >= 0.9 * len(static)  # no throughput given up for it


def test_a_5x_slowdown_is_learnt_within_seconds_and_a_recovery_too() -> None:
    clock = Clock()
    limit = adaptive(clock)

    def cost(t: float) -> float:
        return 0.050 if 20.0 <= t < 40.0 else 0.010

    done = simulate(limit, clock, cost, parallel=4, until=60.0)
    slow = between(done, 22.0, 40.0)  # two seconds after the slowdown
    print(f"slow p99 {percentile(slow, 0.99) * 1000:.0f} ms; limit {limit.limit}")
    assert percentile(slow, 0.99) < 5 * 0.050  # the static cap: 16x
    assert len(slow) >= 0.85 * 18.0 * 4 / 0.050  # Triton kept busy while slow
    recovered = between(done, 42.0, 60.0)
    assert len(recovered) >= 0.85 * 18.0 * 4 / 0.010  # throughput back
    assert percentile(recovered, 0.99) < 3 * 0.010


def test_a_faster_class_does_not_read_as_congestion() -> None:
    """Two models, one 10x slower: each latency is compared with its own baseline."""
    clock = Clock()
    limit = adaptive(clock)
    rng = random.Random(3)
    for _ in range(20_000):
        clock.now += 0.001
        slow = rng.random() < 0.3
        limit.observe(
            "image" if slow else "text", 0.100 if slow else 0.010, clock.now - 0.01, rng.randrange(3)
        )
    assert limit.limit == 64  # uncongested: the ceiling, not the floor


def test_the_limit_starts_at_the_ceiling_and_probes_soon() -> None:
    clock = Clock()
    limit = adaptive(clock, ceiling=32)
    assert limit.limit == 32
    assert not limit.probing
    for _ in range(200):
        clock.now += 0.05
        limit.observe("text", 0.01, clock.now - 0.01, 0)
    assert limit.state().baseline_seconds["text"] == 0.01
    assert not limit.probing  # quiet samples kept the baseline fresh: no probe needed


def test_slow_answers_below_the_limit_do_not_lower_it() -> None:
    """Latency that rises while the limit is not reached (a noisy machine, a slow model
    at light load) is not the gateway's to fix: admitting fewer would not help."""
    clock = Clock()
    limit = adaptive(clock, ceiling=32)
    for _ in range(20):  # a baseline from quiet requests
        clock.now += 0.05
        limit.observe("text", 0.01, clock.now - 0.01, 0)
    for _ in range(500):  # 5x slower, 3 in flight of 32
        clock.now += 0.02
        limit.observe("text", 0.05, clock.now - 0.05, 2)
    assert limit.limit == 32
    lowest = 32
    for _ in range(100):  # the same at the limit: it falls
        clock.now += 0.02
        limit.observe("text", 0.05, clock.now - 0.05, max(1, limit.limit - 1))
        lowest = min(lowest, limit.limit)
    assert lowest < 32


def test_a_gateway_below_its_limit_never_probes() -> None:
    """8 requests always in flight under a ceiling of 64 (never a quiet sample), 5x faster
    than the first (cold) request: holding the limit at the floor to measure a baseline
    would shed a burst there is room for."""
    clock = Clock()
    limit = adaptive(clock)
    limit.observe("text", 0.1, clock.now, 0)  # one quiet sample (a cold first one), then never again
    lowest = limit.limit
    for _ in range(12_000):  # two minutes
        clock.now += 0.01
        limit.observe("text", 0.02, clock.now - 0.02, 7)
        lowest = min(lowest, limit.limit)
        assert not limit.probing
    assert lowest == 64


def test_a_light_load_takes_the_untested_ceiling_down_and_a_flood_after_it_queues_little() -> None:
    """Issue 42's third point. A cold replica starts at the ceiling (a burst of 24 is all
    admitted); 2 clients for 12 s, with no quiet sample among them (always another in
    flight), take the limit to ``idle`` (8), and the flood that follows (100 clients) is
    admitted from there: the first seconds' p99 within 2x the steady p99. Filed against the
    code before it: the limit sat at 64 through the light load, the flood's first wave
    queued 64 deep in Triton, 1.0-1.3 s against 0.13-0.20 s steady (three real runs)."""
    clock = Clock()
    limit = adaptive(clock, idle=8)
    assert limit.limit == 64
    # the burst: 24 at once on a cold replica, all admitted (24 < 64), none a quiet sample
    admitted_at = clock.now
    for _ in range(24):
        clock.now += 0.0025
        limit.observe("text", clock.now - admitted_at, admitted_at, 23)
    assert limit.limit >= 24
    # the light load: two always in flight, never alone, past the 10 s the burst is kept
    until = clock.now + 12.0
    while clock.now < until:
        clock.now += 0.005
        limit.observe("text", 0.010, clock.now - 0.010, 1)
    assert limit.limit == limit.settings.idle == 8
    flood = simulate(limit, clock, lambda t: 0.010, parallel=4, until=clock.now + 10.0)
    start = flood[0][0]
    whole = percentile([latency for _, latency in flood], 0.99)
    steady = percentile(between(flood, start + 2.0, start + 10.0), 0.99)
    print(f"whole p99 {whole * 1000:.0f} ms, steady {steady * 1000:.0f} ms")
    assert whole <= 2 * steady


def test_a_limit_an_overload_left_low_rises_to_idle_under_a_light_load() -> None:
    """After a flood taught it a few, a light load that never reaches the limit lets it rise
    (while nothing queues) to ``idle``, so a burst after the flood is admitted again."""
    clock = Clock()
    limit = adaptive(clock, idle=8)
    simulate(limit, clock, lambda t: 0.010, parallel=4, until=10.0)
    assert limit.limit < 8
    for _ in range(2600):  # 13 s: past the 10 s the flood's peaks are kept
        clock.now += 0.005
        limit.observe("text", 0.010, clock.now - 0.010, 0)
    assert limit.limit == 8


def test_a_load_in_waves_keeps_room_for_its_waves() -> None:
    """10 clients, a second of 1, 10 again (the canary test's groups): the limit stays at
    twice the 10 the last 10 s saw, so the next wave is not a flood over a fallen limit."""
    clock = Clock()
    limit = adaptive(clock, idle=8)
    lowest = 64
    for _wave in range(6):
        for _ in range(200):  # 10 in flight for 1 s
            clock.now += 0.005
            limit.observe("text", 0.050, clock.now - 0.050, 9)
        for _ in range(50):  # the wave's tail: 1 in flight for 1 s
            clock.now += 0.02
            limit.observe("text", 0.010, clock.now - 0.010, 0)
            lowest = min(lowest, limit.limit)
    assert lowest == 20
    assert not limit.probing
