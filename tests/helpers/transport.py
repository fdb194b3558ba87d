"""A fake asyncio transport for protocol unit tests."""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Iterator
from typing import Any, TypeVar

import uvicorn
from uvicorn.server import ServerState

P = TypeVar("P", bound=asyncio.Protocol)


class OptionsSocket:
    """What a transport's ``socket`` extra is to the protocol: the options set on it."""

    def __init__(self) -> None:
        self.options: dict[tuple[int, int], bytes | int] = {}

    def setsockopt(self, level: int, name: int, value: bytes | int) -> None:
        self.options[(level, name)] = value

    def getsockname(self) -> tuple[str, int]:
        return ("127.0.0.1", 8080)

    def getpeername(self) -> tuple[str, int]:
        return ("127.0.0.1", 5000)


class RecordingTransport(asyncio.Transport):
    """A transport that keeps what is written to it and whether it was closed."""

    def __init__(self) -> None:
        super().__init__()
        self.written: list[bytes] = []
        self.closed = False
        self.aborted = False  # closed with what was unsent dropped
        self.eof = False  # its write side shut
        self.socket = OptionsSocket()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        extras = {"sockname": ("127.0.0.1", 8080), "peername": ("127.0.0.1", 5000), "socket": self.socket}
        return extras.get(name, default)

    @property
    def reset(self) -> bool:
        """Aborted with a zero linger: the kernel drops what it holds and resets."""
        linger = self.socket.options.get((socket.SOL_SOCKET, socket.SO_LINGER))
        return self.aborted and linger == struct.pack("ii", 1, 0)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = self.aborted = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        return None

    def resume_reading(self) -> None:
        return None

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof = True


def connected(kind: type[P], app: Any) -> Iterator[tuple[P, RecordingTransport, asyncio.AbstractEventLoop]]:
    """A connection of protocol ``kind`` (an HTTP protocol of uvicorn's, as the gateway
    configures it: httptools, no WebSocket) to ``app``, on a loop of its own; closed after."""
    loop = asyncio.new_event_loop()
    config = uvicorn.Config(app, http="httptools", ws="none", lifespan="off", log_config=None)
    protocol = kind(config, ServerState(), {}, _loop=loop)  # type: ignore[call-arg]
    transport = RecordingTransport()
    protocol.connection_made(transport)
    try:
        yield protocol, transport, loop
    finally:
        protocol.connection_lost(None)
        loop.close()
