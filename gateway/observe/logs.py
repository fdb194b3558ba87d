"""Logging set-up for the CLI: plain text or one JSON object a line."""

from __future__ import annotations

import logging
import re
import sys
import threading
import time

from pythonjsonlogger.orjson import OrjsonFormatter

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# C0 and C1 control characters: a client's path or header with an ESC or a newline in a
# text log could forge lines or drive a terminal. The JSON format escapes them already.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def escape_controls(text: str) -> str:
    """``text`` with every control character written as a ``\\xNN`` escape."""
    return _CONTROL.sub(lambda match: f"\\x{ord(match.group()):02x}", text)


class EscapingFormatter(logging.Formatter):
    """The text format with control characters escaped in the message (tracebacks, which
    the gateway writes, keep their line breaks)."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        return escape_controls(super().formatMessage(record))


class Sampler:
    """At most ``per_second`` lines a second for each key; what is held back is counted and
    reported with the next line let through, so the log volume is not the client's to choose."""

    def __init__(self, per_second: int) -> None:
        self._per_second = per_second
        self._lock = threading.Lock()
        self._windows: dict[str, tuple[int, int, int]] = {}  # key -> (second, let through, held back)

    def admit(self, key: str) -> tuple[bool, int]:
        """Whether to write this line, and how many were held back before it."""
        now = int(time.monotonic())
        with self._lock:
            second, passed, held = self._windows.get(key, (now, 0, 0))
            if second != now:
                second, passed = now, 0
            if passed < self._per_second:
                self._windows[key] = (second, passed + 1, 0)
                return True, held
            self._windows[key] = (second, passed, held + 1)
            return False, 0


def configure_logging(level: str, fmt: str) -> None:
    """Root handler on stderr; uvicorn's loggers propagate to it (its access log is off:
    the gateway writes its own, with the request id, route, model and duration)."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(
            OrjsonFormatter(  # orjson: the access log line is written on every request
                "%(asctime)s %(levelname)s %(name)s %(message)s",
                rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
            )
        )
    else:
        handler.setFormatter(EscapingFormatter(TEXT_FORMAT))
    # The formats use none of these: a record skips finding its caller's file and line,
    # its thread and its process (the logging HOWTO's "Optimization"; the access log line
    # is written on every request).
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
