"""Refusing a request before a byte of its body is read: one decision and one answer for
every place that can refuse unread.

Three places can: the HTTP protocol once a request's head is parsed
(gateway.http.headshed), a route before it reads its body (the dispatcher's
:meth:`Refusals.before_body`, which every inference route enters), and the gRPC door
before it reads a ``ModelInfer`` message (gateway.rpc.door). All three ask
:meth:`Refusals.refuses` and answer with :meth:`Refusals.unread_refusal` (or its held form):
a new door inherits the rule by calling this module, and a change to the rule is made
once.

The rule (:meth:`Refusals.refuses`): draining; or, while requests complete (the gateway
sees its queue move), either a named caller's own requests (in flight, waiting, still
uploading their bodies, and arrived: heads the HTTP protocol has parsed whose routes have
not run yet) are already more than the gateway serves within the queue wait
(the limit, and what completes in that wait: the rest would be refused after their
uploads and the wait);
or no slot is free for the caller, at least a limit's worth of requests already wait for
one, and at the rate a limit's worth of completions shows they would not all be served
within the queue wait. Let in: a burst (a queue shorter than the limit), a key under its
share, and any request while nothing completed lately (a cold replica or a stalled
Triton: nothing says how fast the queue moves). Other callers' requests still uploading
are never counted ahead, nor anonymous ones (no name tells one stranger from another),
nor one that sent ``Expect: 100-continue`` (it waited for a slot before its upload): a
client that opens requests and sends their bodies slowly (or never) makes the gateway
refuse its own requests only, never anyone else's.

The answer: 503 ``overloaded`` with ``Retry-After`` (``shutting-down`` while draining): when
the queue will have drained at the measured completion rate
(:meth:`~gateway.serving.admission.Admission.come_back_in`), with
``Connection: close`` unless the body is small enough for the server to read away and the
client is not waiting to send it; held a little when the connection was refused moments
ago (gateway.serving.retries), so a client retrying in a loop does not spin the gateway.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable
from typing import NamedTuple

from gateway.errors import OverloadedError, ServiceUnavailableError, ShuttingDownError
from gateway.serving.admission import ANONYMOUS, Admission, Tenant
from gateway.serving.retries import RetryDamper


class UnreadBody(NamedTuple):
    """What a request's headers say of its body, before a byte of it is read."""

    expects_continue: bool = False  # the client waits for 100 Continue before sending it
    small: bool = False  # announced, and small enough for the server to read away
    connection: Hashable | None = None  # the connection it came on (a retry there waits)
    # or how to name it, asked only when refused (gRPC's peer is a call into its core)
    connection_of: Callable[[], Hashable] | None = None

    def named_connection(self) -> Hashable | None:
        if self.connection is None and self.connection_of is not None:
            return self.connection_of()
        return self.connection


