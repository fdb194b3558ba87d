"""Placement across Triton replicas (gateway.serving.placement) over fake transports: a
call goes where the queue drains first, a replica that stalls or stops answering is
passed over, model control reaches every replica. The real thing, two Tritons one of
them slowed, is tests/integration/test_placement_live.py."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from gateway.errors import TritonUnavailableError
from gateway.observe.metrics import GatewayMetrics
from gateway.serving.placement import Placement, endpoints
from gateway.triton.backend import InferenceBackend, InferResult, ServerStatus


class FakeTriton:
    """A replica serving one call at a time, each for ``seconds`` (``None``: never), so
    calls queue as on a busy Triton; live while ``live``; it records what it was asked."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self.live = True
        self.calls = 0
        self.loaded: list[str] = []
        self.closed = False
        self._one_at_a_time = asyncio.Lock()

    async def infer(self, model: str, *args: Any, **kwargs: Any) -> InferResult:
        self.calls += 1
        if not self.live:
            raise TritonUnavailableError("down")
        if self.seconds is None:
            await asyncio.Event().wait()
        async with self._one_at_a_time:
            await asyncio.sleep(self.seconds or 0)
        return InferResult("1", {})

    async def is_live(self, within: float) -> bool:
        return self.live

    async def server_status(self) -> ServerStatus:
        return ServerStatus(live=self.live, version=str(id(self)))

    async def load_model(self, model: str) -> None:
        self.loaded.append(model)

    async def statistics(self, model: str, version: str) -> dict[str, Any]:
        if not self.live:
            raise TritonUnavailableError("down")
        return {"model_stats": [{"name": "m", "version": str(id(self))}]}

    async def close(self) -> None:
        self.closed = True


def as_backend(fake: FakeTriton) -> InferenceBackend:
    """The fake as the transport it stands for (it has only what these tests call)."""
    return fake  # type: ignore[return-value]


def placed(
    replicas: dict[str, FakeTriton], test: Callable[[Placement], Awaitable[None]], **kwargs: Any
) -> None:
    async def run() -> None:
        placement = Placement(
            list(replicas),
            lambda address: as_backend(replicas[address]),
            probe_interval=0.05,
            probe_timeout=0.05,
            **kwargs,
        )
        try:
            await test(placement)
        finally:
            await placement.close()

    asyncio.run(run())


def share(replicas: dict[str, FakeTriton]) -> dict[str, float]:
    total = sum(r.calls for r in replicas.values())
    return {name: r.calls / total for name, r in replicas.items()}


async def closed_loop(placement: Placement, clients: int, seconds: float) -> None:
    """``clients`` each calling back to back for ``seconds``."""
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds

    async def client() -> None:
        while loop.time() < end:
            await placement.infer("m", "", [], "r")

    await asyncio.gather(*(client() for _ in range(clients)))


def test_a_replica_5x_slower_gets_about_a_sixth_of_the_calls_and_round_robin_half() -> None:
    replicas = {"fast:1": FakeTriton(0.004), "slow:1": FakeTriton(0.020)}
    placed(replicas, lambda p: closed_loop(p, 8, 1.0))
    by_queue = share(replicas)["slow:1"]
    replicas = {"fast:1": FakeTriton(0.004), "slow:1": FakeTriton(0.020)}
    placed(replicas, lambda p: closed_loop(p, 8, 1.0), round_robin=True)
    by_turn = share(replicas)["slow:1"]
    assert 0.08 < by_queue < 0.3, by_queue  # 1/6 would match their speeds
    assert 0.45 < by_turn < 0.55, by_turn


def test_a_replica_that_stalls_is_passed_over_before_any_probe_says_so() -> None:
    stalled, fine = FakeTriton(None), FakeTriton(0.002)
    replicas = {"stalled:1": stalled, "fine:1": fine}

    async def test(placement: Placement) -> None:
        for _ in range(20):  # both known fast first
            await placement.infer("m", "", [], "r")
        stalled.seconds = None
        stuck = [asyncio.create_task(placement.infer("m", "", [], "r")) for _ in range(4)]
        await asyncio.sleep(0.02)
        before = stalled.calls
        await closed_loop(placement, 4, 0.3)
        assert stalled.calls - before <= 1, stalled.calls - before
        for task in stuck:
            task.cancel()
        await asyncio.gather(*stuck, return_exceptions=True)

    stalled.seconds = 0.002
    placed(replicas, test)


def test_a_replica_that_stops_answering_is_taken_out_and_put_back_when_it_answers() -> None:
    one, two = FakeTriton(0.001), FakeTriton(0.001)
    replicas = {"one:1": one, "two:1": two}

    async def test(placement: Placement) -> None:
        one.live = False
        await asyncio.sleep(0.15)  # a probe or two
        assert [r.up for r in placement.replicas.values()] == [False, True]
        before = one.calls
        await closed_loop(placement, 4, 0.2)
        assert one.calls == before
        one.live = True
        await asyncio.sleep(0.15)
        await closed_loop(placement, 4, 0.2)
        assert one.calls > before
        assert {r.address: r.up for r in placement.readings()} == {"one:1": True, "two:1": True}

    placed(replicas, test)


