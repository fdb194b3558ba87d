"""The gRPC door's health service: it answers the door's status without ever reading the
call's message (anyone may send one, and gRPC takes a message whole once it is read), and
bounds the watches open at once. A fake call context stands in for gRPC's (the real door:
tests/integration/test_grpc_held_connections.py, test_grpc_budget.py)."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from gateway.rpc.service import DoorHealth

SERVING = b"\x08\x01"
NOT_SERVING = b"\x08\x02"


class AbortedError(Exception):
    def __init__(self, code: grpc.StatusCode) -> None:
        super().__init__(code)
        self.code = code


class Call:
    """A call whose message must never be read; what the handler writes is kept."""

    def __init__(self) -> None:
        self.written: list[bytes] = []

    async def read(self) -> object:
        raise AssertionError("the health service read a message")

    async def write(self, raw: bytes) -> None:
        self.written.append(raw)

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise AbortedError(code)


def test_a_check_is_answered_without_its_message() -> None:
    async def scenario() -> None:
        health = DoorHealth(max_watches=8)
        assert await health.check(None, Call()) == NOT_SERVING
        health.set(True)
        assert await health.check(None, Call()) == SERVING

    asyncio.run(scenario())


def test_watches_get_each_change_and_past_their_bound_are_refused() -> None:
    async def scenario() -> None:
        health = DoorHealth(max_watches=2)
        calls = [Call(), Call()]
        watching = [asyncio.ensure_future(health.watch(None, call)) for call in calls]
        await asyncio.sleep(0.01)
        assert [call.written for call in calls] == [[NOT_SERVING]] * 2
        with pytest.raises(AbortedError) as refused:
            await health.watch(None, Call())
        assert refused.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        health.set(True)
        await asyncio.sleep(0.01)
        assert [call.written for call in calls] == [[NOT_SERVING, SERVING]] * 2
        watching[0].cancel()
        await asyncio.sleep(0.01)
        third = Call()
        task = asyncio.ensure_future(health.watch(None, third))  # the ended one's place
        await asyncio.sleep(0.01)
        assert third.written == [SERVING]
        for pending in (watching[1], task):
            pending.cancel()

    asyncio.run(scenario())
