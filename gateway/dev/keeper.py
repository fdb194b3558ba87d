"""Keeps a tritonserver and everything it starts together, so that they go together.

    python -m gateway.dev.keeper PID_FILE SHM_PREFIX -- tritonserver ARGS...

The local launcher starts this in a session of its own, with the parent-death signal set
(``setpriv --pdeathsig TERM``): when the launcher goes, SIGKILL included, the keeper hears
SIGTERM. The keeper is a child subreaper (``PR_SET_CHILD_SUBREAPER``) and runs Triton in
its own process group, so the Python backend stubs Triton spawns stay in reach whatever
happens to Triton: orphaned, they become the keeper's children, not init's.

- SIGTERM or SIGINT: Triton is asked to stop (SIGINT: it unloads its models and ends its
  stubs), given ``GRACE_SECONDS``, then killed.
- Triton exits, by itself or killed (an OOM kill, a crash): whatever is left of it (stubs
  that ignore SIGTERM) is killed with SIGKILL and reaped, their shared-memory regions in
  /dev/shm removed, and the keeper exits with Triton's status (128 + signal when killed),
  which the launcher reports.

The regions are found by name: the launcher gives this Triton's Python backend a prefix of
its own (``--backend-config=python,shm-region-prefix-name=SHM_PREFIX``, see
:func:`region_prefix`), and every ``/dev/shm/SHM_PREFIX*`` is removed. (Reading the names
off the stubs' command lines, as before, missed a region Triton had made for a stub not yet
exec'd: a Triton killed while loading left 1 to 4 regions behind, every time.)

Standard library only; Linux (prctl). Triton's PID is written to PID_FILE for tools that
signal Triton alone (a hung-server test stops it with SIGSTOP).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36
GRACE_SECONDS = 10.0
SHM = Path("/dev/shm")
SHM_PREFIX = "triton_python_backend_shm_region_"


def _subreaper() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:  # pragma: no cover - Linux >= 3.4 has it
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")


def region_prefix(token: str) -> str:
    """The shared-memory prefix of one Triton: the Python backend's default followed by
    ``token``, so what looks for Triton's regions by the default still finds them."""
    return f"{SHM_PREFIX}{token}_"


def unlink_prefixed(prefix: str) -> set[str]:
    """Remove every region in /dev/shm named ``prefix...``; returns their names."""
    if not prefix.startswith(SHM_PREFIX) or "/" in prefix:
        raise ValueError(f"not a Triton region prefix: {prefix!r}")
    removed: set[str] = set()
    for path in SHM.glob(f"{prefix}*"):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed.add(path.name)
    return removed


def _descendants() -> set[int]:
    """Every process in the keeper's process group or parented to it (orphans come here),
    but the keeper."""
    me, group = os.getpid(), os.getpgrp()
    found: set[int] = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            stat = (entry / "stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
            parent, pgrp = int(fields[1]), int(fields[2])
            if pgrp == group or parent == me:
                found.add(int(entry.name))
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
    return found


def _reap(watched: int = 0) -> int | None:
    """Reap every child that has ended; the exit code of ``watched`` if it was one of them
    (negative: killed by that signal)."""
    code = None
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return code
        if pid == 0:
            return code
        if pid == watched:
            code = os.waitstatus_to_exitcode(status)


def clear(prefix: str) -> set[str]:
    """Kill and reap every process left, then remove the regions named ``prefix...``;
    returns their names."""
    deadline = time.monotonic() + 10
    while (left := _descendants()) and time.monotonic() < deadline:
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
        _reap()
    return unlink_prefixed(prefix)


def main(argv: list[str]) -> int:
    if len(argv) < 4 or argv[2] != "--" or not argv[1].startswith(SHM_PREFIX):
        print(
            f"usage: python -m gateway.dev.keeper PID_FILE {SHM_PREFIX}TOKEN_ -- COMMAND...", file=sys.stderr
        )
        return 2
    pid_file, prefix, command = Path(argv[0]), argv[1], argv[3:]
    _subreaper()
    stopping: list[float] = []
    started: list[int] = []

    def stop(signum: int, frame: object) -> None:
        if not stopping:
            stopping.append(time.monotonic() + GRACE_SECONDS)
            for pid in started:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGINT)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    # In this process group: the stubs it spawns are in it too. Reaped here, not by Popen.
    triton = subprocess.Popen(command)
    started.append(triton.pid)
    pid_file.write_text(f"{triton.pid}\n")
    if stopping:  # asked to stop before Triton was there to hear it
        os.kill(triton.pid, signal.SIGINT)
    code: int | None = None
    while code is None:
        code = _reap(triton.pid)  # and orphans that ended by themselves
        if code is None:
            if stopping and time.monotonic() > stopping[0]:
                os.kill(triton.pid, signal.SIGKILL)
            time.sleep(0.2)
    clear(prefix)
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
