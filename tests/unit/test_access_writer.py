"""The access log's direct writer writes the bytes logging's formatter would, and only
while nothing else listens."""

from __future__ import annotations

import io
import logging
import time
from pathlib import Path

import pytest

from gateway.observe.logs import AccessWriter, BatchingHandler, log_formatter

MESSAGE = "GRPC /inference.GRPCInferenceService/ModelInfer 200 1.2 ms request_id=id\x1b[2J\nforged"
FIELDS = {
    "request_id": "id\x1b[2J\nforged",
    "trace_id": "",
    "method": "GRPC",
    "route": "/inference.GRPCInferenceService/ModelInfer",
    "path": "/inference.GRPCInferenceService/ModelInfer",
    "status": 200,
    "model": "text_trivial",
    "duration_ms": 1.234,
    "body_bytes": 52,
}


def _handler(path: Path, fmt: str) -> BatchingHandler:
    stream = io.TextIOWrapper(open(path, "wb"), encoding="utf-8")  # noqa: SIM115
    handler = BatchingHandler(stream, 60)
    handler.setFormatter(log_formatter(fmt))
    return handler


@pytest.mark.parametrize("fmt", ["text", "json"])
@pytest.mark.parametrize("now", [1_790_000_000.0, 1_790_000_000.4567, 1_790_000_059.9999])
def test_the_writer_writes_what_logging_would(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fmt: str, now: float
) -> None:
    monkeypatch.setattr(time, "time", lambda: now)
    path = tmp_path / "log"
    handler = _handler(path, fmt)
    record = logging.LogRecord("gateway.access", logging.INFO, "", 0, MESSAGE, None, None)
    record.__dict__.update(FIELDS)
    handler.handle(record)
    AccessWriter(handler, json=fmt == "json").write(MESSAGE, FIELDS)
    handler.close()
    logged, written = path.read_text().splitlines()
    assert written == logged
    assert "\x1b" not in written  # escaped
    assert "forged" in written  # on the same line


def test_the_writer_stands_aside_while_another_handler_listens(tmp_path: Path) -> None:
    root = logging.getLogger()
    saved = root.handlers[:]
    handler = _handler(tmp_path / "log", "text")
    try:
        root.handlers[:] = [handler]
        writer = AccessWriter(handler, json=False)
        assert writer.applies()
        extra = logging.StreamHandler(io.StringIO())
        root.addHandler(extra)  # a test's capture, an operator's second handler
        assert not writer.applies()
        root.removeHandler(extra)
        access = logging.getLogger("gateway.access")
        access.addHandler(extra)
        assert not writer.applies()
        access.removeHandler(extra)
        handler.addFilter(lambda record: False)
        assert not writer.applies()
    finally:
        root.handlers[:] = saved
        handler.close()
