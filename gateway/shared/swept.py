"""A map of per-caller state that forgets what is the same as absent.

Callers come from places the gateway does not bound (an OpenID provider mints tenants,
a mesh certificates), so per-caller state in memory must not grow with every caller ever
seen. What is kept here is only what still differs from a fresh entry (a rate bucket not
yet refilled, a key pressed less than a while ago): each time the map has doubled since
it was last swept, the entries ``stale`` calls the same as absent go. Amortised O(1)
per insertion, and it holds at most about twice the live entries (or ``floor``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

K = TypeVar("K")
V = TypeVar("V")


class Swept(Generic[K, V]):
    """``dict``-like: ``get``, ``put``, ``len``; ``stale(value, now)`` says a value is as
    good as absent at ``now``."""

    def __init__(self, stale: Callable[[V, float], bool], floor: int = 1024) -> None:
        self._stale = stale
        self._floor = floor
        self._sweep_at = floor
        self._items: dict[K, V] = {}

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: K) -> V | None:
        return self._items.get(key)

    def put(self, key: K, value: V, now: float) -> None:
        items = self._items
        if key not in items and len(items) >= self._sweep_at:
            for name in [name for name, held in items.items() if self._stale(held, now)]:
                del items[name]
            self._sweep_at = max(self._floor, 2 * len(items))
        items[key] = value
