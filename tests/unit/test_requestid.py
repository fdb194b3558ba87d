"""X-Request-ID values are accepted only when safe to log and forward."""

from __future__ import annotations

import pytest

from gateway.serving.caller import accept_or_generate


@pytest.mark.parametrize("good", ["abc", "0f5c2d1e-9b7a", "trace:1.2_3", "a" * 128])
def test_well_formed_ids_are_kept(good: str) -> None:
    assert accept_or_generate(good) == good


@pytest.mark.parametrize("bad", [None, "", "has space", "a" * 129, 'quote"', "new\nline", "-leading"])
def test_others_are_replaced(bad: str | None) -> None:
    generated = accept_or_generate(bad)
    assert generated != bad
    assert len(generated) == 32
    assert accept_or_generate(generated) == generated


def test_control_characters_are_escaped_in_text_logs() -> None:
    import logging

    from gateway.observe.logs import TEXT_FORMAT, EscapingFormatter

    record = logging.LogRecord(
        "gateway", logging.WARNING, "", 0, "GET %s -> 404", ("/a\x1b[2Jb\nFORGED",), None
    )
    line = EscapingFormatter(TEXT_FORMAT).format(record)
    assert "\x1b" not in line
    assert "\n" not in line
    assert "/a\\x1b[2Jb\\x0aFORGED" in line


def test_refusal_lines_are_sampled_and_the_rest_counted() -> None:
    from gateway.observe.logs import Sampler

    sampler = Sampler(per_second=3)
    verdicts = [sampler.admit("unauthorized") for _ in range(50)]
    assert sum(written for written, _ in verdicts) <= 6  # 3 a second (the test may cross one boundary)
    assert sampler.admit("not-found") == (True, 0)  # each problem type has its own budget
