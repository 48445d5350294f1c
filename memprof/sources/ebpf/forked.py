"""What memprof's forked helpers share (probe_holder.py's holder, compile_child.py's
compilers): a child that keeps only the descriptors it needs, and a parent that reaps it
without waiting for it."""
from __future__ import annotations

import os
import threading


def close_all_but(keep: list[int]) -> None:
    """Close every descriptor of this process except `keep`. An empty range is never asked
    for: CPython 3.11's os.closerange(0, 0) calls close_range(0, -1), which the kernel reads
    as "from 0 to the last" and closes everything (so keeping fd 0 closed all)."""
    low = 0
    for fd in sorted(set(keep)):
        if low < fd:
            os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, os.sysconf("SC_OPEN_MAX"))


def reap_behind(pid: int, name: str) -> None:
    """Reap child `pid` on a daemon thread called `name`, so that no zombie is left and no caller waits."""
    threading.Thread(target=_reap, args=(pid,), name=name, daemon=True).start()


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, 0)
    except ChildProcessError:  # reaped by someone else (a caller waiting for any child)
        pass
