"""Accepting connections: every one waiting when the listening socket has a queue.

libuv, under uvloop, accepts one connection each turn of the event loop (libuv#3696: it
relies on the listening socket staying readable). A turn in which the gateway reads a
storm's heads and bodies lasts tens of milliseconds, so a burst of new connections waited
that long per connection: of 300 uploads opened at once, the last 70-80 were accepted
one every 25-50 ms, their heads read (and refused) 250-500 ms after they were sent, while
the heads of those accepted earlier were answered within 100 ms
(tests/integration/test_refused_unread.py).

:class:`Listener` keeps the loop's own server, whose accept is the cheapest there is
(libuv's, in C), and adds what it lacks: each time that server accepts a connection, the
listener tries one more accept of its own, and when that finds a queue it accepts every
connection waiting (up to ``batch``), each made a transport with the server's protocol as
``loop.create_server`` would make it (on the next turn). With no queue, the one extra
accept that finds nothing is all a connection costs: a bare server's CPU per new
connection was 4-7 us over libuv's alone this way, 14-19 us with every accept in Python
(docs/explanation/reliability.md).

A turn accepts at most :data:`ACCEPT_BATCH` (the rest on the next turns): a flood of
connections costs each turn a bounded share of the loop (each accepted connection is a
task and a protocol, tens of microseconds), not the whole backlog (2048) at once. Run out
of descriptors (EMFILE and the like), it stops accepting for a second, as asyncio does,
and the kernel's backlog holds the rest (or the loop's own server takes them one a turn).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import time
from collections.abc import Callable

logger = logging.getLogger("gateway.server")

# out of a system resource: accepting again at once would only fail again (asyncio's list)
_RESOURCE_ERRORS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_RETRY_SECONDS = 1.0
ACCEPT_BATCH = 128  # connections accepted in one turn of the loop, at most


class Listener(asyncio.AbstractServer):
    """The loop's server on a listening socket, which also accepts every connection
    waiting when it finds a queue, each served by ``protocol_factory`` (an asyncio server,
    as uvicorn keeps them: ``close`` and ``wait_closed``)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        protocol_factory: Callable[[], asyncio.Protocol],
        batch: int = ACCEPT_BATCH,
        backlog: int = 2048,
    ) -> None:
        self._loop = loop
        self._sock: socket.socket | None = sock
        self._factory = protocol_factory
        self._batch = max(1, batch)
        self._backlog = backlog
        self._server: asyncio.AbstractServer | None = None
        self._spare: socket.socket | None = None  # the listening socket, accepted from here
        self._opening: set[asyncio.Task[None]] = set()
        self._resting_until = 0.0

    @property
    def sockets(self) -> tuple[socket.socket, ...]:
        return () if self._sock is None else (self._sock,)

    async def start(self) -> Listener:
        assert self._sock is not None
        self._spare = self._sock.dup()
        self._spare.setblocking(False)
        self._server = await self._loop.create_server(self._accepted, sock=self._sock, backlog=self._backlog)
        return self

    def _accepted(self) -> asyncio.Protocol:
        """The loop's server accepted a connection: its protocol, and those waiting behind it."""
        protocol = self._factory()
        self._accept_waiting()
        return protocol

    def _accept_waiting(self) -> None:
        sock = self._spare
        if sock is None or (self._resting_until and self._resting_until > time.monotonic()):
            return
        for _ in range(self._batch):
            try:
                connection, _ = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue  # the client left before it was accepted
            except OSError as exc:
                if exc.errno not in _RESOURCE_ERRORS:
                    logger.error("accepting a connection failed: %s", exc)
                    return
                logger.error("cannot accept connections (%s): trying again in %.0f s", exc, _RETRY_SECONDS)
                self._resting_until = time.monotonic() + _RETRY_SECONDS
                return
            connection.setblocking(False)
            task = self._loop.create_task(self._open(connection))
            self._opening.add(task)
            task.add_done_callback(self._opening.discard)

    async def _open(self, connection: socket.socket) -> None:
        try:
            await self._loop.connect_accepted_socket(self._factory, connection)
        except OSError:  # reset before it could be served
            connection.close()

    def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for sock in (self._spare, self._sock):
            if sock is not None:
                sock.close()
        self._spare = self._sock = None

    async def wait_closed(self) -> None:
        if self._opening:
            await asyncio.gather(*self._opening, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    def get_loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def is_serving(self) -> bool:
        return self._server is not None and self._server.is_serving()

    async def start_serving(self) -> None:
        if self._server is not None:
            await self._server.start_serving()

    async def serve_forever(self) -> None:
        assert self._server is not None
        await self._server.serve_forever()


def bind(host: str | None, port: int, backlog: int) -> socket.socket:
    """A listening TCP socket on ``host:port`` (IPv6 when the host is an IPv6 address;
    every IPv4 address when None), with ``backlog``, as uvicorn binds one."""
    address = "0.0.0.0" if host is None else host
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    return socket.create_server((address, port), family=family, backlog=backlog)
