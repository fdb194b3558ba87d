"""Per-key quotas over a UTC day or month: requests, and images for image models.

A key's line in the keys file carries them (``quota=100000/day``,
``image-quota=2000000/month``). Each is a counter per key, unit and period (``2026-11-25``
or ``2026-11``), in Redis with every replica's traffic (INCRBY, expiring after the
period), or in this process without Redis. A request that would take a counter past its
quota is refused 429 ``quota-exceeded`` with ``Retry-After`` the seconds until the period
ends, and gives back what it took; every answer to a key with a quota carries the
``RateLimit`` header for it (the IETF draft's structured fields, beside the per-second
policy). While Redis does not answer, ``redis.on_failure`` decides, as for rate limits:
``local`` counts here against quota/replicas, ``refuse`` answers 503, ``allow`` lets it by.
"""

from __future__ import annotations

import calendar
import contextlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

from gateway.errors import QuotaExceededError, SharedStateUnavailableError
from gateway.settings import RedisSettings
from gateway.shared.fallback import SharedWithFallback

if TYPE_CHECKING:
    from gateway.observe.metrics import GatewayMetrics
    from gateway.shared.keyfiles import ApiKey, Quota
    from gateway.shared.store import SharedState


def period_of(quota: Quota, now: datetime) -> tuple[str, datetime]:
    """The period ``now`` falls in (its name in counters) and when it ends."""
    if quota.period == "day":
        start = datetime(now.year, now.month, now.day, tzinfo=UTC)
        return start.strftime("%Y-%m-%d"), start + timedelta(days=1)
    days = calendar.monthrange(now.year, now.month)[1]
    start = datetime(now.year, now.month, 1, tzinfo=UTC)
    return start.strftime("%Y-%m"), start + timedelta(days=days)


@dataclass(frozen=True)
class Usage:
    """One quota's standing after a request: what was used of it, and when it resets."""

    quota: Quota
    used: int
    reset_seconds: int

    @property
    def remaining(self) -> int:
        return max(0, self.quota.limit - self.used)

    def header(self) -> tuple[str, str]:
        """The policy and the standing, as RateLimit-Policy and RateLimit items."""
        name = f'"{self.quota.unit}-{self.quota.period}"'
        window = 86_400 if self.quota.period == "day" else 31 * 86_400
        return f"{name};q={self.quota.limit};w={window}", f"{name};r={self.remaining};t={self.reset_seconds}"


class QuotaKeeper(SharedWithFallback):
    """Counts keys' use against their quotas; built by the app factory, attached to the
    shared store in the lifespan."""

    def __init__(
        self, store: SharedState | None, settings: RedisSettings, metrics: GatewayMetrics | None = None
    ) -> None:
        super().__init__(store, settings, metrics)
        self._local: dict[str, int] = {}

    @staticmethod
    def _counter(key: ApiKey, quota: Quota, period: str) -> str:
        return f"quota:{key.id}:{quota.unit}:{period}"

    def _add_local(self, counter: str, amount: int, period: str) -> int:
        if counter not in self._local:
            # a new period: the same key's and unit's counter of the last one goes
            prefix = counter[: -len(period)]
            for name in [n for n in self._local if n.startswith(prefix) and len(n) == len(counter)]:
                del self._local[name]
        self._local[counter] = self._local.get(counter, 0) + amount
        return self._local[counter]

    async def _add(self, counter: str, amount: int, ttl: int, period: str) -> tuple[int, float]:
        """The counter's new value, and the share of the quota this count stands for (1:
        shared by every replica; 1/replicas: counted here while Redis is down)."""
        if self._store is None:
            return self._add_local(counter, amount, period), 1.0
        from gateway.shared.store import SharedStateDownError

        try:
            return await self._store.add_usage(counter, amount, ttl), 1.0
        except SharedStateDownError:
            if self._fallback("quotas") == "allow":
                return 0, 1.0
            return self._add_local(counter, amount, period), 1.0 / self._settings.replicas

    async def charge(self, key: ApiKey, unit: str, amount: int, now: datetime | None = None) -> list[Usage]:
        """Count ``amount`` of ``unit`` against ``key``'s quotas of that unit; the standing
        of each. QuotaExceededError (nothing counted) when one would be passed."""
        quotas = [q for q in key.quotas if q.unit == unit]
        if not quotas or amount <= 0:
            return []
        now = now or datetime.now(UTC)
        taken: list[tuple[str, int, str]] = []
        standing: list[Usage] = []
        for quota in quotas:
            period, ends = period_of(quota, now)
            counter = self._counter(key, quota, period)
            reset = max(1, math.ceil((ends - now).total_seconds()))
            used, share = await self._add(counter, amount, reset + 3600, period)
            taken.append((counter, reset + 3600, period))
            limit = max(1, int(quota.limit * share))
            if used > limit:
                for name, ttl, counted in taken:
                    await self._give_back(name, amount, ttl, counted)
                usage = Usage(quota, quota.limit, reset)
                policy, standing_header = usage.header()
                raise QuotaExceededError(
                    f"this key's quota of {quota.limit} {quota.unit} a {quota.period} is spent",
                    retry_after=reset,
                    headers={"RateLimit-Policy": policy, "RateLimit": standing_header},
                )
            standing.append(Usage(quota, int(used / share) if share < 1 else used, reset))
        return standing

    async def _give_back(self, counter: str, amount: int, ttl: int, period: str) -> None:
        # a refusal that could not be given back counts against the key: never for it
        with contextlib.suppress(SharedStateUnavailableError):
            await self._add(counter, -amount, ttl, period)

    async def usage(self, key: ApiKey, now: datetime | None = None) -> list[Usage]:
        """Each of ``key``'s quotas as used so far this period (GET /admin/keys/{id})."""
        now = now or datetime.now(UTC)
        periods = [period_of(q, now) for q in key.quotas]
        counters = [self._counter(key, q, p) for q, (p, _) in zip(key.quotas, periods, strict=True)]
        values = await self._read(counters)
        return [
            Usage(q, used, max(1, math.ceil((ends - now).total_seconds())))
            for q, (_, ends), used in zip(key.quotas, periods, values, strict=True)
        ]

    async def _read(self, counters: Sequence[str]) -> list[int]:
        if self._store is not None:
            from gateway.shared.store import SharedStateDownError

            try:
                return await self._store.read_usage(counters)
            except SharedStateDownError:
                pass
        return [self._local.get(name, 0) for name in counters]


def quota_headers(standing: Sequence[Usage]) -> dict[str, str]:
    """RateLimit-Policy and RateLimit items of every quota a request was counted against."""
    if not standing:
        return {}
    items = [usage.header() for usage in standing]
    return {"RateLimit-Policy": ", ".join(p for p, _ in items), "RateLimit": ", ".join(r for _, r in items)}
