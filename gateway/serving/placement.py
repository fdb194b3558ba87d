"""Each call placed on the Triton replica with the shortest queue.

With several Triton endpoints (``triton.url`` a list, or a ``dns:///`` name that resolves
to several addresses, as a headless Service gives), :class:`Placement` is the transport
the serving side sees: one :class:`~gateway.triton.backend.InferenceBackend` over one
transport per replica.

- **Inference** goes to the replica whose queue is expected to drain first: the time its
  calls take (a decaying average), scaled by the calls it has now against the calls
  those found there (Little's law: Triton queues and batches what it is sent, so a call's
  time is mostly the queue ahead of it). A replica 5x slower answers as late with a
  fifth of the calls in it, and so gets its share of them, not half as round-robin gives
  it. The wait is never taken as less than the age of the replica's oldest call, so one
  that stalls is passed over within a call's time, before any probe says so; one left
  without calls for ``RETRY_SECONDS`` (it looked slow) is sent one, to see.
- **Health**: every replica's liveness is asked every ``probe_interval_seconds`` (under
  ``probe_timeout_seconds``) and at once when a call to it fails as unavailable or late;
  a replica that does not answer (or answers a call UNAVAILABLE: down, or its queue
  full) is taken out until its probe answers. The calls waiting on a replica taken out
  are moved to another one that is up (inference is idempotent), as is a call it
  refused as unavailable: a replica that hangs holds no call longer than it takes to
  find out. A ``dns:///`` name is resolved again every few seconds: new addresses join,
  gone ones leave once their calls are done.
- **Everything else** (metadata, configuration, status, statistics, the repository
  index) is asked of the first replica that is up: the replicas serve one repository.
  Loading and unloading a model is done on every replica.

The circuit breaker (gateway.serving.guard) sits above this: it opens only when no
replica is live.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import socket
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import count
from time import monotonic
from typing import TYPE_CHECKING, Any, TypeVar

from gateway.errors import TritonTimeoutError, TritonUnavailableError
from gateway.observe.metrics import ReplicaReading
from gateway.periodic import Periodic
from gateway.triton.backend import (
    InferenceBackend,
    InferResult,
    ModelConfig,
    ModelSignature,
    ModelStatus,
    RepositoryModel,
    ServerStatus,
)
from gateway.triton.tensors import Tensor

if TYPE_CHECKING:
    from gateway.errors import InvalidInputError

logger = logging.getLogger(__name__)

T = TypeVar("T")

# How fast the per-replica call time forgets (seconds): a replica that recovers is
# trusted again within a few seconds.
DECAY_SECONDS = 2.0
# A replica sent nothing for this long (it looked slow) is sent one call, to find out
# whether it still is.
RETRY_SECONDS = 5.0
# A dns:/// name is resolved again at most this often (gRPC's own resolver: 5 s too).
RESOLVE_SECONDS = 5.0


@dataclass
class QueueFit:
    """A call's time against the calls it found on its replica (itself included), fitted
    as ``a + c * calls`` by least squares over decaying samples: Triton batches what
    queues, so the time grows by less than a call's own for each call ahead (the fixed
    part ``a`` is a batch's; ``c`` what each call adds). Until the samples spread over
    several depths, the time is taken as proportional to the calls (Little's law)."""

    weight: float = 0.0
    x: float = 0.0
    y: float = 0.0
    xx: float = 0.0
    xy: float = 0.0

    def add(self, calls: int, took: float, kept: float) -> None:
        self.weight = kept * self.weight + 1
        self.x = kept * self.x + calls
        self.y = kept * self.y + took
        self.xx = kept * self.xx + calls * calls
        self.xy = kept * self.xy + calls * took

    @property
    def mean_latency(self) -> float | None:
        return self.y / self.weight if self.weight else None

    def wait(self, calls: int, fallback: float) -> float:
        """The time a call finding ``calls`` (itself included) should take."""
        if not self.weight:
            return fallback * calls
        mean_x, mean_y = self.x / self.weight, self.y / self.weight
        spread = self.xx / self.weight - mean_x * mean_x
        if spread >= 1.0:  # depths apart enough to tell a batch's part from a call's
            slope = (self.xy / self.weight - mean_x * mean_y) / spread
            fixed = mean_y - slope * mean_x
            if slope > 0 and fixed >= 0:
                return fixed + slope * calls
        return mean_y * calls / mean_x


@dataclass
class Call:
    """One call under way on a replica."""

    started: float
    ahead: int  # the replica's calls when it was placed, itself included
    task: asyncio.Task[Any] | None
    moved: bool = False  # cancelled by the placement to go elsewhere, not by its caller


@dataclass
class Replica:
    """One Triton endpoint and what the placement knows of it."""

    address: str
    transport: InferenceBackend
    up: bool = True
    leaving: bool = False  # its address no longer resolves: no new calls
    fit: QueueFit = field(default_factory=lambda: QueueFit())
    sampled_at: float = 0.0
    calls: dict[int, Call] = field(default_factory=dict)  # by call number, oldest first
    placed: int = 0

    @property
    def latency(self) -> float | None:
        """What its calls took lately, on average (None until one returned)."""
        return self.fit.mean_latency

    def expected_wait(self, now: float, fallback: float) -> float:
        """How long a call placed here now should take: the time its calls take against
        the calls they found there, at the calls it would find now; never less than its
        oldest call's age (a replica that stalls gets dearer as it stalls)."""
        wait = self.fit.wait(len(self.calls) + 1, fallback)
        if self.calls:
            wait = max(wait, now - next(iter(self.calls.values())).started)
        return wait

    def returned(self, call: Call, now: float) -> None:
        self.fit.add(call.ahead, now - call.started, math.exp(-(now - self.sampled_at) / DECAY_SECONDS))
        self.sampled_at = now

    def unheard(self, now: float) -> bool:
        """Nothing under way and nothing heard for a while: what it costs may have changed."""
        return not self.calls and self.latency is not None and now - self.sampled_at > RETRY_SECONDS

    def take_out(self) -> None:
        """Down: its calls under way are moved to another replica."""
        self.up = False
        for call in self.calls.values():
            if call.task is not None and not call.moved:
                call.moved = True
                call.task.cancel("moved: its Triton replica was taken out")


class Placement:
    """Implements :class:`~gateway.triton.backend.InferenceBackend` over several replicas;
    built in the running loop (its probe is a task), closed there."""

    def __init__(
        self,
        addresses: Sequence[str],
        connect: Callable[[str], InferenceBackend],
        *,
        probe_interval: float,
        probe_timeout: float,
        resolve: Callable[[], Awaitable[list[str]]] | None = None,
        round_robin: bool = False,
    ) -> None:
        """``addresses`` the endpoints known now (``host:port``); ``connect`` builds the
        transport of one; ``resolve``, for a name, the addresses it resolves to now;
        ``round_robin`` places each call on the next replica up instead (to compare)."""
        self._round_robin = round_robin
        self._turns = count()
        self._connect = connect
        self._probe_timeout = probe_timeout
        self._resolve = resolve
        self._resolved_at = monotonic()
        self._numbers = count()
        self.replicas: dict[str, Replica] = {a: Replica(a, connect(a)) for a in dict.fromkeys(addresses)}
        self._probing = Periodic("probing Triton replicas", probe_interval, self._probe, logger)
        self._probing.start()

    # -- reading ---------------------------------------------------------------------------
    def readings(self) -> list[ReplicaReading]:
        return [
            ReplicaReading(r.address, r.up, len(r.calls), r.latency or 0.0, r.placed)
            for r in self.replicas.values()
        ]

    # -- placing ---------------------------------------------------------------------------
    def choose(self) -> Replica:
        """The replica a call goes to now: the shortest expected wait among those up (all
        of them when none is, so the call fails as Triton's own failure would say)."""
        candidates = [r for r in self.replicas.values() if r.up and not r.leaving]
        if not candidates:
            candidates = [r for r in self.replicas.values() if not r.leaving] or list(self.replicas.values())
        if not candidates:
            raise TritonUnavailableError("no Triton replica is known yet", retry_after=1)
        if self._round_robin:
            return candidates[next(self._turns) % len(candidates)]
        now = monotonic()
        for replica in candidates:
            if replica.unheard(now):
                return replica
        known = [r.latency for r in candidates if r.latency is not None]
        fallback = min(known) if known else 0.0  # a new replica is tried as if the fastest
        best = min(r.expected_wait(now, fallback) for r in candidates)
        tied = [r for r in candidates if r.expected_wait(now, fallback) <= best]
        return tied[0] if len(tied) == 1 else random.choice(tied)

    async def infer(
        self,
        model: str,
        version: str,
        inputs: Sequence[Tensor],
        request_id: str,
        outputs: Sequence[str] = (),
        invalid: InvalidInputError | None = None,
        priority: int = 0,
        classes: Mapping[str, int] | None = None,
    ) -> InferResult:
        """The call on the replica chosen; moved once to another that is up when its
        replica is taken out while it waits, or refuses it as unavailable."""
        tried: Replica | None = None
        while True:
            replica = self.choose()
            moving = tried is None and self._another_up(replica)
            call = Call(monotonic(), len(replica.calls) + 1, asyncio.current_task() if moving else None)
            number = next(self._numbers)
            replica.calls[number] = call
            replica.placed += 1
            try:
                result = await replica.transport.infer(
                    model, version, inputs, request_id, outputs, invalid, priority, classes
                )
            except asyncio.CancelledError:
                if not call.moved or call.task is None:
                    raise
                call.task.uncancel()  # ours, not the caller's: the call goes elsewhere
                tried = replica
                continue
            except TritonTimeoutError:
                self._probing.wake()  # is it still there? (the deadline is spent: not moved)
                raise
            except TritonUnavailableError:
                replica.calls.pop(number, None)
                if replica.up:
                    replica.take_out()  # down, or its queue full: its probe puts it back
                self._probing.wake()
                if not moving:
                    raise
                tried = replica
                continue
            else:
                replica.returned(call, monotonic())
                return result
            finally:
                replica.calls.pop(number, None)

    def _another_up(self, replica: Replica) -> bool:
        return any(r is not replica and r.up and not r.leaving for r in self.replicas.values())

    # -- health ----------------------------------------------------------------------------
    async def _probe(self) -> None:
        if self._resolve is not None and (
            not self.replicas or monotonic() - self._resolved_at >= RESOLVE_SECONDS
        ):
            await self._follow_name()
        await self.is_live(self._probe_timeout)
        for replica in list(self.replicas.values()):
            if replica.leaving and not replica.calls:
                del self.replicas[replica.address]
                await replica.transport.close()

    async def _follow_name(self) -> None:
        assert self._resolve is not None
        self._resolved_at = monotonic()
        try:
            addresses = await self._resolve()
        except OSError as exc:  # keep what is known
            logger.warning("resolving the Triton name failed: %s", exc)
            return
        if not addresses:
            return
        for address in addresses:
            if address not in self.replicas:
                logger.info("Triton replica %s joins", address)
                self.replicas[address] = Replica(address, self._connect(address))
            self.replicas[address].leaving = False
        for replica in self.replicas.values():
            if replica.address not in addresses and not replica.leaving:
                logger.info("Triton replica %s leaves", replica.address)
                replica.leaving = True

    async def is_live(self, within: float) -> bool:
        """Live while any replica is (the breaker above opens only when none is)."""
        replicas = [r for r in self.replicas.values() if not r.leaving]
        answers = await asyncio.gather(*(r.transport.is_live(within) for r in replicas))
        for replica, live in zip(replicas, answers, strict=True):
            self._heard(replica, live)
        return any(answers)

    @staticmethod
    def _heard(replica: Replica, live: bool) -> None:
        if live == replica.up:
            return
        logger.warning("Triton replica %s is %s", replica.address, "back" if live else "out")
        if live:
            replica.up = True
        else:
            replica.take_out()

    # -- everything else: the first replica up ---------------------------------------------
    def _first_up(self) -> InferenceBackend:
        for replica in self.replicas.values():
            if replica.up and not replica.leaving:
                return replica.transport
        for replica in self.replicas.values():
            return replica.transport
        raise TritonUnavailableError("no Triton replica is known yet", retry_after=1)

    async def model_signature(self, model: str, version: str) -> ModelSignature:
        return await self._first_up().model_signature(model, version)

    async def model_config(self, model: str) -> ModelConfig:
        return await self._first_up().model_config(model)

    async def model_config_document(self, model: str, version: str) -> dict[str, Any]:
        return await self._first_up().model_config_document(model, version)

    async def statistics(self, model: str, version: str) -> dict[str, Any]:
        return await self._first_up().statistics(model, version)

    async def statistics_by_replica(self) -> dict[str, dict[str, Any]]:
        """Every model's statistics on each replica up, by address (the gate on Triton's
        queue reads them all: each replica's counters are its own); the first failure
        when none answered."""
        replicas = [r for r in self.replicas.values() if r.up and not r.leaving]
        if not replicas:
            raise TritonUnavailableError("no Triton replica is up", retry_after=1)
        answers = await asyncio.gather(
            *(r.transport.statistics("", "") for r in replicas), return_exceptions=True
        )
        found: dict[str, dict[str, Any]] = {}
        for replica, answer in zip(replicas, answers, strict=True):
            if isinstance(answer, BaseException):
                if not isinstance(answer, Exception):
                    raise answer
                continue
            found[replica.address] = answer
        if not found:
            failure = answers[0]
            assert isinstance(failure, BaseException)
            raise failure
        return found

    async def repository_index(self) -> list[RepositoryModel]:
        return await self._first_up().repository_index()

    async def server_status(self) -> ServerStatus:
        return await self._first_up().server_status()

    async def model_status(self, model: str, version: str) -> ModelStatus:
        return await self._first_up().model_status(model, version)

    # -- model control: every replica -----------------------------------------------------
    async def _on_every(self, call: Callable[[InferenceBackend], Awaitable[None]]) -> None:
        results = await asyncio.gather(
            *(call(r.transport) for r in self.replicas.values() if not r.leaving), return_exceptions=True
        )
        for result in results:  # the first failure, as one replica's call would raise it
            if isinstance(result, BaseException):
                raise result

    async def load_model(self, model: str) -> None:
        await self._on_every(lambda transport: transport.load_model(model))

    async def unload_model(self, model: str, *, dependents: bool) -> None:
        await self._on_every(lambda transport: transport.unload_model(model, dependents=dependents))

    async def close(self) -> None:
        await self._probing.stop()
        for replica in self.replicas.values():
            await replica.transport.close()


def endpoints(url: str) -> list[str]:
    """The endpoints ``url`` names: ``host:port`` items of a comma-separated list."""
    return [part.strip() for part in url.split(",") if part.strip()]


def resolve_now(url: str) -> list[str]:
    """The addresses a ``dns:///`` url resolves to at start (blocking, once, before
    serving; none when the name does not resolve yet: the probe tries again)."""
    host, _, port = url.removeprefix("dns:///").rpartition(":")
    try:
        found = socket.getaddrinfo(host.strip("[]"), int(port), type=socket.SOCK_STREAM)
    except OSError as exc:
        logger.warning("resolving %s failed: %s", host, exc)
        return []
    return _addresses(found, port)


def _addresses(found: Sequence[Any], port: str) -> list[str]:
    addresses = []
    for family, _, _, _, sockaddr in found:
        ip = str(sockaddr[0])
        addresses.append(f"[{ip}]:{port}" if family == socket.AF_INET6 else f"{ip}:{port}")
    return sorted(dict.fromkeys(addresses))


def resolver(url: str) -> Callable[[], Awaitable[list[str]]] | None:
    """For a ``dns:///host:port`` url, what resolves it to ``address:port`` items now."""
    if not url.startswith("dns:///"):
        return None
    host, _, port = url.removeprefix("dns:///").rpartition(":")

    async def resolve() -> list[str]:
        found = await asyncio.get_running_loop().getaddrinfo(
            host.strip("[]"), int(port), type=socket.SOCK_STREAM
        )
        return _addresses(found, port)

    return resolve
