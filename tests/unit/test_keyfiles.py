"""The key ring's settle rule: a keys file caught mid-rewrite is never taken (neither as a
refused file nor as a shorter set of keys); the complete file is."""

from __future__ import annotations

from pathlib import Path

import pytest

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


def test_a_certificates_line_has_no_key_and_a_keys_id_no_colon(tmp_path: Path) -> None:
    from gateway.errors import ConfigurationError
    from gateway.shared.keyfiles import find_key, parse_keys

    path = tmp_path / "keys"
    keys = parse_keys(f"cert:spiffe://ml/app - 5 tier=standard\npartner-a {hash_key('s')}\n", path)
    assert [k.id for k in keys] == ["cert:spiffe://ml/app", "partner-a"]
    assert keys[0].digest == b""
    assert keys[0].rate == 5
    for presented in (b"", b"-", b"s"):  # no presented value is the certificate's line
        assert find_key(keys, [(b"x-api-key", presented)]) in (None, keys[1])
    for line in (
        f"cert:partner-a {hash_key('s')}",  # a certificate's line takes no key
        "partner-a -",  # a key's line needs its hash
        f"idp:partner-a {hash_key('s')}",  # a key id holds no colon
        "cert:a/b c -",
    ):
        with pytest.raises(ConfigurationError):
            parse_keys(line + "\n", path)
