"""gateway.http.listener on uvloop, the gateway's loop: connections waiting to be accepted
are all accepted on the loop's next turn, however many, not one a turn as libuv does; with
no queue, the loop's own server accepts each."""

from __future__ import annotations

import asyncio
import socket
from collections import Counter
from collections.abc import Awaitable, Callable

import uvloop

from gateway.http.listener import Listener, bind

WAITING = 100

Factory = Callable[[], asyncio.Protocol]
Serve = Callable[[asyncio.AbstractEventLoop, socket.socket, Factory], Awaitable[asyncio.AbstractServer]]


class _Made(asyncio.Protocol):
    """Notes the loop's turn at which each connection is made, and greets it."""

    def __init__(self, made: list[int], turns: list[int], all_made: asyncio.Event) -> None:
        self.made, self.turns, self.all_made = made, turns, all_made

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.made.append(self.turns[0])
        if len(self.made) == WAITING:
            self.all_made.set()
        transport.write(b"hi")  # type: ignore[attr-defined]


def _turns_made(serve: Serve) -> list[int]:
    """The loop's turn at which each of WAITING connections was made, all of them waiting
    in the kernel's backlog when the loop first looks."""
    made: list[int] = []
    turns = [0]

    async def main() -> None:
        loop = asyncio.get_running_loop()

        def turn() -> None:  # a ready callback runs once a turn of the loop
            turns[0] += 1
            loop.call_soon(turn)

        all_made = asyncio.Event()
        sock = bind("127.0.0.1", 0, 2048)
        port = sock.getsockname()[1]
        server = await serve(loop, sock, lambda: _Made(made, turns, all_made))
        # the loop does not run while these connect: each waits in the backlog
        clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(WAITING)]
        loop.call_soon(turn)
        async with asyncio.timeout(10):
            await all_made.wait()
        for client in clients:
            assert client.recv(2) == b"hi"  # each was served
            client.close()
        server.close()
        await server.wait_closed()

    uvloop.run(main())
    assert len(made) == WAITING, len(made)
    return made


def test_every_connection_waiting_is_accepted_at_once() -> None:
    async def listener(loop: asyncio.AbstractEventLoop, sock: socket.socket, factory: Factory) -> Listener:
        return await Listener(loop, sock, factory).start()

    made = _turns_made(listener)
    # all accepted when the socket is first seen ready, each made on a turn after
    assert max(made) - min(made) <= 2, made


def test_a_turn_accepts_a_bounded_batch() -> None:
    """A flood of connections costs a turn of the loop at most a batch of them."""

    async def listener(loop: asyncio.AbstractEventLoop, sock: socket.socket, factory: Factory) -> Listener:
        return await Listener(loop, sock, factory, batch=WAITING // 4).start()

    made = _turns_made(listener)
    # the batch, and the one the loop's own server accepted
    assert Counter(made).most_common(1)[0][1] <= WAITING // 4 + 1, Counter(made)
    assert max(made) - min(made) <= 8, made


def test_libuv_alone_accepts_one_connection_a_turn() -> None:
    """Why the listener exists: uvloop's own server (libuv, since libuv#3696) accepts one
    connection a turn of the loop, and under a storm a turn lasts tens of milliseconds. If
    this fails, libuv accepts in batches again and gateway.http.listener may go."""

    async def libuv(
        loop: asyncio.AbstractEventLoop, sock: socket.socket, factory: Factory
    ) -> asyncio.AbstractServer:
        return await loop.create_server(factory, sock=sock)

    made = _turns_made(libuv)
    assert max(made) - min(made) >= WAITING // 2, made


def test_a_closed_listener_accepts_no_more() -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        sock = bind("127.0.0.1", 0, 16)
        port = sock.getsockname()[1]
        listener = await Listener(loop, sock, asyncio.Protocol, 16).start()
        assert listener.is_serving()
        assert listener.sockets == (sock,)
        listener.close()
        await listener.wait_closed()
        assert not listener.is_serving()
        assert not listener.sockets
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
        except ConnectionRefusedError:
            return
        raise AssertionError("a closed listener still accepted a connection")

    uvloop.run(main())


def test_without_a_queue_the_loops_own_server_accepts() -> None:
    """libuv's accept is the cheapest: a connection that finds no queue costs one accept
    of the listener's own that finds nothing, and is never made in Python."""
    opened: list[socket.socket] = []

    class Counting(Listener):
        async def _open(self, connection: socket.socket) -> None:
            opened.append(connection)
            await super()._open(connection)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        sock = bind("127.0.0.1", 0, 16)
        port = sock.getsockname()[1]
        made: list[int] = []
        listener = await Counting(loop, sock, lambda: _Made(made, [0], asyncio.Event())).start()
        for _ in range(20):  # one at a time, each served before the next connects
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            assert await reader.readexactly(2) == b"hi"
            writer.close()
        listener.close()
        await listener.wait_closed()
        assert len(made) == 20

    uvloop.run(main())
    assert opened == []
