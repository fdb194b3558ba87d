"""A load generator that costs little CPU: keep-alive HTTP/1.1 connections on asyncio
streams, each sending one prepared request after another (or at a pace) and reading only
the status line, two headers and the body. Tens of microseconds a request, so a hundred
clients do not take the CPU the gateway and Triton are measured on (httpx costs about a
millisecond a request, and the test machine has two cores)."""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from gateway.bench.quantiles import percentile


@dataclass(frozen=True)
class Sent:
    """One answer: when it was sent (seconds from the start), its latency, status and
    Retry-After."""

    at: float
    seconds: float
    status: int
    retry_after: str | None
    problem: str = ""  # the problem type's slug of a 4xx/5xx


@dataclass
class Flow:
    """What one group of connections saw."""

    name: str
    answers: list[Sent] = field(default_factory=list)

    def problems(self) -> dict[str, int]:
        found: dict[str, int] = {}
        for answer in self.answers:
            if answer.problem:
                found[answer.problem] = found.get(answer.problem, 0) + 1
        return found

    def statuses(self) -> dict[int, int]:
        found: dict[int, int] = {}
        for answer in self.answers:
            found[answer.status] = found.get(answer.status, 0) + 1
        return dict(sorted(found.items()))

    def latencies(self, status: int = 200, after: float = 0.0, before: float = float("inf")) -> list[float]:
        return [a.seconds for a in self.answers if a.status == status and after <= a.at < before]

    def p(self, q: float, status: int = 200, after: float = 0.0, before: float = float("inf")) -> float:
        found = self.latencies(status, after, before)
        return percentile(found, q) if found else float("nan")

    def rate(self, status: int, after: float, before: float) -> float:
        return len(self.latencies(status, after, before)) / (before - after)


def request_bytes(url: str, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    host = urlsplit(url).netloc
    lines = [f"POST {path} HTTP/1.1", f"host: {host}", f"content-length: {len(body)}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


async def _connection(
    url: str, request: bytes, flow: Flow, started: float, until: float, pace: float
) -> None:
    parts = urlsplit(url)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    try:
        while time.monotonic() < until:
            sent = time.monotonic()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            status = int(lines[0].split(" ", 2)[1])
            length, retry_after, close = 0, None, False
            for line in lines[1:]:
                name, _, value = line.partition(":")
                name = name.strip().lower()
                if name == "content-length":
                    length = int(value)
                elif name == "retry-after":
                    retry_after = value.strip()
                elif name == "connection" and value.strip().lower() == "close":
                    close = True
            body = await reader.readexactly(length)
            done = time.monotonic()
            problem = ""
            if status >= 400:
                found = re.search(rb'"type":\s*"[^"]*?([a-z-]+)"', body)
                problem = found.group(1).decode() if found else ""
            flow.answers.append(Sent(sent - started, done - sent, status, retry_after, problem))
            if close:
                writer.close()
                reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
            if pace:
                await asyncio.sleep(max(0.0, pace - (done - sent)))
    finally:
        writer.close()


async def run_flows(
    seconds: float, *groups: tuple[Flow, str, bytes, int, float], started: float | None = None
) -> None:
    """Each group ``(flow, url, request, connections, pace)``: that many connections for
    ``seconds``, each sending back to back (pace 0) or one request every ``pace`` seconds."""
    begin = time.monotonic() if started is None else started
    until = time.monotonic() + seconds
    await asyncio.gather(
        *(
            _connection(url, request, flow, begin, until, pace)
            for flow, url, request, connections, pace in groups
            for _ in range(connections)
        )
    )


def load(seconds: float, *groups: tuple[Flow, str, bytes, int, float]) -> None:
    """:func:`run_flows` on a fresh event loop."""
    asyncio.run(run_flows(seconds, *groups))
