"""State shared by every replica, in Redis: the one place the ``redis`` package is used.

- Token buckets, one per rate-limited key id (never the key): one server-side script a
  request, one round trip, on Redis's clock (replicas' clocks never disagree about it).
- Drift windows and references (gateway.observe.drift): counts per model, version and time
  slot in expiring hashes, one string per reference.
- Run-time routing (version pins; later rollouts): one hash, written by whichever replica
  took the admin call and read back by every replica every ``routing_poll_seconds``.

Every command is bounded by ``timeout_seconds``. A failure marks the store down for
``retry_seconds`` (the callers apply their policy meanwhile, without waiting on Redis
again), then the next call tries again: recovery needs nothing but Redis back.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from gateway.errors import SharedStateUnavailableError
from gateway.settings import RedisSettings

logger = logging.getLogger("gateway.sharedstate")
T = TypeVar("T")

# KEYS[1]: the bucket. ARGV: rate (tokens/s), burst. Returns {taken 0|1, tokens left, wait s}
# as strings (Lua numbers come back from Redis as integers otherwise).
TAKE_TOKEN = """
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local state = redis.call('HMGET', KEYS[1], 'tokens', 'stamp')
local tokens = tonumber(state[1]) or burst
local stamp = tonumber(state[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - stamp) * rate)
local taken = 0
local wait = 0
if tokens >= 1 then
  tokens = tokens - 1
  taken = 1
else
  wait = (1 - tokens) / rate
end
redis.call('HSET', KEYS[1], 'tokens', string.format('%.6f', tokens), 'stamp', string.format('%.6f', now))
redis.call('EXPIRE', KEYS[1], math.ceil(burst / rate) + 60)
return {tostring(taken), string.format('%.6f', tokens), string.format('%.6f', wait)}
"""


class SharedStateDownError(SharedStateUnavailableError):
    """Redis did not answer in time (or is marked down after a recent failure). Callers
    apply their policy; one that escapes is still a 503 problem, never a 500."""


@dataclass(frozen=True)
class Taken:
    """One bucket's answer: whether a token was taken, what is left, and the wait for one."""

    taken: bool
    tokens: float
    wait: float


