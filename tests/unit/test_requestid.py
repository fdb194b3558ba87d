"""X-Request-ID values are accepted only when safe to log and forward."""

from __future__ import annotations

import pytest

from gateway.http.requestid import accept_or_generate


@pytest.mark.parametrize("good", ["abc", "0f5c2d1e-9b7a", "trace:1.2_3", "a" * 128])
def test_well_formed_ids_are_kept(good: str) -> None:
    assert accept_or_generate(good) == good


@pytest.mark.parametrize("bad", [None, "", "has space", "a" * 129, 'quote"', "new\nline", "-leading"])
def test_others_are_replaced(bad: str | None) -> None:
    generated = accept_or_generate(bad)
    assert generated != bad
    assert len(generated) == 32
    assert accept_or_generate(generated) == generated
