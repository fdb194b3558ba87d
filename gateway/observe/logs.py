"""Logging set-up for the CLI: plain text or one JSON object a line, on stderr.

The access log (one line a call, on every door) is written in batches: a line each call
cost a write to stderr of its own, about a third of what the line costs (0.03 ms of a
gRPC call's 0.9). Its lines wait in a buffer for at most ``flush_seconds``; any other
line (startup, a warning, uvicorn's last words before it exits) is written at once, with
every access line before it, so the log keeps its order. A process killed with SIGKILL
loses at most the last ``flush_seconds`` of its access log; one that exits (SIGTERM's
drain included) loses nothing.

While that batching handler is the root's only handler and nothing else listens to the
access logger, an access line skips logging's machinery (:class:`AccessWriter`: the
record, the logger's and handler's checks, the formatter's calls), which cost about
three quarters of the line; it is written with the same bytes the formatter would give.
"""

from __future__ import annotations

import io
import logging
import re
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

from pythonjsonlogger.orjson import OrjsonFormatter

from gateway import jsoncodec

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# C0 and C1 control characters: a client's path or header with an ESC or a newline in a
# text log could forge lines or drive a terminal. The JSON format escapes them already.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def escape_controls(text: str) -> str:
    """``text`` with every control character written as a ``\\xNN`` escape."""
    if _CONTROL.search(text) is None:  # nearly every line: a search costs a sixth of a sub
        return text
    return _CONTROL.sub(lambda match: f"\\x{ord(match.group()):02x}", text)


class _Stamps:
    """``asctime`` as logging's default format writes it, the date and time made once a
    second (not once a line: the access log writes one a call). Callers hold the
    handler's lock."""

    def __init__(self) -> None:
        self._second = -1
        self._stamp = ""

    def __call__(self, created: float) -> str:
        second = int(created)
        if second != self._second:
            self._stamp = time.strftime(logging.Formatter.default_time_format, time.localtime(created))
            self._second = second
        # logging's default_msec_format, with the milliseconds a LogRecord computes
        return f"{self._stamp},{int((created - second) * 1000):03d}"


class _StampEachSecond(logging.Formatter):
    """A formatter whose ``asctime`` is made by :class:`_Stamps`."""

    _stamps: _Stamps | None = None

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802
        if datefmt is not None or self.converter is not time.localtime:
            return super().formatTime(record, datefmt)
        if self._stamps is None:
            self._stamps = _Stamps()
        return self._stamps(record.created)


