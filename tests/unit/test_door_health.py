"""The gRPC door's health service under calls whose message never comes: at most
``max_reads`` wait for theirs at once, a new one taking the oldest's place, so a probe's
check (its message with its call) is answered however many are held open without one.
A fake call context stands in for gRPC's (the real door: tests/integration/
test_grpc_held_connections.py)."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from gateway.rpc.service import DoorHealth

SERVING = b"\x08\x01"


class AbortedError(Exception):
    def __init__(self, code: grpc.StatusCode) -> None:
        super().__init__(code)
        self.code = code


class Call:
    """A call whose message comes when ``send`` is called (or never)."""

    def __init__(self) -> None:
        self.message: asyncio.Future[object] = asyncio.get_running_loop().create_future()

    def send(self, raw: object) -> None:
        self.message.set_result(raw)

    async def read(self) -> object:
        return await self.message

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise AbortedError(code)


async def _outcome(task: asyncio.Task[bytes]) -> bytes | grpc.StatusCode:
    try:
        return await task
    except AbortedError as aborted:
        return aborted.code


def test_a_new_check_takes_the_oldest_silent_ones_place() -> None:
    async def scenario() -> None:
        health = DoorHealth(max_watches=8, max_reads=2)
        health.set(True)
        silent = [Call() for _ in range(5)]
        held = [asyncio.ensure_future(health.check(None, call)) for call in silent]
        await asyncio.sleep(0.01)
        # 5 opened, 2 may wait: the 3 oldest gave way as the newer ones came
        assert [task.done() for task in held] == [True, True, True, False, False]
        assert [await _outcome(task) for task in held[:3]] == [grpc.StatusCode.RESOURCE_EXHAUSTED] * 3
        probe = Call()
        answer = asyncio.ensure_future(health.check(None, probe))
        probe.send(b"")
        assert await asyncio.wait_for(answer, 1) == SERVING
        # the probe took the place of the oldest still waiting; the newest waits on
        assert held[3].done()
        assert not held[4].done()
        silent[4].send(b"")
        assert await asyncio.wait_for(held[4], 1) == SERVING

    asyncio.run(scenario())


def test_a_silent_check_ends_at_its_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("gateway.rpc.service.HEALTH_READ_SECONDS", 0.05)

    async def scenario() -> None:
        health = DoorHealth(max_watches=8, max_reads=2)
        task = asyncio.ensure_future(health.check(None, Call()))
        assert await asyncio.wait_for(_outcome(task), 1) == grpc.StatusCode.DEADLINE_EXCEEDED
        # nothing is left waiting: two new silent checks wait, neither pushed out
        pending = [asyncio.ensure_future(health.check(None, Call())) for _ in range(2)]
        await asyncio.sleep(0.01)
        assert not any(task.done() for task in pending)
        for task in pending:
            task.cancel()

    asyncio.run(scenario())


def test_a_check_whose_stream_ends_without_a_message_is_refused() -> None:
    async def scenario() -> None:
        health = DoorHealth(max_watches=8, max_reads=2)
        call = Call()
        task = asyncio.ensure_future(health.check(None, call))
        call.send(grpc.aio.EOF)  # what gRPC hands over when the client closes with nothing sent
        assert await asyncio.wait_for(_outcome(task), 1) == grpc.StatusCode.INVALID_ARGUMENT

    asyncio.run(scenario())
