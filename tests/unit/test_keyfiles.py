"""The key ring's settle rule: a keys file caught mid-rewrite is never taken (neither as a
refused file nor as a shorter set of keys); the complete file is."""

from __future__ import annotations

from pathlib import Path

from gateway.shared.keyfiles import KeyRing, hash_key


def line(key_id: str) -> str:
    return f"{key_id} {hash_key(key_id + '-secret')}\n"


def test_a_file_caught_mid_rewrite_is_left_for_the_next_check(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text(line("a") + line("b"))
    ring = KeyRing(path, "api")
    # the rewrite has written its first line only when the ring looks: a valid, shorter file
    path.write_text(line("c"))
    partial = ring.changed()
    assert partial is not None
    path.write_text(line("c") + line("d"))  # the writer finishes before the second read
    assert ring.check(expected=partial) is False
    assert [key.id for key in ring.keys] == ["a", "b"]  # never the partial set
    complete = ring.changed()
    assert complete is not None
    assert ring.check(expected=complete) is True
    assert [key.id for key in ring.keys] == ["c", "d"]
    assert ring.changed() is None  # taken: nothing new
