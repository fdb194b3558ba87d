"""The access log is written in batches; everything else at once, in order."""

from __future__ import annotations

import io
import logging
import time
from pathlib import Path

from gateway.observe.logs import BatchingHandler


def _handler(path: Path, seconds: float) -> BatchingHandler:
    stream = io.TextIOWrapper(open(path, "wb", buffering=64 * 1024), encoding="utf-8")  # noqa: SIM115
    handler = BatchingHandler(stream, seconds)
    handler.setFormatter(logging.Formatter("%(name)s %(message)s"))
    return handler


def _record(name: str, message: str, level: int = logging.INFO) -> logging.LogRecord:
    return logging.LogRecord(name, level, "", 0, message, (), None)


def test_access_lines_wait_for_the_interval(tmp_path: Path) -> None:
    path = tmp_path / "log"
    handler = _handler(path, 0.3)
    try:
        handler.handle(_record("gateway.access", "POST /classify 200"))
        assert path.read_text() == ""  # held in the buffer
        deadline = time.monotonic() + 5
        while not path.read_text() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert path.read_text() == "gateway.access POST /classify 200\n"
    finally:
        handler.close()


def test_any_other_line_writes_the_batch_before_it_in_order(tmp_path: Path) -> None:
    path = tmp_path / "log"
    handler = _handler(path, 60.0)
    try:
        handler.handle(_record("gateway.access", "one"))
        handler.handle(_record("gateway.access", "two"))
        handler.handle(_record("gateway.access", "refused", logging.WARNING))
        assert path.read_text().splitlines() == [
            "gateway.access one",
            "gateway.access two",
            "gateway.access refused",
        ]
        handler.handle(_record("gateway.access", "three"))
        handler.handle(_record("uvicorn.error", "Finished server process"))
        assert path.read_text().splitlines()[-2:] == [
            "gateway.access three",
            "uvicorn.error Finished server process",
        ]
    finally:
        handler.close()


def test_closing_writes_what_is_left(tmp_path: Path) -> None:
    path = tmp_path / "log"
    handler = _handler(path, 60.0)
    for number in range(1000):
        handler.handle(_record("gateway.access", f"line {number}"))
    handler.close()
    lines = path.read_text().splitlines()
    assert lines == [f"gateway.access line {n}" for n in range(1000)]


def test_the_time_stamp_is_loggings_own_across_seconds() -> None:
    from gateway.observe.logs import TEXT_FORMAT, EscapingFormatter

    ours, theirs = EscapingFormatter(TEXT_FORMAT), logging.Formatter(TEXT_FORMAT)
    for created in (1_800_000_000.001, 1_800_000_000.999, 1_800_000_001.5, 1_700_000_000.25):
        record = _record("gateway.access", "line")
        record.created, record.msecs = created, int((created - int(created)) * 1000)
        assert ours.format(record) == theirs.format(record)