class Refusals:
    """Built once by the runtime beside the admission it judges; every door asks it."""

    def __init__(self, admission: Admission, shed_unread: bool = True) -> None:
        self.admission = admission
        self.shed_unread = shed_unread  # off: only a draining gateway refuses unread
        # named callers' requests reading their bodies now (past this rule, not yet waiting
        # for a slot), by key id, and in all; arrived heads (:meth:`arrived`) among them
        self._uploading: dict[str, int] = {}
        self.uploading = 0
        # arrived heads not named yet, and how to name each (only when the rule asks)
        self._unnamed: dict[Upload, Callable[[], str | None]] = {}
        # a retry that comes at once waits at most the Retry-After it was told to wait
        retry_after = float(admission.retry_after)
        self.damper = RetryDamper(longest_seconds=retry_after, forget_seconds=retry_after)

    def armed(self) -> bool:
        """The cheap test first (every HTTP request head asks): nothing is refused while
        the queue is shorter than the limit, unless the gateway drains."""
        admission = self.admission
        return admission.draining or admission.waiting + self.uploading >= admission.limit

    def refuses(self, tenant: Tenant = ANONYMOUS) -> bool:
        """Whether a request for ``tenant`` would be shed if it waited for a slot (the
        module's rule)."""
        admission = self.admission
        if admission.draining:
            return True
        if not self.shed_unread or admission.under_share(tenant):  # next in line: never refused
            return False
        ahead, limit = admission.waiting, admission.limit
        completed = admission.throughput.recent(admission.clock())
        if completed < 1:  # nothing completed lately: a cold replica, or Triton stalled
            return False
        served_in_wait = completed / admission.throughput.tau * admission.queue_seconds
        if tenant.id:  # a caller with a name: its own would be shed after their uploads
            if self._unnamed:
                self._name_arrivals()
            own = admission.holds(tenant) + self._uploading.get(tenant.id, 0)
            if own + 1 > limit + served_in_wait:
                return True
        # a long queue, at a rate measured over a limit's worth of completions
        return completed >= limit and ahead >= limit and ahead + 1 > served_in_wait

    def refusal(self, tenant: Tenant = ANONYMOUS, close: bool = True) -> OverloadedError | ShuttingDownError:
        """What :meth:`refuses` turns into for ``tenant`` (counted as shed; the key is not a
        light one for a while). With ``close``, the connection closes after the answer."""
        admission = self.admission
        if admission.draining:
            return admission.shutting_down()
        admission.refused(tenant)
        return OverloadedError(
            f"over {admission.limit} requests are in flight or waiting; retry shortly",
            retry_after=admission.come_back_in(admission.clock()),
            headers={"Connection": "close"} if close else {},
        )

    def unread_refusal(
        self, unread: UnreadBody, tenant: Tenant = ANONYMOUS
    ) -> tuple[OverloadedError | ShuttingDownError, float]:
        """The refusal of a request :meth:`refuses` sheds, its body unread, and how long to
        hold it: ``Connection: close`` unless the body is small enough for the server to
        read away (and the client is not waiting to send it)."""
        refusal = self.refusal(tenant, close=unread.expects_continue or not unread.small)
        hold = 0.0 if self.admission.draining else self.hold(unread.named_connection())
        return refusal, hold

    async def held_refusal(
        self, unread: UnreadBody, tenant: Tenant = ANONYMOUS, at_most: float | None = None
    ) -> OverloadedError | ShuttingDownError:
        """:meth:`unread_refusal`, its hold waited out (``at_most`` that long: the gRPC
        door's half of a call's deadline). The HTTP head's hold is a timer in the protocol."""
        refusal, hold = self.unread_refusal(unread, tenant)
        if at_most is not None:
            hold = min(hold, at_most)
        if hold > 0:
            await asyncio.sleep(hold)
        return refusal

    def hold(self, connection: Hashable | None) -> float:
        """Seconds to hold a refusal to ``connection``: none for its first, longer for each
        retry that comes at once."""
        return self.damper.hold(connection, self.admission.clock())

    def before_body(
        self, tenant: Tenant, unread: UnreadBody, hold_at_most: float | None = None
    ) -> BeforeBody:
        """What a route does before it reads a body: refused (raised) if :meth:`refuses`
        says so, held as a retry is. A request that declared ``Expect: 100-continue``
        waits for a slot first (the queue wait), and is refused if none comes: the 503
        goes out before the body is sent (the server sends ``100 Continue`` only when the
        body is first read). It does not keep the slot while it uploads: a client that
        asks politely and then sends nothing would hold it for the whole body timeout.
        Like any other request, it takes its slot once its body is in. A refusal is held
        at most ``hold_at_most`` seconds (the gRPC door's half of a call's deadline)."""
        return BeforeBody(self, tenant, unread, hold_at_most)

    async def _enter(self, tenant: Tenant, unread: UnreadBody, hold_at_most: float | None) -> Upload:
        admission = self.admission
        if self.refuses(tenant):
            raise await self.held_refusal(unread, tenant, hold_at_most)
        if unread.expects_continue:
            try:
                ticket = await admission.acquire(tenant)
            except ServiceUnavailableError as exc:
                exc.headers = {**exc.headers, "Connection": "close"}
                raise
            admission.release(ticket, served=False)
        # counted as its caller's upload when the rule reads it: a named caller's, unless it
        # asked first (it waited for a slot above, and one that then sends nothing must not
        # count against its own key's others)
        counted = bool(tenant.id) and not unread.expects_continue
        return Upload(self if counted else None, tenant.id)

    def arrived(self, name: Callable[[], str | None]) -> Callable[[], None]:
        """A request whose head has been parsed and whose route has not run yet: counted
        as an upload (its caller's, once ``name`` names it: asked only when the rule needs
        the callers' counts, so a head costs a count, not an identification). Returns the
        call that ends the count, which the HTTP protocol schedules to run just before the
        request's task first runs (the route counts its own upload from there).

        Without this, the heads of a storm parsed in one turn of the event loop, before
        any of their routes ran, all passed the rule: none of them was uploading yet."""
        upload = Upload(self, "")
        self._unnamed[upload] = name
        return upload.done

    def _name_arrivals(self) -> None:
        unnamed, self._unnamed = self._unnamed, {}
        for upload, name in unnamed.items():
            tenant_id = name()
            if tenant_id:  # (else counted in all only: a caller the rule does not name)
                upload.name(tenant_id)

    def _count(self, tenant_id: str, change: int, in_all: bool = True) -> None:
        """Count ``change`` uploads of ``tenant_id`` ("": in all only), and in all unless
        ``in_all`` is false (an arrived head named late: counted in all already)."""
        if in_all:
            self.uploading += change
        if not tenant_id:
            return
        count = self._uploading.get(tenant_id, 0) + change
        if count:
            self._uploading[tenant_id] = count
        else:
            del self._uploading[tenant_id]


class BeforeBody:
    """:meth:`Refusals.before_body`'s block, giving the :class:`Upload` (a class, not a
    generator: every inference request enters one)."""

    __slots__ = ("_hold_at_most", "_refusals", "_tenant", "_unread", "_upload")

    def __init__(
        self, refusals: Refusals, tenant: Tenant, unread: UnreadBody, hold_at_most: float | None
    ) -> None:
        self._refusals = refusals
        self._tenant = tenant
        self._unread = unread
        self._hold_at_most = hold_at_most
        self._upload: Upload | None = None

    async def __aenter__(self) -> Upload:
        self._upload = await self._refusals._enter(self._tenant, self._unread, self._hold_at_most)
        return self._upload

    async def __aexit__(self, *exc: object) -> None:
        if self._upload is not None:
            self._upload.done()


class Upload:
    """A request past the rule, reading its body: counted as its caller's until
    :meth:`done` (the route calls it once the body is in; leaving the block does too)."""

    __slots__ = ("_refusals", "_tenant_id")

    def __init__(self, refusals: Refusals | None, tenant_id: str) -> None:
        """Counted in ``refusals`` (None: not counted); ``tenant_id`` "": in all only."""
        self._refusals = refusals
        self._tenant_id = tenant_id
        if refusals is not None:
            refusals._count(tenant_id, 1)

    def name(self, tenant_id: str) -> None:
        """Count it as ``tenant_id``'s from now (an arrived head, named late)."""
        if self._refusals is not None and not self._tenant_id:
            self._refusals._count(tenant_id, 1, in_all=False)
            self._tenant_id = tenant_id

    def done(self) -> None:
        refusals = self._refusals
        if refusals is not None:
            self._refusals = None
            refusals._unnamed.pop(self, None)
            refusals._count(self._tenant_id, -1)