class EscapingFormatter(_StampEachSecond):
    """The text format with control characters escaped in the message (tracebacks, which
    the gateway writes, keep their line breaks)."""

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 (logging's name)
        return escape_controls(super().formatMessage(record))


class JsonFormatter(_StampEachSecond, OrjsonFormatter):
    """One JSON object a line (orjson: the access log writes one a call)."""


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


ACCESS_LOGGER = "gateway.access"
BATCHED = frozenset({ACCESS_LOGGER})


class BatchingHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A stream handler that leaves the lines of the :data:`BATCHED` loggers (below
    WARNING) in its stream's buffer, and a daemon thread that flushes it every
    ``flush_seconds``; every other line flushes it at once (a buffer that fills is
    written on its own). ``close`` stops the thread and writes what is left."""

    def __init__(self, stream: io.TextIOWrapper, flush_seconds: float) -> None:
        super().__init__(stream)
        self._seconds = flush_seconds
        self._closed = threading.Event()
        self._flusher = threading.Thread(target=self._flush_often, name="log flusher", daemon=True)
        self._flusher.start()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.stream.write(self.format(record) + self.terminator)
            if record.name not in BATCHED or record.levelno >= logging.WARNING:
                self.flush()
        except RecursionError:
            raise
        except Exception:
            self.handleError(record)

    def close(self) -> None:
        self._closed.set()
        if self._flusher is not threading.current_thread():
            self._flusher.join()
        self.flush()
        super().close()

    def _flush_often(self) -> None:
        while not self._closed.wait(self._seconds):
            self.flush()


class AccessWriter:
    """Writes access lines into a :class:`BatchingHandler`'s stream without a LogRecord:
    the line :data:`TEXT_FORMAT` (through :class:`EscapingFormatter`) or the JSON
    formatter of :func:`configure_logging` would write for the record ``Logger.info``
    makes, byte for byte. :meth:`applies` says whether logging would write it there alone."""

    def __init__(self, handler: BatchingHandler, json: bool) -> None:
        self._handler = handler
        self.json = json  # JSON lines, which carry the fields; else text, which does not
        self._stamps = _Stamps()
        self._root = logging.getLogger()
        self._logger = logging.getLogger(ACCESS_LOGGER)

    def applies(self) -> bool:
        """Whether the handler is the only one an access line reaches, with no filter on
        the way (a test's capture, an operator's extra handler: then logging writes it)."""
        handlers = self._root.handlers
        logger = self._logger
        return (
            len(handlers) == 1
            and handlers[0] is self._handler
            and not logger.handlers
            and not logger.filters
            and not self._root.filters
            and not self._handler.filters
            and logger.propagate
            and logger.disabled is False
        )

    def write(self, message: str, fields: Mapping[str, Any]) -> None:
        """One INFO line with ``message`` and, in JSON, ``fields`` after the standard ones."""
        handler = self._handler
        with handler.lock:  # type: ignore[union-attr]  # a Handler's lock exists once created
            stamp = self._stamps(time.time())
            if self.json:
                line = jsoncodec.dumps(
                    {"time": stamp, "level": "INFO", "logger": ACCESS_LOGGER, "message": message, **fields}
                ).decode()
            else:
                line = f"{stamp} INFO {ACCESS_LOGGER}: {escape_controls(message)}"
            try:
                handler.stream.write(line + handler.terminator)
            except Exception:  # what Handler.handleError would print, without a record
                if logging.raiseExceptions:
                    raise


_access_writer: AccessWriter | None = None


def access_writer() -> AccessWriter | None:
    """The configured :class:`AccessWriter` when it applies now, else None (then the
    caller logs through ``logging``)."""
    writer = _access_writer
    return writer if writer is not None and writer.applies() else None


def flush_logs() -> None:
    """Write out what the root's handlers hold (before a process ends without its exit
    handlers: a signal raised again, ``os._exit``)."""
    for handler in logging.getLogger().handlers:
        handler.flush()


def _buffered_stderr() -> io.TextIOWrapper | None:
    """stderr's descriptor behind a buffer of its own (Python's stderr writes each line
    at once), or None when stderr has no descriptor (replaced, as under a test runner)."""
    try:
        descriptor = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return None
    raw = open(descriptor, "wb", buffering=64 * 1024, closefd=False)  # noqa: SIM115 (lives with the process)
    return io.TextIOWrapper(raw, encoding="utf-8", errors="backslashreplace", write_through=False)


def log_formatter(fmt: str) -> logging.Formatter:
    """The formatter of the ``json`` or the text format."""
    if fmt == "json":
        return JsonFormatter(
            "%(asctime)s %(levelname)s %(name)s %(message)s",
            rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
        )
    return EscapingFormatter(TEXT_FORMAT)


def configure_logging(level: str, fmt: str, flush_seconds: float = 0.0) -> None:
    """Root handler on stderr; uvicorn's loggers propagate to it (its access log is off:
    the gateway writes its own, with the request id, route, model and duration). With
    ``flush_seconds``, the access log's lines are written in batches at most that far
    apart (the module docstring)."""
    stream = _buffered_stderr() if flush_seconds > 0 else None
    handler: logging.StreamHandler = (  # type: ignore[type-arg]
        logging.StreamHandler(sys.stderr) if stream is None else BatchingHandler(stream, flush_seconds)
    )
    handler.setFormatter(log_formatter(fmt))
    # The formats use none of these: a record skips finding its caller's file and line,
    # its thread and its process (the logging HOWTO's "Optimization"; the access log line
    # is written on every request).
    logging._srcfile = None
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False
    global _access_writer
    _access_writer = (
        AccessWriter(handler, json=fmt == "json") if isinstance(handler, BatchingHandler) else None
    )
    root = logging.getLogger()
    for replaced in root.handlers:
        if isinstance(replaced, BatchingHandler):  # its thread stops, its lines are written
            replaced.close()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
