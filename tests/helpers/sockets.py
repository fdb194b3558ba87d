"""Raw sockets held against a door: when did the server close one."""

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
