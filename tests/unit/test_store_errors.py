"""A Redis command that fails in any way the client or its transport can fail is a
shared-state outage (the policy applies), never a 500."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import SecretStr

from gateway.errors import SharedStateUnavailableError
from gateway.settings import RedisSettings
from gateway.shared.store import SharedState


@pytest.mark.parametrize(
    "error",
    [
        ConnectionResetError("reset"),
        TimeoutError(),
        # what uvloop raises when redis-py writes to a connection Redis has just closed
        RuntimeError("unable to perform operation on <TCPTransport closed=True>; the handler is closed"),
    ],
)
def test_a_failing_command_is_an_outage(error: Exception) -> None:
    async def scenario() -> None:
        store = SharedState(RedisSettings(url=SecretStr("redis://127.0.0.1:1/0")))

        async def command() -> int:
            raise error

        with pytest.raises(SharedStateUnavailableError):
            await store._run("a rate limit", command())
        assert store.up is False

    asyncio.run(scenario())