class SharedState:
    """The Redis boundary. Its health (``up``) is decided by every command, whoever
    sends it; ``on_health`` hears each outcome, so a gauge fed from it is true at rest as
    long as something polls (the routing read-back does, every ``routing_poll_seconds``)."""

    def __init__(self, settings: RedisSettings, on_health: Callable[[bool], None] | None = None) -> None:
        import redis.asyncio as redis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.exceptions import NoScriptError

        assert settings.url is not None
        self._settings = settings
        self._pool = redis.BlockingConnectionPool.from_url(
            settings.url.get_secret_value(),
            max_connections=settings.max_connections,
            timeout=settings.timeout_seconds,  # waiting for a free connection counts too
            socket_timeout=settings.timeout_seconds,
            socket_connect_timeout=settings.connect_timeout_seconds,
            # One immediate retry on a broken connection (a pooled connection to a Redis
            # that restarted), none on a timeout; redis-py's default is 10 retries with
            # backoff up to 1 s, which would hold requests while Redis is down.
            retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
            decode_responses=True,
        )
        self._client = redis.Redis(connection_pool=self._pool)
        # EVALSHA with the script's digest; loaded again when Redis answers NOSCRIPT (a
        # restarted Redis has lost it).
        self._sha = hashlib.sha1(TAKE_TOKEN.encode()).hexdigest()
        self._no_script = NoScriptError
        # RuntimeError: uvloop's "unable to perform operation on <TCPTransport closed=True>",
        # raised when the client writes to a connection Redis has just dropped (Redis killed
        # under load): the same failure as a reset, seen once as a 500 in the suite.
        self._errors = (redis.RedisError, OSError, TimeoutError, RuntimeError)
        self._down_until = 0.0
        self.up = True
        self._on_health = on_health or (lambda up: None)
        self._routing_key = f"{settings.prefix}:routing"

    def _key(self, *parts: str) -> str:
        return ":".join((self._settings.prefix, *parts))

    async def _run(self, what: str, call: Awaitable[T]) -> T:
        if time.monotonic() < self._down_until:
            close = getattr(call, "close", None)
            if close is not None:
                close()  # the coroutine never runs: no "never awaited" warning
            raise SharedStateDownError("marked down after a recent failure")
        try:
            # Bounded by the pool's wait, the connect timeout and the socket timeout.
            result = await call
        except self._no_script:
            raise  # Redis answered (it lost the script): the caller loads it
        except self._errors as exc:
            self._mark_down(what, exc)
            raise SharedStateDownError(f"Redis: {type(exc).__name__}") from exc
        if not self.up:
            logger.info("shared state (Redis) answers again")
        self.up = True
        self._on_health(True)
        return result

    def _mark_down(self, what: str, exc: BaseException) -> None:
        if self.up:
            logger.error("shared state (Redis) failed on %s (%s): policy applies", what, type(exc).__name__)
        self.up = False
        self._on_health(False)
        self._down_until = time.monotonic() + self._settings.retry_seconds

    async def take_token(self, key_id: str, rate: float, burst: float) -> Taken:
        """Take one token of ``key_id``'s shared bucket; SharedStateDownError when Redis does not answer."""
        bucket = self._key("bucket", key_id)
        try:
            call = cast(Awaitable[list[str]], self._client.evalsha(self._sha, 1, bucket, rate, burst))
            taken, tokens, wait = await self._run("a rate limit", call)
        except self._no_script:
            await self._run("loading the rate-limit script", self._client.script_load(TAKE_TOKEN))
            call = cast(Awaitable[list[str]], self._client.evalsha(self._sha, 1, bucket, rate, burst))
            taken, tokens, wait = await self._run("a rate limit", call)
        return Taken(taken == "1", float(tokens), float(wait))

    async def routing(self) -> dict[str, str]:
        """Every run-time routing field (e.g. ``pin:<model>`` -> version)."""
        call = cast(Awaitable[dict[str, str]], self._client.hgetall(self._routing_key))
        return dict(await self._run("reading routing", call))

    async def set_routing(self, field: str, value: str) -> None:
        call = cast(Awaitable[Any], self._client.hset(self._routing_key, field, value))
        await self._run("writing routing", call)

    async def delete_routing(self, field: str) -> None:
        call = cast(Awaitable[Any], self._client.hdel(self._routing_key, field))
        await self._run("writing routing", call)

    async def add_counts(self, key: str, fields: dict[str, int], ttl: int) -> None:
        """Add ``fields`` to the counts of hash ``key`` (one round trip), expiring in ``ttl`` s."""
        if not fields:
            return
        pipe = self._client.pipeline(transaction=False)
        name = self._key(key)
        for field, count in fields.items():
            pipe.hincrby(name, field, count)
        pipe.expire(name, ttl)
        await self._run("sharing counts", pipe.execute())

    async def read_counts(self, keys: Sequence[str]) -> list[dict[str, str]]:
        """Every field of each hash (one round trip; a missing hash is empty)."""
        pipe = self._client.pipeline(transaction=False)
        for key in keys:
            pipe.hgetall(self._key(key))
        return [dict(found) for found in await self._run("reading counts", pipe.execute())]

    async def add_usage(self, key: str, amount: int, ttl: int) -> int:
        """Add ``amount`` (negative: give back) to counter ``key`` (expiring ``ttl`` s after
        its first use); its new value. One round trip."""
        pipe = self._client.pipeline(transaction=False)
        name = self._key(key)
        pipe.incrby(name, amount)
        pipe.expire(name, ttl, nx=True)
        used, _ = await self._run("counting a quota", pipe.execute())
        return int(used)

    async def read_usage(self, keys: Sequence[str]) -> list[int]:
        """Each counter's value (0 when absent), one round trip."""
        found = await self._run("reading quotas", self._client.mget([self._key(k) for k in keys]))
        return [int(value or 0) for value in found]

    async def get_text(self, key: str) -> str | None:
        return cast(str | None, await self._run("reading a value", self._client.get(self._key(key))))

    async def set_text(self, key: str, value: str) -> None:
        await self._run("writing a value", cast(Awaitable[Any], self._client.set(self._key(key), value)))

    async def delete_key(self, key: str) -> bool:
        removed = await self._run("deleting a value", self._client.delete(self._key(key)))
        return bool(removed)

    async def ping(self) -> bool:
        try:
            await self._run("ping", cast(Awaitable[Any], self._client.ping()))
        except SharedStateDownError:
            return False
        return True

    async def close(self) -> None:
        await self._client.aclose()
        await self._pool.aclose()
