"""Raw sockets against a door: one answer read from one, and when the server closed one."""

from __future__ import annotations

import socket
import time


def closed_within(
    sock: socket.socket, seconds: float, every: float = 0.0, frame: bytes = b""
) -> float | None:
    """When the server closed ``sock`` (seconds from now; ``frame`` sent every ``every``
    seconds meanwhile, if given), None if still open after ``seconds``."""
    started = time.monotonic()
    sent = started - every  # the first frame at once
    sock.settimeout(0.1)
    while time.monotonic() - started < seconds:
        if frame and time.monotonic() - sent >= every:
            sent = time.monotonic()
            try:
                sock.sendall(frame)
            except OSError:
                return time.monotonic() - started
        try:
            data = sock.recv(65536)
        except TimeoutError:
            continue
        except OSError:
            return time.monotonic() - started  # reset
        if data == b"":
            return time.monotonic() - started
    return None


def read_answer(sock: socket.socket) -> tuple[bytes, bytes]:
    """One answer's status line and body (framed by its Content-Length) from ``sock``;
    fails if the server closes the connection first."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536) or _closed()
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    length = next(int(line.split(b":")[1]) for line in lines if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        body += sock.recv(65536) or _closed()
    return lines[0], body


def _closed() -> bytes:
    raise AssertionError("the server closed the connection before its answer")
