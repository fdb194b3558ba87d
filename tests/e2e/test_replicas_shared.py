"""Replicas that agree, for real: two `triton-gateway serve` processes behind the shipped
HAProxy configuration, a real Triton and a real redis-server.

- A key limited to 20 requests/s, flooded through both replicas for 10 s, gets 200 for
  20/s x 10 s + its burst, within 10 %, and 429 with Retry-After and RateLimit for the
  rest (the flood reads the catalog, a cheap route behind the keys, so it measures the
  limiter and not Triton's throughput). Without Redis (today's code) it gets about twice that.
- Redis SIGKILLed under that flood: only 200 and 429 (the default `local` policy), no
  request held; Redis back: both replicas share again within a few seconds.
- A pin set through one replica is applied by the other within 1 s.
- Keys rotated under load: the old key 401 within 2 s, the new key 200, and a third
  client's requests all 200 throughout.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from gateway.dev.redisserver import RedisServer
from gateway.dev.tritonserver import TritonServer
from gateway.shared.keyfiles import hash_key

from helpers.balancer import Balanced, balanced_replicas

pytestmark = pytest.mark.alone  # it times or loads the machine: run with nothing beside it

RATE, BURST = 20, 20
FLOODED = {"X-API-Key": "flooded-key"}
STEADY = {"X-API-Key": "steady-key"}  # no limit: the warm-up's and the bystanders' key
ADMIN = {"Authorization": "Bearer ops-secret"}
TEXT = {"text": "The striker scored twice in the final."}


@dataclass
class Flood:
    answers: list[tuple[float, int, dict[str, str]]] = field(default_factory=list)  # (at, status, headers)
    seconds: float = 0.0
    slowest: float = 0.0

    def count(self, status: int, since: float = 0.0, until: float = float("inf")) -> int:
        return sum(1 for at, code, _ in self.answers if code == status and since <= at < until)

    def statuses(self) -> set[int]:
        return {code for _, code, _ in self.answers}


async def _flood(url: str, headers: dict[str, str], seconds: float, clients: int) -> Flood:
    flood = Flood()
    started = time.monotonic()

    async def client() -> None:
        async with httpx.AsyncClient(base_url=url, timeout=30, headers=headers) as http:
            while (now := time.monotonic()) - started < seconds:
                try:
                    # A cheap route behind the keys (the catalog): the flood measures the
                    # limiter, not Triton's throughput.
                    response = await http.get("/models")
                except httpx.TransportError:
                    flood.answers.append((now - started, -1, {}))
                    continue
                took = time.monotonic() - now
                flood.slowest = max(flood.slowest, took)
                kept = {
                    k: response.headers[k]
                    for k in ("retry-after", "ratelimit", "content-type")
                    if k in response.headers
                }
                flood.answers.append((now - started, response.status_code, kept))

    await asyncio.gather(*(client() for _ in range(clients)))
    flood.seconds = time.monotonic() - started
    return flood


def flood(url: str, headers: dict[str, str], seconds: float, clients: int = 12) -> Flood:
    return asyncio.run(_flood(url, headers, seconds, clients))


def write_keys(path: Path, *lines: str) -> Path:
    path.write_text("".join(f"{line}\n" for line in lines))
    return path


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.stop()


def stack(triton: TritonServer, tmp_path: Path, redis: RedisServer | None, **env: str) -> Iterator[Balanced]:
    keys = write_keys(
        tmp_path / "keys",
        f"flooded {hash_key('flooded-key')} {RATE} {BURST}",
        f"steady {hash_key('steady-key')}",
        f"old {hash_key('old-key')}",
    )
    admin = write_keys(tmp_path / "admin-keys", f"ops {hash_key('ops-secret')}")
    settings = {
        "GATEWAY_AUTH__KEYS_FILE": str(keys),
        "GATEWAY_AUTH__RELOAD_SECONDS": "0.5",
        "GATEWAY_AUTH__METRICS_READERS": '["steady"]',  # the bystanders' key reads /metrics
        "GATEWAY_ADMIN__KEYS_FILE": str(admin),
        **env,
    }
    if redis is not None:
        settings["GATEWAY_REDIS__URL"] = redis.url
    with balanced_replicas(triton, tmp_path, headers=STEADY, **settings) as balanced:
        yield balanced


@pytest.fixture
def shared(triton: TritonServer, tmp_path: Path, redis: RedisServer) -> Iterator[Balanced]:
    yield from stack(triton, tmp_path, redis)


@pytest.fixture
def unshared(triton: TritonServer, tmp_path: Path) -> Iterator[Balanced]:
    yield from stack(triton, tmp_path, None)


def expected_allowed(seconds: float) -> float:
    return RATE * seconds + BURST


def test_a_key_gets_its_rate_in_total_across_replicas(shared: Balanced) -> None:
    result = flood(shared.url, FLOODED, 10.0)
    allowed, expected = result.count(200), expected_allowed(result.seconds)
    print(
        f"shared: {allowed} allowed of {len(result.answers)} in {result.seconds:.1f} s (expected {expected:.0f})"
    )
    assert abs(allowed - expected) <= 0.1 * expected, (allowed, expected)
    assert result.statuses() == {200, 429}
    refused = next(headers for _, code, headers in result.answers if code == 429)
    assert refused["content-type"] == "application/problem+json"
    assert int(refused["retry-after"]) >= 1
    assert refused["ratelimit"].startswith('"default";r=0;')
    assert result.count(429) > 3 * allowed  # it was a flood


def test_without_redis_the_limit_doubles_with_two_replicas(unshared: Balanced) -> None:
    """Today's behaviour, and why the shared store exists."""
    result = flood(unshared.url, FLOODED, 10.0)
    allowed, expected = result.count(200), expected_allowed(result.seconds)
    print(f"per replica: {allowed} allowed in {result.seconds:.1f} s (one limit: {expected:.0f})")
    assert allowed > 1.6 * expected, (allowed, expected)


