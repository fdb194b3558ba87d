"""Many uploads sent at once, each answer timed by the kernel, not by the client.

A Python client pushing 300 bodies of 250 KiB reads each status line only when its own
loop comes round to it, a hundred milliseconds and more after the answer arrived: what it
measures is itself. Here every socket asks the kernel to stamp what it receives
(``SO_TIMESTAMPNS``), and an answer's time is the stamp on its first bytes, however late
the client reads them; the start is taken just before the socket's head is written (all
the heads go first, then the bodies, as a storm's do)."""

from __future__ import annotations

import selectors
import socket
import struct
import time
from dataclasses import dataclass

# Linux's values (asm-generic/socket.h); Python's socket module does not name them
SO_TIMESTAMPNS = 35
SCM_TIMESTAMPNS = SO_TIMESTAMPNS
CHUNK = 64 * 1024


@dataclass(frozen=True)
class Answer:
    status: bytes  # the status line, b"reset" if the connection was reset first
    seconds: float  # from the head written to the answer's first bytes arriving
    read_seconds: float  # from the head written to this client reading them (its own delay added)


@dataclass
class _Upload:
    sock: socket.socket
    started: float = 0.0
    sent: int = 0
    received: bytes = b""
    arrived: float | None = None
    read: float | None = None
    status: bytes = b""


def _stamp(ancillary: list[tuple[int, int, bytes]]) -> float | None:
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == SCM_TIMESTAMPNS and len(data) >= 16:
            seconds, nanoseconds = struct.unpack("qq", data[:16])
            return float(seconds + nanoseconds / 1e9)
    return None


def _receive(upload: _Upload) -> bool:
    """Read what came; whether the status line (or the connection's end) is in."""
    try:
        data, ancillary, _, _ = upload.sock.recvmsg(4096, socket.CMSG_SPACE(16))
    except BlockingIOError:
        return False
    except ConnectionError:
        data, ancillary = b"", []
    if upload.arrived is None:
        upload.read = time.time()
        upload.arrived = _stamp(ancillary) or upload.read
    upload.received += data
    if b"\r\n" in upload.received or not data:
        upload.status = upload.received.split(b"\r\n", 1)[0].strip() or b"reset"
        return True
    return False


def _send(upload: _Upload, body: bytes) -> bool:
    """Send the body's next chunk; whether it is all sent."""
    try:
        upload.sent += upload.sock.send(body[upload.sent : upload.sent + CHUNK])
    except BlockingIOError:
        pass
    except ConnectionError:
        upload.sent = len(body)
    return upload.sent >= len(body)


def storm(port: int, head: bytes, body: bytes, count: int, timeout: float = 60.0) -> list[Answer]:
    """``count`` connections each send ``head`` then ``body`` (the heads first, all of
    them); each stops sending once its status line has come. Returns every answer."""
    uploads = []
    for _ in range(count):
        sock = socket.create_connection(("127.0.0.1", port))
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        uploads.append(_Upload(sock))
    for upload in uploads:
        upload.started = time.time()  # the kernel's stamps are CLOCK_REALTIME
        upload.sock.sendall(head)
        upload.sock.setblocking(False)
    selector = selectors.DefaultSelector()
    for upload in uploads:
        selector.register(upload.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, upload)
    pending = len(uploads)
    deadline = time.monotonic() + timeout
    while pending and time.monotonic() < deadline:
        for key, events in selector.select(timeout=1.0):
            ready: _Upload = key.data
            if events & selectors.EVENT_READ and _receive(ready):
                selector.unregister(ready.sock)
                ready.sock.close()
                pending -= 1
                continue
            if events & selectors.EVENT_WRITE and _send(ready, body):
                selector.modify(ready.sock, selectors.EVENT_READ, ready)
    selector.close()
    now = time.time()
    for upload in uploads:
        if not upload.status:
            upload.sock.close()
    return [
        Answer(
            upload.status or b"none",
            (upload.arrived or now) - upload.started,
            (upload.read or now) - upload.started,
        )
        for upload in uploads
    ]
