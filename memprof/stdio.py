"""Descriptors 0-2 that memprof was started without (a launcher that closed them: cron, a
daemon, `cmd >&-`). Imports nothing heavy: `cli/main.py` calls `reserve()` first of all."""
from __future__ import annotations

import os
import sys

CLOSED: tuple[int, ...] = ()  # which of 0, 1, 2 were closed when memprof started


def reserve() -> None:
    """Open /dev/null on each of 0-2 that is closed, and remember which (CLOSED).

    Otherwise the first file memprof opened would take that number, and the command it
    records would inherit it as its stdin, stdout or stderr: a file root opened (a part of
    the recording, a cache entry) for the user's program to write. Python also leaves
    sys.stdout or sys.stderr None then, which the console cannot write to (memprof stopped
    before running the command). The command gets those descriptors closed again, as it
    would without memprof (capture/target.py)."""
    global CLOSED
    closed = tuple(fd for fd in (0, 1, 2) if not _is_open(fd))
    for fd in closed:
        null = os.open(os.devnull, os.O_RDWR)
        if null != fd:
            os.dup2(null, fd, inheritable=True)
            os.close(null)
    CLOSED = closed
    if sys.stdout is None:
        sys.stdout = open(os.devnull, "w")
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w")


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True
