"""A clock the test moves by hand (``clock.now += seconds``): what a controller under test
reads instead of ``time.monotonic``."""

from __future__ import annotations


class Clock:
    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
