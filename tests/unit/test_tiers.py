"""The test tiers tell the truth: what runs in tests/unit and tests/api starts no process
of its own (no subprocess, redis-server, Triton or gateway process, no chattr); those
tests live in tests/integration (a real Triton) or tests/e2e (other programs)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
# what starting a process looks like in a test module: the modules, the classes, the fixtures
PROCESS_MODULES = {"subprocess", "multiprocessing"}
PROCESS_NAMES = {"RedisServer", "GatewayProcess", "TritonServer", "triton", "spawn_gateway"}


def _starts_processes(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name in PROCESS_MODULES}
        elif isinstance(node, ast.ImportFrom) and node.module:
            if node.module in PROCESS_MODULES:
                found.add(node.module)
            found |= {alias.name for alias in node.names if alias.name in PROCESS_NAMES}
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            found |= {arg.arg for arg in node.args.args if arg.arg in PROCESS_NAMES}  # fixtures
    return found


@pytest.mark.parametrize(
    "path",
    sorted(
        [
            *(TESTS / "unit").glob("test_*.py"),
            *(TESTS / "api").glob("test_*.py"),
            *(TESTS / "api").glob("conftest.py"),
        ]
    ),
    ids=lambda p: f"{p.parent.name}/{p.name}",
)
def test_fast_tiers_start_no_process(path: Path) -> None:
    assert _starts_processes(path) == set()


def test_the_check_sees_a_process(tmp_path: Path) -> None:
    sample = tmp_path / "test_sample.py"
    sample.write_text(
        "import subprocess\nfrom gateway.dev.redisserver import RedisServer\n\n"
        "def test_x(triton):\n    subprocess.run(['true'])\n"
    )
    assert _starts_processes(sample) == {"subprocess", "RedisServer", "triton"}
