"""Shared fixtures. Integration fixtures (a real tritonserver) live in tests/integration."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import pytest

# The shared helpers (tests/helpers) importable as `helpers` from every test folder.
sys.path.insert(0, str(Path(__file__).parent))

# Fixtures starting a real tritonserver; nothing starts until a test asks for one.
pytest_plugins = ["helpers.triton_fixtures"]


TIERS = ("unit", "api", "integration", "e2e", "containers")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Each test carries the marker of its folder (tests/<tier>/...): `-m unit` is honest."""
    root = Path(__file__).parent
    for item in items:
        relative = Path(str(item.path)).relative_to(root)
        tier = relative.parts[0] if len(relative.parts) > 1 else ""
        if tier not in TIERS:
            raise pytest.UsageError(f"{relative}: a test lives in one of tests/{{{','.join(TIERS)}}}")
        item.add_marker(getattr(pytest.mark, tier))


SHM = Path("/dev/shm")
SHM_PATTERN = "triton_python_backend_shm_region_*"


def pytest_sessionstart(session: pytest.Session) -> None:
    # what was there before the suite (another Triton on the machine) is not the suite's
    session.config.stash[_SHM_BEFORE] = {path.name for path in SHM.glob(SHM_PATTERN)}


_SHM_BEFORE = pytest.StashKey[set[str]]()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """The suite leaves nothing running and no shared memory behind: once every fixture is
    torn down, any process started under the session's temporary directory, or any Triton
    shared-memory region made during the run, fails the run (and is killed or removed)."""
    import os
    import signal
    import time

    before = session.config.stash.get(_SHM_BEFORE, None)
    if before is not None and not os.environ.get("PYTEST_XDIST_WORKER"):
        deadline = time.monotonic() + 20  # a keeper still clearing gets to finish
        while (regions := {p.name for p in SHM.glob(SHM_PATTERN)} - before) and time.monotonic() < deadline:
            time.sleep(0.25)
        if regions:
            reporter = session.config.pluginmanager.get_plugin("terminalreporter")
            if reporter is not None:
                reporter.write_line(
                    f"{len(regions)} shared-memory region(s) made by the suite outlived it: {sorted(regions)[:5]}",
                    red=True,
                )
            for name in regions:
                with contextlib.suppress(FileNotFoundError):
                    (SHM / name).unlink()
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    factory = getattr(session.config, "_tmp_path_factory", None)
    if factory is None or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    base = factory.getbasetemp()
    deadline = time.monotonic() + 20  # what is shutting down gets to finish
    import psutil

    from helpers.support import processes_under

    # pytest itself, and what started it, name the folder when it was given (--basetemp)
    ours = {os.getpid(), *(parent.pid for parent in psutil.Process().parents())}

    def outliving() -> dict[int, str]:
        return {pid: command for pid, command in processes_under(base).items() if pid not in ours}

    while (left := outliving()) and time.monotonic() < deadline:
        time.sleep(0.25)
    if left:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        lines = "\n".join(f"  {pid}: {command[:300]}" for pid, command in left.items())
        message = f"{len(left)} process(es) started by the suite outlived it:\n{lines}"
        if reporter is not None:
            reporter.write_line(message, red=True)
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
