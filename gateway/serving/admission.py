"""Admission control: a limit on inference requests in flight, shared fairly between keys,
and the drain at shutdown.

Each model's limit is its gate's (:mod:`gateway.serving.queuegate`: what Triton's own
statistics say its batches cost, ``max_in_flight`` the ceiling of every model together),
or the static ``max_in_flight``. Past it a request waits a short time
(``queue_seconds``), then gets 503 ``overloaded`` with Retry-After: under overload clients
hear "no" in milliseconds instead of queueing into the Triton deadline. Once the queue
has stood non-empty that long, the newest waiter is served first (adaptive LIFO).

Waiting requests are not served in arrival order. When a slot frees, it goes to the
waiting key of the highest tier priority and, among those, to the one holding the fewest
slots for its tier's share (weighted fair queueing over slots): a key flooding the
gateway holds every idle slot it likes (idle capacity is borrowed freely), but each slot
it gives back goes to another key that is waiting, so a burst from one tenant never
starves another.

While draining (SIGTERM), new inference requests get 503 ``shutting-down`` and
``/readyz`` is 503, so the load balancer moves on, while the requests already admitted
finish.
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from time import monotonic
from typing import TYPE_CHECKING, Any

from gateway.errors import OverloadedError, ShuttingDownError
from gateway.observe.metrics import CapacityReading
from gateway.serving.queuegate import GateSettings, QueueGate

if TYPE_CHECKING:
    from gateway.settings import ServerSettings, TierSettings
    from gateway.shared.keyfiles import ApiKey


# a key over its share may not take the last ceiling // RESERVE_FRACTION slots
RESERVE_FRACTION = 16


@dataclass(frozen=True)
class Tenant:
    """Who a request is admitted for: the API key's id ("" without keys) and its tier."""

    id: str = ""
    tier: str = "standard"
    share: float = 1.0
    priority: int = 0
    key: ApiKey | None = None  # its quotas (the keys file's line)


ANONYMOUS = Tenant()


@dataclass
class Ticket:
    """One admitted request: for whom, and through which gate."""

    tenant: Tenant
    # admitted while it held less than its guaranteed share and other keys contended:
    # its Triton calls go at the high priority, ahead of a flood's queued requests
    favoured: bool = False
    model: str = ""  # whose gate it passed (gateway.serving.queuegate), "" for none


@dataclass
class _Waiter:
    tenant: Tenant
    future: asyncio.Future[Ticket]
    enqueued: float
    model: str = ""


@dataclass
class Throughput:
    """Completions a second, averaged over about ``tau`` seconds (an exponentially
    decaying count: each completion adds one, the count decays by e every ``tau``)."""

    tau: float = 2.0
    count: float = 0.0
    stamp: float = field(default_factory=monotonic)

    def _decay(self, now: float) -> None:
        self.count *= math.exp(-max(0.0, now - self.stamp) / self.tau)
        self.stamp = now

    def add(self, now: float) -> None:
        self._decay(now)
        self.count += 1.0

    def recent(self, now: float) -> float:
        """The decayed count: about the completions of the last ``tau`` seconds."""
        self._decay(now)
        return self.count


@dataclass
class Utilization:
    """The share of the limit in use, averaged over ``tau`` seconds (an exponential
    moving average updated at each change and read at scrape time): what an autoscaler
    scales on, without the noise of one instant."""

    tau: float = 10.0
    value: float = 0.0
    current: float = 0.0
    stamp: float = field(default_factory=monotonic)

    def _advance(self, now: float) -> None:
        weight = 1 - math.exp(-max(0.0, now - self.stamp) / self.tau)
        self.value += weight * (self.current - self.value)
        self.stamp = now

    def set(self, current: float, now: float) -> None:
        self._advance(now)
        self.current = current

    def read(self, now: float) -> float:
        self._advance(now)
        return self.value


