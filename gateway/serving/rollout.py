"""Rollouts: a canary share of a model's requests answered by another model (or version),
and a shadow share also sent to one, whose answers are compared with the served ones.

A rollout is run-time routing (gateway.shared.routing): set through /admin on any replica, the
same on every replica (shared through Redis when there is a store), and it survives
restarts. Statistics are this replica's (Prometheus adds up the replicas).

- Canary: sticky per client. The client is the API key's id, else the ``X-Rollout-Key``
  header; a hash of (model, client) below the weight picks the target, so one client
  sees one arm on every replica. A request with neither is assigned at random.
- Shadow: after the primary has answered (so the client is never later for it), that
  share of requests is sent to the target too, outside admission and rate limits, at
  most ``rollout_shadow_in_flight`` at once; when that is full, or the gateway sheds
  load, the shadow is dropped and counted, never queued.
- Comparison, per input: top-1 labels agree or not, overlap of the top-k labels, and the
  difference of the top-1 scores.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from time import perf_counter
from typing import TYPE_CHECKING, Any

from gateway.shared.routing import Rollout, Routing, Target
from gateway.triton.backend import Classification

if TYPE_CHECKING:
    from gateway.observe.metrics import GatewayMetrics
    from gateway.serving.admission import Admission

ARMS = ("primary", "canary", "shadow")
logger = logging.getLogger("gateway.rollout")


@dataclass
class ArmStats:
    requests: int = 0
    errors: int = 0
    seconds: float = 0.0

    def as_json(self) -> dict[str, Any]:
        mean = self.seconds / self.requests if self.requests else None
        return {"requests": self.requests, "errors": self.errors, "mean_seconds": mean}


@dataclass
class RolloutStats:
    """This replica's statistics of one model's rollout, since it was set here."""

    arms: dict[str, ArmStats] = field(default_factory=lambda: {arm: ArmStats() for arm in ARMS})
    outcomes: dict[str, int] = field(
        default_factory=lambda: {"agree": 0, "disagree": 0, "error": 0, "dropped": 0}
    )
    overlap_sum: float = 0.0
    score_difference_sum: float = 0.0
    compared: int = 0

    def as_json(self) -> dict[str, Any]:
        decided = self.outcomes["agree"] + self.outcomes["disagree"]
        return {
            "arms": {arm: stats.as_json() for arm, stats in self.arms.items()},
            "shadow": {
                **self.outcomes,
                "agreement": self.outcomes["agree"] / decided if decided else None,
                "mean_top_k_overlap": self.overlap_sum / self.compared if self.compared else None,
                "mean_top1_score_difference": self.score_difference_sum / self.compared
                if self.compared
                else None,
            },
        }


@dataclass(frozen=True)
class Comparison:
    agree: bool
    overlap: float  # |top-k of one ∩ top-k of the other| / k
    score_difference: float  # |top-1 score of the target - top-1 score of the primary|


def compare(primary: Classification, shadow: Classification) -> Comparison:
    mine = [p.label for p in primary.predictions]
    theirs = [p.label for p in shadow.predictions]
    k = max(1, min(len(mine), len(theirs)))
    overlap = len(set(mine[:k]) & set(theirs[:k])) / k
    first, second = primary.predictions[0], shadow.predictions[0]
    return Comparison(first.label == second.label, overlap, abs(second.score - first.score))


class RolloutRunner:
    """Routes a request's arm, records each arm, and runs the shadows (bounded)."""

    def __init__(
        self, routing: Routing, metrics: GatewayMetrics, admission: Admission, shadow_cap: int
    ) -> None:
        self.routing = routing
        self.metrics = metrics
        self.admission = admission
        self.shadow_cap = shadow_cap
        self._shadows: set[asyncio.Task[None]] = set()
        self._stats: dict[str, tuple[Rollout, RolloutStats]] = {}

    def stats(self, model: str) -> RolloutStats:
        """This replica's statistics of ``model``'s rollout (fresh when the rollout changed)."""
        rollout = self.routing.rollout(model) or Rollout()
        current = self._stats.get(model)
        if current is None or current[0] != rollout:
            current = self._stats[model] = (rollout, RolloutStats())
        return current[1]

    def record(self, model: str, arm: str, seconds: float, failed: bool) -> None:
        stats = self.stats(model).arms[arm]
        stats.requests += 1
        stats.errors += failed
        stats.seconds += seconds
        self.metrics.rollout_requests.labels(model=model, arm=arm).inc()
        self.metrics.rollout_duration.labels(model=model, arm=arm).observe(seconds)

    def _outcome(self, model: str, target: str, outcome: str, count: int = 1) -> None:
        self.stats(model).outcomes[outcome] += count
        self.metrics.shadow_comparisons.labels(model=model, target=target, outcome=outcome).inc(count)

    def shadow(self, model: str, inputs: int, run: Callable[[], Awaitable[list[Classification]]],
               primary: list[Classification], target: Target) -> None:  # fmt: skip
        """Start ``run`` (the target's answers to the same inputs) in the background, unless
        the shadow cap is full or the gateway sheds load: then it is dropped and counted."""
        admission = self.admission
        if (
            len(self._shadows) >= self.shadow_cap
            or admission.in_flight >= admission.limit
            or admission.leaving
        ):
            self._outcome(model, target.model, "dropped", inputs)
            return
        task = asyncio.create_task(self._shadow(model, run, primary, target))
        self._shadows.add(task)
        task.add_done_callback(self._shadows.discard)

    async def _shadow(
        self,
        model: str,
        run: Callable[[], Awaitable[list[Classification]]],
        primary: list[Classification],
        target: Target,
    ) -> None:
        started = perf_counter()
        try:
            answers = await run()
        except Exception as exc:  # a shadow's failure is counted, never anybody's error
            logger.warning("shadow of %s to %s failed: %s", model, target, type(exc).__name__)
            self.record(model, "shadow", perf_counter() - started, failed=True)
            self._outcome(model, target.model, "error", len(primary))
            return
        self.record(model, "shadow", perf_counter() - started, failed=False)
        stats = self.stats(model)
        for mine, theirs in zip(primary, answers, strict=True):
            comparison = compare(mine, theirs)
            self._outcome(model, target.model, "agree" if comparison.agree else "disagree")
            stats.compared += 1
            stats.overlap_sum += comparison.overlap
            stats.score_difference_sum += comparison.score_difference
            self.metrics.shadow_score_difference.labels(model=model, target=target.model).observe(
                comparison.score_difference
            )

    async def stop(self) -> None:
        """Let the shadows in flight end (bounded by Triton's deadline), at shutdown."""
        if self._shadows:
            await asyncio.wait(set(self._shadows), timeout=30)
