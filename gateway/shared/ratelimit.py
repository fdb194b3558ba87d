"""Per-key rate limits: token buckets in this process, or shared by every replica in Redis.

With a shared store, a key's configured rate is its rate across all replicas. While the
store does not answer, ``redis.on_failure`` decides:

- ``local`` (default): each replica limits the key at rate/replicas (burst likewise, at
  least 1): the total stays about right while every replica gets traffic;
- ``refuse``: rate-limited keys get 503 ``shared-state-unavailable`` (keys without a
  limit are not affected);
- ``allow``: no limit at all until the store is back.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gateway.settings import RedisSettings
from gateway.shared.fallback import SharedWithFallback
from gateway.shared.swept import Swept

if TYPE_CHECKING:
    from collections.abc import Callable

    from gateway.observe.metrics import GatewayMetrics
    from gateway.shared.keyfiles import ApiKey
    from gateway.shared.store import SharedState


@dataclass
class TokenBucket:
    """``rate`` tokens a second, holding at most ``burst``."""

    rate: float
    burst: float
    tokens: float = field(init=False)
    stamp: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self.tokens = self.burst

    def full(self, now: float) -> bool:
        """Whether it has refilled by ``now`` (a fresh bucket is the same)."""
        return self.tokens + (now - self.stamp) * self.rate >= self.burst

    def take(self, now: float) -> float:
        """0 when a token was taken; else the seconds until one will be there."""
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / self.rate


@dataclass(frozen=True)
class Verdict:
    """A key's request: allowed or how long to wait, and the bucket it was judged by."""

    wait: float
    tokens: float
    rate: float
    burst: float


class RateLimiter(SharedWithFallback):
    def __init__(
        self,
        store: SharedState | None,
        settings: RedisSettings,
        metrics: GatewayMetrics | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(store, settings, metrics)
        # the local buckets' clock (a test's own: patching time.monotonic would move the
        # clock of every event loop in the process)
        self._clock = clock
        # a full bucket is a fresh one: forgotten, so tenants that come and go leave nothing
        self._local: Swept[tuple[str, float, float], TokenBucket] = Swept(TokenBucket.full)

    def _bucket(self, key_id: str, rate: float, burst: float, now: float) -> TokenBucket:
        # Keyed by the limit too: a rotated keys file that changes a key's rate starts afresh.
        found = self._local.get((key_id, rate, burst))
        if found is None:
            found = TokenBucket(rate, burst, stamp=now)
            self._local.put((key_id, rate, burst), found, now)
        return found

    def _local_verdict(self, key_id: str, rate: float, burst: float) -> Verdict:
        now = self._clock()
        bucket = self._bucket(key_id, rate, burst, now)
        wait = bucket.take(now)
        return Verdict(wait, bucket.tokens, rate, burst)

    async def check(self, key: ApiKey) -> Verdict | None:
        """None for a key without a limit; else the verdict. Raises
        SharedStateUnavailableError under the ``refuse`` policy while the store is down."""
        if not key.rate or not key.burst:
            return None
        if self._store is None:
            return self._local_verdict(key.id, key.rate, key.burst)
        from gateway.shared.store import SharedStateDownError

        try:
            taken = await self._store.take_token(key.id, key.rate, key.burst)
        except SharedStateDownError:
            if self._fallback("rate limits") == "allow":
                return Verdict(0.0, key.burst, key.rate, key.burst)
            share = self._settings.replicas
            return self._local_verdict(key.id, key.rate / share, max(1.0, key.burst / share))
        wait = 0.0 if taken.taken else max(taken.wait, 1e-6)
        return Verdict(wait, taken.tokens, key.rate, key.burst)
