"""Per-caller state stays bounded however many callers come (an OpenID provider can mint
thousands of tenants): what is the same as a fresh entry is forgotten, and nothing that
still limits a caller is."""

from __future__ import annotations

import asyncio

from gateway.settings import RedisSettings
from gateway.shared.keyfiles import ApiKey
from gateway.shared.ratelimit import RateLimiter
from gateway.shared.swept import Swept


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _tenant_key(n: int) -> ApiKey:
    return ApiKey(f"idp:tenant-{n}", b"", rate=1.0, burst=2.0)


def test_rate_buckets_of_tenants_gone_quiet_are_forgotten() -> None:
    clock = Clock()
    limiter = RateLimiter(None, RedisSettings(), clock=clock)

    async def scenario() -> None:
        for wave in range(4):  # 4 x 2,000 tenants, each sending once and leaving
            for n in range(2000):
                verdict = await limiter.check(_tenant_key(wave * 2000 + n))
                assert verdict is not None
                assert verdict.wait == 0
            clock.now += 5  # every bucket refills: the same as a fresh one

    asyncio.run(scenario())
    assert len(limiter._local) <= 4000  # at most about twice the live ones (8,000 before)


def test_a_bucket_that_still_limits_is_never_forgotten() -> None:
    clock = Clock()
    limiter = RateLimiter(None, RedisSettings(), clock=clock)
    spent = ApiKey("spent", b"", rate=0.001, burst=1.0)

    async def scenario() -> float:
        first = await limiter.check(spent)
        assert first is not None
        assert first.wait == 0
        for n in range(6000):  # sweeps happen meanwhile
            await limiter.check(_tenant_key(n))
        clock.now += 5
        for n in range(6000, 9000):
            await limiter.check(_tenant_key(n))
        again = await limiter.check(spent)
        assert again is not None
        return again.wait

    assert asyncio.run(scenario()) > 0


def test_the_sweep_keeps_live_entries_and_happens_on_doubling() -> None:
    swept: Swept[str, float] = Swept(lambda value, now: value < now, floor=4)
    for n in range(4):
        swept.put(f"old-{n}", 0.0, 0.0)
    swept.put("live", 10.0, 1.0)  # the fifth: a sweep at now=1 drops the four old ones
    assert len(swept) == 1
    assert swept.get("live") == 10.0
    assert swept.get("old-0") is None
