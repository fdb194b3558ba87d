"""`make models-examples` builds the examples in two builds side by side: between them they
name every example deploy/model-build/build.py knows, each once (one left out would never
be built, and the tests that add it would fail far from the cause)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _examples_in_build_py() -> list[str]:
    tree = ast.parse((ROOT / "deploy/model-build/build.py").read_text())
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and node.target.id == "EXAMPLES"
            and isinstance(node.value, ast.Dict)
        ):
            return [ast.literal_eval(key) for key in node.value.keys if key is not None]
    raise AssertionError("build.py has no EXAMPLES dict")


def _make_list(name: str) -> list[str]:
    found = re.search(rf"^{name} := (.*)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert found, f"the Makefile sets no {name}"
    return found.group(1).split()


def test_the_two_example_builds_name_every_example_once() -> None:
    named = _make_list("EXAMPLES_APART") + _make_list("EXAMPLES_REST")
    assert sorted(named) == sorted(_examples_in_build_py())
    assert len(named) == len(set(named))
