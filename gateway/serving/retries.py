"""Clients that retry at once: a refusal to a connection refused moments ago waits.

A refusal decided from a request's headers costs the gateway about a tenth of a
millisecond, once the connection stays open (no new TCP connection per retry). A client
that ignores ``Retry-After`` and sends again the moment its 503 arrives would then be
refused thousands of times a second, each taking CPU from the Triton it shares a host
with, and learning nothing. So the first refusal on a connection is answered at once (a
well-behaved client hears it within milliseconds), and each next one on the same
connection, while it comes within ``forget_seconds`` of the previous (the Retry-After
the gateway gives), waits twice as long as the last, from ``first_seconds`` up to
``longest_seconds`` (the Retry-After too: a client told to wait that long and coming back
at once waits no longer than it was told). Waiting costs a timer, not CPU: 100
connections retrying at once are refused about ``100 / longest_seconds`` times a second,
not 10,000. A client that waits as told is never held (its streak is forgotten).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass, field

# connections remembered at most (the oldest forgotten first)
REMEMBERED = 10_000


@dataclass
class RetryDamper:
    """How long to hold the refusal about to go to a connection."""

    first_seconds: float = 0.01
    longest_seconds: float = 0.1
    forget_seconds: float = 1.0
    _seen: OrderedDict[Hashable, tuple[int, float]] = field(default_factory=OrderedDict)

    def hold(self, connection: Hashable | None, now: float) -> float:
        """Seconds to wait before refusing a request of ``connection`` (None: unknown,
        not held) refused at ``now``. The streak is judged from when the last refusal was
        sent (its hold included), so a client held the longest that retries at once is held
        as long again, not forgotten."""
        if connection is None:
            return 0.0
        streak, last = self._seen.pop(connection, (0, float("-inf")))
        if now - last > self.forget_seconds:
            streak = 0
        held = 0.0 if streak == 0 else min(self.longest_seconds, self.first_seconds * 2.0 ** (streak - 1))
        # the streak stops counting once it holds the longest (2.0 ** 1024 overflows: a
        # connection refused a thousand times in a row was answered 500)
        self._seen[connection] = (streak + 1 if held < self.longest_seconds else streak, now + held)
        if len(self._seen) > REMEMBERED:
            self._seen.popitem(last=False)
        return held
