"""Logging set-up for the CLI: plain text or one JSON object a line."""

from __future__ import annotations

import logging
import sys

from pythonjsonlogger.orjson import OrjsonFormatter

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


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
        handler.setFormatter(logging.Formatter(TEXT_FORMAT))
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
