"""Run-time routing decisions (version pins), the same on every replica.

Without a shared store they live in this process (set through its /admin). With one,
a change is written to Redis first (a failure to share it is a 503 to the operator, and
nothing changes here), applied here at once, and every replica reads the whole routing
hash back every ``redis.routing_poll_seconds`` and at start, so a pin set on one replica
applies on all within that period and survives their restarts. Later run-time decisions
(rollout weights) are fields of the same hash.
"""

from __future__ import annotations

import json
import logging
import random
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.errors import SharedStateUnavailableError
from gateway.periodic import Periodic

if TYPE_CHECKING:
    from gateway.shared.store import SharedState

logger = logging.getLogger("gateway.routing")
PIN = "pin:"
ROLLOUT = "rollout:"
DEFAULT = "default:"


@dataclass(frozen=True)
class Target:
    """A catalogued model, and a version of it ("" for the served one)."""

    model: str
    version: str = ""

    @classmethod
    def parse(cls, text: str) -> Target:
        model, _, version = text.partition(":")
        return cls(model, version)

    def __str__(self) -> str:
        return f"{self.model}:{self.version}" if self.version else self.model


@dataclass(frozen=True)
class Rollout:
    canary: Target | None = None
    weight: float = 0.0
    shadow: Target | None = None
    sample: float = 0.0

    def to_json(self) -> str:
        return json.dumps(
            {
                "canary": {"target": str(self.canary), "weight": self.weight} if self.canary else None,
                "shadow": {"target": str(self.shadow), "sample": self.sample} if self.shadow else None,
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> Rollout:
        data = json.loads(text)
        canary, shadow = data.get("canary"), data.get("shadow")
        return cls(
            canary=Target.parse(canary["target"]) if canary else None,
            weight=float(canary["weight"]) if canary else 0.0,
            shadow=Target.parse(shadow["target"]) if shadow else None,
            sample=float(shadow["sample"]) if shadow else 0.0,
        )

    def canary_for(self, model: str, client: str | None) -> bool:
        """Whether this client's request goes to the canary: sticky when the client is known."""
        if self.canary is None or self.weight <= 0:
            return False
        if client is None:
            return random.random() < self.weight
        share = zlib.crc32(f"{model}\0{client}".encode()) / 2**32
        return share < self.weight

    def shadowed(self) -> bool:
        return self.shadow is not None and self.sample > 0 and random.random() < self.sample


class Routing:
    def __init__(self, default_pins: dict[str, str]) -> None:
        self._defaults = dict(default_pins)
        self._pins = dict(default_pins)
        self._rollouts: dict[str, Rollout] = {}
        self._default_models: dict[str, str] = {}  # task -> model, set by a promotion
        self._store: SharedState | None = None
        self._following: Periodic | None = None

    def attach(self, store: SharedState | None) -> None:
        self._store = store

    def version(self, name: str) -> str:
        """The version requests to ``name`` go to ("" for Triton's latest)."""
        return self._pins.get(name, "")

    def rollout(self, name: str) -> Rollout | None:
        return self._rollouts.get(name)

    def rollouts(self) -> dict[str, Rollout]:
        return dict(self._rollouts)

    def default_model(self, task: str) -> str | None:
        """The default model of a task set by a promotion (None: the settings' one)."""
        return self._default_models.get(task)

    async def _share(self, field: str, value: str | None) -> None:
        if self._store is None:
            return
        from gateway.shared.store import SharedStateDownError

        try:
            if value is None:
                await self._store.delete_routing(field)
            else:
                await self._store.set_routing(field, value)
        except SharedStateDownError:
            raise SharedStateUnavailableError(
                "the change could not be shared with the other replicas (Redis does not answer); "
                "nothing changed",
                retry_after=1,
            ) from None

    async def pin(self, name: str, version: str) -> None:
        """Move a model's pin, on every replica when the state is shared."""
        await self._share(f"{PIN}{name}", version)
        self._pins[name] = version

    async def set_rollout(self, name: str, rollout: Rollout | None) -> None:
        """Start, change (``rollout``) or end (None) a model's rollout, on every replica."""
        await self._share(f"{ROLLOUT}{name}", None if rollout is None else rollout.to_json())
        if rollout is None:
            self._rollouts.pop(name, None)
        else:
            self._rollouts[name] = rollout

    async def set_default_model(self, task: str, name: str) -> None:
        await self._share(f"{DEFAULT}{task}", name)
        self._default_models[task] = name

    async def sync(self) -> bool:
        """Read the shared routing back (True when it was read); the settings' pins are
        the base, the shared ones override them."""
        if self._store is None:
            return False
        from gateway.shared.store import SharedStateDownError

        try:
            fields = await self._store.routing()
        except SharedStateDownError:
            return False  # the routing in force stays
        pins = dict(self._defaults)
        pins.update(
            {field.removeprefix(PIN): value for field, value in fields.items() if field.startswith(PIN)}
        )
        if pins != self._pins:
            logger.info("routing from the shared state: pins %s", pins)
        self._pins = pins
        rollouts = {}
        for field, value in fields.items():
            if field.startswith(ROLLOUT):
                try:
                    rollouts[field.removeprefix(ROLLOUT)] = Rollout.from_json(value)
                except (ValueError, KeyError, TypeError):
                    logger.error("shared rollout %s is not readable: ignored", field)
        self._rollouts = rollouts
        self._default_models = {
            field.removeprefix(DEFAULT): value for field, value in fields.items() if field.startswith(DEFAULT)
        }
        return True

    def start(self, interval: float) -> None:
        if self._store is not None:
            self._following = Periodic("reading the shared routing", interval, self.sync, logger)
            self._following.start()

    async def stop(self) -> None:
        if self._following is not None:
            await self._following.stop()
            self._following = None
