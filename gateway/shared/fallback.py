"""What a user of the shared store does while Redis does not answer (``redis.on_failure``):
one rule for rate limits and quotas alike."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from gateway.errors import SharedStateUnavailableError
from gateway.settings import RedisSettings

if TYPE_CHECKING:
    from gateway.observe.metrics import GatewayMetrics
    from gateway.shared.store import SharedState


class SharedWithFallback:
    """Holds the shared store (attached by the lifespan) and applies the failure policy."""

    def __init__(
        self, store: SharedState | None, settings: RedisSettings, metrics: GatewayMetrics | None = None
    ) -> None:
        self._store = store
        self._settings = settings
        self._metrics = metrics

    def attach(self, store: SharedState | None) -> None:
        """Share through ``store`` (the lifespan builds it, on the server's loop)."""
        self._store = store

    def _fallback(self, what: str) -> Literal["local", "allow"]:
        """Redis did not answer: counted; under ``refuse``, SharedStateUnavailableError (503);
        else the policy to apply here (``local``: this replica's share; ``allow``: none)."""
        policy = self._settings.on_failure
        if self._metrics is not None:
            self._metrics.shared_state_fallbacks.labels(policy=policy).inc()
        if policy == "refuse":
            raise SharedStateUnavailableError(
                f"{what} cannot be checked now", retry_after=self._settings.retry_seconds
            )
        return policy
