"""One answer shared by the probes of a moment (single flight, short memory)."""

from __future__ import annotations

import asyncio

from gateway.serving.shared_result import SharedResult


def test_concurrent_callers_share_one_call_and_reuse_it_within_its_ttl() -> None:
    calls = 0

    async def make() -> int:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.05)
        return calls

    async def scenario() -> None:
        shared: SharedResult[int] = SharedResult(ttl=0.2)
        answers = await asyncio.gather(*(shared.get(make) for _ in range(100)))
        assert answers == [1] * 100
        assert await shared.get(make) == 1  # within the ttl: reused
        await asyncio.sleep(0.25)
        assert await shared.get(make) == 2  # past it: asked again
        assert await shared.get(make, generation=1) == 3  # a new generation: at once

    asyncio.run(scenario())
    assert calls == 3
