"""Keeps a tritonserver and everything it starts together, so that they go together.

    python -m gateway.dev.keeper PID_FILE -- tritonserver ARGS...

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


def group_regions(group: int) -> set[str]:
    """The shared-memory regions named by the processes of process group ``group`` (read
    before a SIGKILL of the whole group, keeper included: nobody is left to clear them)."""
    return _shm_regions(_descendants(me=0, group=group))


def unlink_regions(regions: set[str]) -> None:
    for name in regions:
        with contextlib.suppress(FileNotFoundError):
            (SHM / name).unlink()


def _descendants(me: int | None = None, group: int | None = None) -> dict[int, list[str]]:
    """Every process in the keeper's process group or parented to it (orphans come here),
    but the keeper, with its command line."""
    me = os.getpid() if me is None else me
    group = os.getpgrp() if group is None else group
    found: dict[int, list[str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            stat = (entry / "stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()  # after "pid (comm) "
            parent, pgrp = int(fields[1]), int(fields[2])
            if pgrp == group or parent == me:
                found[int(entry.name)] = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
    return found


def _shm_regions(commands: dict[int, list[str]]) -> set[str]:
    return {
        arg for argv in commands.values() for arg in argv if arg.startswith(SHM_PREFIX) and "/" not in arg
    }


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


def clear(regions: set[str]) -> set[str]:
    """Kill and reap every process left, then remove their shared-memory regions; returns
    the regions (those seen now and ``regions``, seen earlier)."""
    regions = set(regions)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        left = _descendants()
        regions |= _shm_regions(left)
        if not left:
            break
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
        _reap()
    unlink_regions(regions)
    return regions


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m gateway.dev.keeper PID_FILE -- COMMAND...", file=sys.stderr)
        return 2
    pid_file, command = Path(argv[0]), argv[2:]
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
    regions: set[str] = set()
    code: int | None = None
    while code is None:
        regions |= _shm_regions(_descendants())  # while they run: a killed stub's name stays known
        code = _reap(triton.pid)  # and orphans that ended by themselves
        if code is None:
            if stopping and time.monotonic() > stopping[0]:
                os.kill(triton.pid, signal.SIGKILL)
            time.sleep(0.2)
    clear(regions)
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