class Admission:
    """Slots for inference requests; built by the app factory, shared with the server."""

    def __init__(
        self,
        ceiling: int,
        queue_seconds: float,
        retry_after: int,
        clock: Any = monotonic,
        gate: QueueGate | None = None,
        retry_after_max: int | None = None,
    ) -> None:
        self.ceiling = ceiling  # every model's requests in flight together (max_in_flight)
        # each model's own limit, from Triton's queue (gateway.serving.queuegate); None: one
        # limit for every model together
        self.gate = gate
        self.by_model: dict[str, int] = {}  # in flight, by the model whose gate it passed
        self._waiting_for: dict[str, int] = {}  # waiters, by model
        if gate is not None:
            gate.on_change = self._regranted
        self.queue_seconds = queue_seconds
        self.retry_after = retry_after  # the least Retry-After of a refusal
        self.retry_after_max = max(retry_after, retry_after_max or retry_after)  # the most
        self._promised = 0.0  # when the last caller refused was told to come back
        self.clock = clock
        # the slots under the ceiling a key over its share may not take (1 in 16: none
        # under 16), so a key arriving beside one that holds the ceiling is admitted at
        # once instead of waiting for a completion that may be 100s of ms away
        self.reserve = ceiling // RESERVE_FRACTION
        self.in_flight = 0
        self.held: dict[str, int] = {}
        self.held_by_tier: dict[str, int] = {}
        # the keys holding or waiting for slots (their requests), their shares and the sum
        self._present: dict[str, int] = {}
        self._share_of: dict[str, float] = {}
        self._shares = 0.0
        self._waiting: dict[str, deque[_Waiter]] = {}
        self.waiting = 0
        self._queued_since: float | None = None  # when the queue last stopped being empty
        self.utilization = Utilization()
        self.throughput = Throughput()
        self.leaving = False  # /readyz says 503; requests are still admitted
        self.draining = False
        self._idle = asyncio.Event()
        self._idle.set()
        # refusals and waits, for the metrics (read by the collector at scrape time)
        self.shed = 0
        self.admitted = 0
        self.waited_seconds = 0.0

    @property
    def limit(self) -> int:
        """What may be in flight now: the ceiling, or with a gate its models' together."""
        gate = self.gate
        if gate is None or not gate.gates:
            return self.ceiling
        # (a loop, not sum() over a generator: this is read several times a request)
        total = 0
        for model_gate in gate.gates.values():
            total += model_gate.limit
        return min(self.ceiling, total)

    def _model_open(self, model: str) -> bool:
        gate = self.gate
        return gate is None or self.by_model.get(model, 0) < gate.limit(model)

    def _regranted(self) -> None:
        """A model's gate rose: its waiters may go now."""
        if self._waiting:
            self._grant(self.clock())

    def shutting_down(self) -> ShuttingDownError:
        return ShuttingDownError(
            "the gateway is shutting down; retry on another replica",
            retry_after=self.retry_after,
            headers={"Connection": "close"},
        )

    def _check_open(self) -> None:
        if self.draining:
            raise self.shutting_down()

    def _enter(self, tenant: Tenant) -> None:
        count = self._present.get(tenant.id, 0)
        if not count:
            self._share_of[tenant.id] = tenant.share
            self._shares += tenant.share
        self._present[tenant.id] = count + 1

    def _exit(self, tenant_id: str) -> None:
        count = self._present[tenant_id] - 1
        if count:
            self._present[tenant_id] = count
            return
        del self._present[tenant_id]
        self._shares -= self._share_of.pop(tenant_id)
        if not self._present:
            self._shares = 0.0  # no drift from the float sums

    def _guaranteed(self, tenant: Tenant) -> int | None:
        """``tenant``'s guaranteed share of the limit while other keys hold or wait for
        slots (the limit split between them by share; at least one), else None."""
        present = tenant.id in self._present
        if tenant.id == "" or len(self._present) < (2 if present else 1):
            return None
        shares = self._shares if present else self._shares + tenant.share
        return max(1, int(self.limit * tenant.share / shares))

    def holds(self, tenant: Tenant) -> int:
        """``tenant``'s requests in flight and waiting for a slot."""
        return self.held.get(tenant.id, 0) + len(self._waiting.get(tenant.id, ()))

    def under_share(self, tenant: Tenant) -> bool:
        """Whether ``tenant`` holds less than its guaranteed share while other keys contend
        (at the ceiling or not): the next slot freed is its (the fair rule), so it is never
        refused from its headers, and its requests within that share wait for a slot up to
        ``retry_after_max`` seconds (the longest a refusal could have told them to wait)
        rather than the queue wait."""
        guaranteed = self._guaranteed(tenant)
        return guaranteed is not None and self.held.get(tenant.id, 0) < guaranteed

    def within_share(self, tenant: Tenant) -> bool:
        """Whether ``tenant``'s requests held and waiting (:meth:`holds`) are fewer than its
        guaranteed share while other keys contend: the next one waits for a slot up to
        ``retry_after_max`` seconds, not the queue wait (:meth:`acquire`)."""
        guaranteed = self._guaranteed(tenant)
        return guaranteed is not None and self.holds(tenant) < guaranteed

    def below_share(self, tenant: Tenant) -> bool:
        """Whether ``tenant`` holds less than its guaranteed share while other keys contend:
        such a request is admitted at once, past the limit and into the reserve if need
        be (never past the ceiling), so a key that floods cannot make another wait while
        the limit falls. Only requests of keys over their share wait, and are shed."""
        return self.in_flight < self.ceiling and self.under_share(tenant)

    def _room(self, tenant: Tenant) -> int:
        """What may be in flight when ``tenant`` is admitted by the plain rule: the ceiling,
        less the reserve for a key (requests without keys have no one to share with);
        each model's gate is checked apart (:meth:`_model_open`)."""
        return self.ceiling if tenant.id == "" else self.ceiling - self.reserve

    def _take(self, tenant: Tenant, now: float, model: str = "") -> Ticket:
        """One slot for ``tenant`` (already counted present)."""
        guaranteed = self._guaranteed(tenant)
        held = self.held.get(tenant.id, 0)
        if self.gate is not None:
            self.by_model[model] = self.by_model.get(model, 0) + 1
            self.gate.note_sent(model)
        self.in_flight += 1
        self.admitted += 1
        self.held[tenant.id] = held + 1
        self.held_by_tier[tenant.tier] = self.held_by_tier.get(tenant.tier, 0) + 1
        self._idle.clear()
        self.utilization.set(min(1.0, self.in_flight / max(1, self.limit)), now)
        favoured = guaranteed is not None and held < guaranteed
        return Ticket(tenant, favoured, model)

    def refused(self, tenant: Tenant) -> None:
        """A request of ``tenant`` was refused before it waited (gateway.serving.refusal):
        counted as shed."""
        self.shed += 1

    async def acquire(self, tenant: Tenant = ANONYMOUS, model: str = "") -> Ticket:
        """Take one in-flight slot for a request (for ``model``: through its gate, when
        there are gates), or raise a 503 error (then do not release)."""
        self._check_open()
        now = self.clock()
        if self.gate is None:
            model = ""
        open_now = self.in_flight < self._room(tenant) and self._model_open(model)
        if (open_now and not self._waiting_for.get(model)) or self.below_share(tenant):
            self._enter(tenant)
            return self._take(tenant, now, model)
        # a key under its share is first in line for the next slot: its requests within that
        # share (held and waiting) wait for one as long as a refusal could tell them to come
        # back (retry_after_max; static limits under 16 have no reserve to admit them at once).
        # Refused sooner, one would only come back later than that slot: with Triton slowed
        # and a core busy, a flood's slots were freed over 1 s apart and a quiet key waiting
        # retry_after (1 s) was refused. Its requests past its share wait the queue wait, so
        # a key sending many at once holds no more long waits (and their bodies) than its share
        wait = (
            max(self.queue_seconds, float(self.retry_after_max))
            if self.within_share(tenant)
            else self.queue_seconds
        )
        future: asyncio.Future[Ticket] = asyncio.get_running_loop().create_future()
        waiter = _Waiter(tenant, future, now, model)
        self._waiting.setdefault(tenant.id, deque()).append(waiter)
        self._queued(+1, now, model)
        self._enter(tenant)
        try:
            await asyncio.wait({future}, timeout=wait)
        except asyncio.CancelledError:  # the client went away while it waited
            self._leave(waiter)
            raise
        self.waited_seconds += self.clock() - now
        if not future.done():
            self._leave(waiter)
            self.shed += 1
            raise OverloadedError(
                f"over {self.limit} requests are in flight; retry shortly",
                retry_after=self.come_back_in(self.clock()),
            )
        ticket = future.result()
        if self.draining:  # it started draining while this one queued
            self.release(ticket)
            self._check_open()
        return ticket

    def come_back_in(self, now: float) -> float:
        """The Retry-After of a refusal now: when the queue ahead (and this caller) will
        have drained at the rate requests complete, staggered after those refused before
        it at that rate (each second's worth of refused callers told to come back in a
        second of its own, not all in the same one); between ``retry_after`` and
        ``retry_after_max``. ``retry_after`` while nothing has completed lately (no rate)."""
        completed = self.throughput.recent(now)
        if completed < 1 or self.retry_after_max <= self.retry_after:
            return float(self.retry_after)
        rate = completed / self.throughput.tau
        at = max(now + (self.waiting + 1) / rate, self._promised)
        latest = now + self.retry_after_max
        self._promised = min(at + 1.0 / rate, latest)
        return min(max(at - now, float(self.retry_after)), float(self.retry_after_max))

    def _leave(self, waiter: _Waiter) -> None:
        """A waiter gives up: out of its queue; a slot granted to it meanwhile goes back."""
        if waiter.future.done():
            if not waiter.future.cancelled():
                self.release(waiter.future.result())
            return
        waiter.future.cancel()
        queue = self._waiting.get(waiter.tenant.id)
        if queue is not None:
            queue.remove(waiter)
            self._queued(-1, self.clock(), waiter.model)
            if not queue:
                del self._waiting[waiter.tenant.id]
        self._exit(waiter.tenant.id)

    def _queued(self, change: int, now: float, model: str) -> None:
        self.waiting += change
        waiting = self._waiting_for.get(model, 0) + change
        if waiting:
            self._waiting_for[model] = waiting
        else:
            self._waiting_for.pop(model, None)
        if not self.waiting:
            self._queued_since = None
        elif self._queued_since is None:
            self._queued_since = now

    def standing(self, now: float) -> bool:
        """Whether the queue has not been empty for ``queue_seconds``: overload, not a
        burst. Then the newest waiter is served first (adaptive LIFO, as Facebook's
        servers do it): each waiter still waits its whole ``queue_seconds`` before a 503,
        so as many are refused, no sooner (a faster 503 only brings the next request
        sooner), but the requests admitted have waited milliseconds, not the whole queue."""
        since = self._queued_since
        return since is not None and now - since >= self.queue_seconds

    def _admissible(self, waiter: _Waiter) -> bool:
        """Whether ``waiter`` may have a slot now: room under the limit and its model's
        gate, or its key below its share (the reserve)."""
        tenant = waiter.tenant
        return (self.in_flight < self._room(tenant) and self._model_open(waiter.model)) or self.below_share(
            tenant
        )

    def _best_queue(self, now: float, admissible: bool = False) -> str | None:
        """The key whose waiter a free slot goes to: highest priority, then fewest slots
        held for its share, then the longest waiting (the newest, under a standing queue);
        with ``admissible``, among the keys whose next waiter may have a slot now (a waiter
        behind a closed gate does not hold up another model's)."""
        newest = self.standing(now)
        best: tuple[int, float, float] | None = None
        chosen: str | None = None
        for tenant_id, queue in self._waiting.items():
            head = queue[0]
            if admissible and not self._admissible(queue[-1] if newest else head):
                continue
            waited = -queue[-1].enqueued if newest else head.enqueued
            rank = (-head.tenant.priority, self.held.get(tenant_id, 0) / head.tenant.share, waited)
            if best is None or rank < best:
                best, chosen = rank, tenant_id
        return chosen

    def _grant_to(self, tenant_id: str, now: float) -> None:
        queue = self._waiting[tenant_id]
        waiter = queue.pop() if self.standing(now) else queue.popleft()
        if not queue:
            del self._waiting[tenant_id]
        self._queued(-1, now, waiter.model)
        waiter.future.set_result(self._take(waiter.tenant, now, waiter.model))

    def _grant(self, now: float) -> bool:
        """Free slots to the waiters, best first, while the best may have one; whether
        any was granted."""
        granted = False
        while (chosen := self._best_queue(now, admissible=True)) is not None:
            self._grant_to(chosen, now)
            granted = True
        return granted

    def _hand_over(self, releaser: Tenant, now: float, model: str) -> None:
        """No slot is free (the limit has fallen below what is in flight); the slot a key
        just gave back still goes to a waiting key that holds fewer for its share (what
        is in flight does not grow), so a flood's slots pass to the others one
        completion each instead of all waiting for the limit to be reached."""
        chosen = self._best_queue(now)  # (in flight is under the ceiling: one was just released)
        if chosen is None or chosen == releaser.id:
            return
        queue = self._waiting[chosen]
        if (queue[-1] if self.standing(now) else queue[0]).model != model:  # another gate's
            return
        share = self._waiting[chosen][0].tenant.share
        if self.held.get(chosen, 0) / share < (self.held.get(releaser.id, 0) + 1) / releaser.share:
            self._grant_to(chosen, now)

    def release(self, ticket: Ticket, served: bool = True) -> None:
        """Give back the slot taken by :meth:`acquire`. ``served`` False: the slot did no
        work (a probe), and is no completion."""
        now = self.clock()
        self.in_flight -= 1
        if self.gate is not None:
            left = self.by_model[ticket.model] - 1
            if left:
                self.by_model[ticket.model] = left
            else:
                del self.by_model[ticket.model]
        if served:
            self.throughput.add(now)
        tenant = ticket.tenant
        held = self.held[tenant.id] - 1
        if held:
            self.held[tenant.id] = held
        else:
            del self.held[tenant.id]
        self._exit(tenant.id)
        self.held_by_tier[tenant.tier] -= 1
        self.utilization.set(min(1.0, self.in_flight / max(1, self.limit)), now)
        if self._waiting and not self._grant(now):
            self._hand_over(tenant, now, ticket.model)
        if self.in_flight == 0:
            self._idle.set()

    def slot(
        self,
        waiting: AbstractContextManager[Any] | None = None,
        tenant: Tenant = ANONYMOUS,
        model: str = "",
    ) -> Slot:
        """Hold one in-flight slot for the duration of the block (through ``model``'s gate,
        when there are gates); ``waiting`` (say, a tracing span) is entered only while the
        slot is being acquired."""
        return Slot(self, waiting, tenant, model)

    def reading(self) -> CapacityReading:
        """What the capacity gauges show (read at scrape time)."""
        gate = self.gate
        return CapacityReading(
            limit=self.limit,
            ceiling=self.ceiling,
            in_flight=self.in_flight,
            waiting=self.waiting,
            in_use=self.utilization.read(self.clock()),
            gates=() if gate is None else gate.readings(),
            admitted=self.admitted,
            shed=self.shed,
            waited_seconds=self.waited_seconds,
            held_by_tier=dict(self.held_by_tier),
        )

    def start_leaving(self) -> None:
        """From now on /readyz says not ready, so load balancers stop sending; requests
        that still come are served (the drain delay before :meth:`start_draining`)."""
        self.leaving = True

    def start_draining(self) -> None:
        """From now on, refuse new requests (and /readyz says not ready)."""
        self.leaving = True
        self.draining = True

    async def wait_idle(self) -> None:
        """Return once no admitted request is in flight (bound it with asyncio.timeout)."""
        await self._idle.wait()


