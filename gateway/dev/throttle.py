"""Triton made slower: its process group stopped most of every few milliseconds.

Run as its own process (``python -m gateway.dev.throttle PGID RUNNING STOPPED``) by
:func:`gateway.dev.tritonserver.throttled`. A thread of the test's own process kept the
time badly: while the test's load generator held the interpreter, each sleep ended when
the thread next got it, so Triton ran 36-47 % of the time where 20 % was asked
(tests/integration/test_throttle.py; 18-26 % as a process), and by how busy the load
was, which differs between the flows a test compares."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time


def cycle(group: int, running: float, stopped: float) -> None:
    """Stop and continue ``group`` until SIGTERM; it is left running."""
    done = False

    def finish(signum: int, frame: object) -> None:
        nonlocal done
        done = True

    signal.signal(signal.SIGTERM, finish)
    with contextlib.suppress(PermissionError):  # (as root) woken first on a busy machine
        os.nice(-10)
    try:
        while not done:
            os.killpg(group, signal.SIGSTOP)
            time.sleep(stopped)
            os.killpg(group, signal.SIGCONT)
            time.sleep(running)
    except ProcessLookupError:  # the group is gone
        return
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(group, signal.SIGCONT)


def main(argv: list[str] | None = None) -> None:
    group, running, stopped = (argv or sys.argv[1:])[:3]
    cycle(int(group), float(running), float(stopped))


if __name__ == "__main__":
    main()