def test_redis_killed_under_the_flood_and_back(shared: Balanced, redis: RedisServer) -> None:
    killed_at, back_at = 3.0, 7.0

    async def scenario() -> Flood:
        async def chaos() -> None:
            await asyncio.sleep(killed_at)
            redis.kill()
            await asyncio.sleep(back_at - killed_at)
            redis.start()

        result, _ = await asyncio.gather(_flood(shared.url, FLOODED, 12.0, 12), chaos())
        return result

    result = asyncio.run(scenario())
    print(
        f"Redis killed at {killed_at} s, back at {back_at} s: {sorted(result.statuses())}, slowest {result.slowest:.3f} s"
    )
    assert result.statuses() <= {200, 429}, result.statuses()
    assert result.count(200, killed_at + 0.5, back_at) > 0  # the local policy kept serving
    assert result.slowest < 2.0  # nobody waited on the dead Redis (deadline 10 s)
    # both replicas shared again, by themselves, within a few seconds
    deadline = time.monotonic() + 5
    while not all(
        "gateway_shared_state_up 1.0" in httpx.get(f"{replica.url}/metrics", headers=STEADY, timeout=5).text
        for replica in shared.replicas
    ):
        assert time.monotonic() < deadline, "a replica did not find Redis again"
        httpx.post(f"{shared.url}/classify", json=TEXT, headers=FLOODED, timeout=30)
        time.sleep(0.2)
    again = flood(shared.url, FLOODED, 4.0)
    assert again.count(200) <= 1.1 * expected_allowed(again.seconds)


def test_a_pin_set_through_one_replica_is_applied_by_the_other_within_a_second(shared: Balanced) -> None:
    first, second = shared.replicas
    pinned = httpx.put(
        f"{first.url}/admin/served/image_classifier", json={"version": "1"}, headers=ADMIN, timeout=30
    )
    assert pinned.status_code == 200, pinned.text
    set_at = time.monotonic()
    while True:
        served = httpx.get(f"{second.url}/admin/served", headers=ADMIN, timeout=5).json()
        if {s["name"]: s["version"] for s in served}["image_classifier"] == "1":
            break
        assert time.monotonic() - set_at < 1.0, "the other replica did not apply the pin within 1 s"
        time.sleep(0.05)
    print(f"pin applied by the other replica after {time.monotonic() - set_at:.2f} s")


def test_keys_rotated_under_load(shared: Balanced, tmp_path: Path) -> None:
    async def scenario() -> tuple[Flood, float, float]:
        bystanders = asyncio.create_task(_flood(shared.url, STEADY, 6.0, 4))
        await asyncio.sleep(1.5)
        async with httpx.AsyncClient(base_url=shared.url, timeout=30) as http:
            assert (
                await http.post("/classify", json=TEXT, headers={"X-API-Key": "old-key"})
            ).status_code == 200
            write_keys(
                tmp_path / "keys",
                f"flooded {hash_key('flooded-key')} {RATE} {BURST}",
                f"steady {hash_key('steady-key')}",
                f"new {hash_key('new-key')}",
            )
            rotated = time.monotonic()
            old_out = new_in = 0.0
            while not (old_out and new_in):
                assert time.monotonic() - rotated < 2.0, (old_out, new_in)
                old = await http.post("/classify", json=TEXT, headers={"X-API-Key": "old-key"})
                new = await http.post("/classify", json=TEXT, headers={"X-API-Key": "new-key"})
                if old.status_code == 401 and not old_out:
                    old_out = time.monotonic() - rotated
                if new.status_code == 200 and not new_in:
                    new_in = time.monotonic() - rotated
            # 2 s after the change, every replica: no 200 for the old key, no 401 for the new
            await asyncio.sleep(max(0.0, rotated + 2.0 - time.monotonic()))
            for _ in range(10):
                assert (
                    await http.post("/classify", json=TEXT, headers={"X-API-Key": "old-key"})
                ).status_code == 401
                assert (
                    await http.post("/classify", json=TEXT, headers={"X-API-Key": "new-key"})
                ).status_code == 200
        return await bystanders, old_out, new_in

    steady, old_out, new_in = asyncio.run(scenario())
    print(
        f"rotation: old key 401 after {old_out:.2f} s, new key 200 after {new_in:.2f} s; bystanders {steady.statuses()}"
    )
    assert steady.statuses() == {200}