class Slot:
    """:meth:`Admission.slot`'s block (a class, not a generator: every request takes one)."""

    __slots__ = ("_admission", "_model", "_tenant", "_ticket", "_waiting")

    def __init__(
        self, admission: Admission, waiting: AbstractContextManager[Any] | None, tenant: Tenant, model: str
    ) -> None:
        self._admission = admission
        self._waiting = waiting
        self._tenant = tenant
        self._model = model
        self._ticket: Ticket | None = None

    async def __aenter__(self) -> Ticket:
        with self._waiting or nullcontext():
            self._ticket = await self._admission.acquire(self._tenant, self._model)
        return self._ticket

    async def __aexit__(self, *exc: object) -> None:
        ticket, self._ticket = self._ticket, None
        if ticket is not None:
            self._admission.release(ticket)


def build_admission(server: ServerSettings) -> Admission:
    """The gateway's admission: each model gated on what Triton's statistics say its
    batches cost (every model together under ``max_in_flight``), or that static cap."""
    ceiling = server.max_in_flight
    adaptive = server.adaptive
    gate = (
        QueueGate(
            GateSettings(
                target=adaptive.queue_target_batches,
                efficiency=adaptive.batch_efficiency,
                floor=min(adaptive.floor, ceiling),
                ceiling=ceiling,
                interval_seconds=adaptive.statistics_interval_seconds,
            )
        )
        if adaptive.enabled
        else None
    )
    return Admission(
        ceiling,
        server.queue_seconds,
        server.retry_after_seconds,
        gate=gate,
        retry_after_max=server.retry_after_max_seconds,
    )


def tenant_of(key: ApiKey, tiers: Mapping[str, TierSettings]) -> Tenant:
    """The tenant a key's requests are admitted for (its tier's share and priority)."""
    tier = tiers.get(key.tier) or tiers["standard"]
    return Tenant(key.id, key.tier if key.tier in tiers else "standard", tier.share, tier.priority, key)
