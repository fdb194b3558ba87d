"""A small asyncio load generator for the reliability tests: N concurrent clients, each
sending requests back to back for a while; every answer's status, latency and headers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx


@dataclass
class Answer:
    status: int  # 0: connection refused (never accepted); -1: cut off mid-request
    seconds: float
    content_type: str = ""
    retry_after: str | None = None
    slug: str = ""


@dataclass
class LoadResult:
    answers: list[Answer] = field(default_factory=list)
    seconds: float = 0.0

    def count(self, status: int) -> int:
        return sum(1 for a in self.answers if a.status == status)

    def rate(self, status: int) -> float:
        return self.count(status) / self.seconds if self.seconds else 0.0

    def p99(self, status: int) -> float:
        times = sorted(a.seconds for a in self.answers if a.status == status)
        return times[min(len(times) - 1, int(len(times) * 0.99))] if times else float("nan")

    def statuses(self) -> dict[int, int]:
        found: dict[int, int] = {}
        for answer in self.answers:
            found[answer.status] = found.get(answer.status, 0) + 1
        return dict(sorted(found.items()))


Request = Callable[[httpx.AsyncClient], "asyncio.Future[httpx.Response] | object"]


async def _client(
    url: str,
    send: Callable[[httpx.AsyncClient], object],
    until: float,
    result: LoadResult,
    honor_retry_after: bool,
) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        while time.monotonic() < until:
            started = time.monotonic()
            try:
                response: httpx.Response = await send(client)  # type: ignore[misc]
            except httpx.ConnectError:
                result.answers.append(Answer(0, time.monotonic() - started))
                await asyncio.sleep(0.05)
                continue
            except httpx.TransportError:
                result.answers.append(Answer(-1, time.monotonic() - started))
                await asyncio.sleep(0.05)
                continue
            slug = ""
            kind = response.headers.get("content-type", "")
            if kind == "application/problem+json":
                slug = response.json().get("type", "").rsplit(":", 1)[-1]
            answer = Answer(
                response.status_code,
                time.monotonic() - started,
                kind,
                response.headers.get("retry-after"),
                slug,
            )
            result.answers.append(answer)
            if honor_retry_after and answer.status == 503 and answer.retry_after:
                # A well-behaved client (or a load balancer) stays away as long as it is told.
                await asyncio.sleep(float(answer.retry_after))


def run_load(
    url: str,
    send: Callable[[httpx.AsyncClient], object],
    clients: int,
    seconds: float,
    honor_retry_after: bool = False,
) -> LoadResult:
    """``clients`` concurrent loops of ``send`` for ``seconds`` (optionally pausing after a
    503 for its Retry-After, as a well-behaved client does)."""

    async def main() -> LoadResult:
        result = LoadResult()
        started = time.monotonic()
        until = started + seconds
        await asyncio.gather(*(_client(url, send, until, result, honor_retry_after) for _ in range(clients)))
        result.seconds = time.monotonic() - started
        return result

    return asyncio.run(main())