def test_a_call_refused_as_unavailable_is_moved_and_the_breaker_sees_live_while_one_is() -> None:
    one, two = FakeTriton(0.001), FakeTriton(0.001)
    replicas = {"one:1": one, "two:1": two}

    async def test(placement: Placement) -> None:
        one.live = False  # its calls answer UNAVAILABLE; no probe has seen it yet
        results = await asyncio.gather(*(placement.infer("m", "", [], "r") for _ in range(10)))
        assert len(results) == 10
        assert not placement.replicas["one:1"].up  # taken out by the first refusal
        assert one.calls <= 2, one.calls  # (two calls may have been placed at once)
        assert await placement.is_live(0.1)
        two.live = False
        assert not await placement.is_live(0.1)
        with pytest.raises(TritonUnavailableError):  # none left to move to: the failure stands
            await placement.infer("m", "", [], "r")

    placed(replicas, test)


def test_calls_waiting_on_a_replica_that_hangs_are_moved_when_its_probe_fails() -> None:
    hangs, fine = FakeTriton(0.001), FakeTriton(0.001)
    replicas = {"hangs:1": hangs, "fine:1": fine}

    async def test(placement: Placement) -> None:
        hangs.seconds = None  # it takes calls and never answers
        calls = [asyncio.create_task(placement.infer("m", "", [], "r")) for _ in range(6)]
        await asyncio.sleep(0.01)
        assert placement.replicas["hangs:1"].calls  # some were placed on it
        hangs.live = False  # what its probe will now see (a timeout, for a real one)
        done = await asyncio.wait_for(asyncio.gather(*calls), timeout=1.0)
        assert len(done) == 6
        assert not placement.replicas["hangs:1"].calls

    placed(replicas, test)


def test_a_caller_going_away_still_cancels_its_call() -> None:
    replicas = {"one:1": FakeTriton(None), "two:1": FakeTriton(None)}

    async def test(placement: Placement) -> None:
        call = asyncio.create_task(placement.infer("m", "", [], "r"))
        await asyncio.sleep(0.01)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert not any(r.calls for r in placement.replicas.values())

    placed(replicas, test)


def test_model_control_reaches_every_replica_and_status_the_first_up() -> None:
    one, two = FakeTriton(0.001), FakeTriton(0.001)
    replicas = {"one:1": one, "two:1": two}

    async def test(placement: Placement) -> None:
        await placement.load_model("m")
        assert one.loaded == two.loaded == ["m"]
        one.live = False
        await placement.is_live(0.1)
        assert (await placement.server_status()).version == str(id(two))

    placed(replicas, test)


def test_a_name_followed_adds_new_addresses_and_retires_gone_ones_after_their_calls() -> None:
    known = {"a:1": FakeTriton(0.001), "b:1": FakeTriton(0.001), "c:1": FakeTriton(0.001)}
    answer = ["a:1", "b:1"]

    async def resolve() -> list[str]:
        return list(answer)

    async def test(placement: Placement) -> None:
        placement._resolved_at = -1e9  # due now
        answer[:] = ["b:1", "c:1"]
        await asyncio.sleep(0.15)
        assert sorted(placement.replicas) == ["b:1", "c:1"]
        assert known["a:1"].closed
        await closed_loop(placement, 4, 0.1)
        assert Counter(name for name, r in known.items() if r.calls) == Counter({"b:1": 1, "c:1": 1})

    async def run() -> None:
        placement = Placement(
            ["a:1", "b:1"],
            lambda address: as_backend(known[address]),
            probe_interval=0.05,
            probe_timeout=0.05,
            resolve=resolve,
        )
        try:
            await test(placement)
        finally:
            await placement.close()

    asyncio.run(run())


def test_the_replicas_are_exported_by_address() -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    replicas = {"one:1": FakeTriton(0.001), "two:1": FakeTriton(0.001)}

    async def test(placement: Placement) -> None:
        metrics = GatewayMetrics(CollectorRegistry())
        metrics.watch_replicas(placement.readings)
        metrics.watch_replicas(placement.readings)  # a second placement replaces the first
        await placement.infer("m", "", [], "r")
        text = generate_latest(metrics.registry).decode()
        assert 'gateway_triton_replica_up{replica="one:1"} 1.0' in text
        assert 'gateway_triton_replica_up{replica="two:1"} 1.0' in text
        assert (
            sum(
                float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith("gateway_triton_replica_calls_total{")
            )
            == 1
        )

    placed(replicas, test)


@pytest.mark.parametrize(
    ("url", "expected"),
    [("t:8001", ["t:8001"]), ("a:1, b:2", ["a:1", "b:2"]), ("[::1]:8001,b:2", ["[::1]:8001", "b:2"])],
)
def test_endpoints_of_a_url(url: str, expected: list[str]) -> None:
    assert endpoints(url) == expected


def test_the_gate_reads_each_replicas_statistics_and_none_of_a_replica_out() -> None:
    """The gate on Triton's queue (gateway.serving.queuegate) reads every replica's own
    counters: each up replica's statistics by address; one that fails is left out; none
    answering is Triton's failure."""
    replicas = {"a:1": FakeTriton(0.0), "b:1": FakeTriton(0.0)}

    async def test(placement: Placement) -> None:
        found = await placement.statistics_by_replica()
        assert set(found) == {"a:1", "b:1"}
        assert found["a:1"]["model_stats"][0]["version"] == str(id(replicas["a:1"]))
        replicas["b:1"].live = False
        assert set(await placement.statistics_by_replica()) == {"a:1"}  # b:1 failed
        await placement.is_live(0.05)  # b:1 is taken out
        assert set(await placement.statistics_by_replica()) == {"a:1"}
        replicas["a:1"].live = False
        with pytest.raises(TritonUnavailableError):
            await placement.statistics_by_replica()  # a:1 fails, none other up

    placed(replicas, test)
