"""Threads of `record` that never take the signals it passes on to its command.

`record` takes SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 synchronously in its
loop (capture/session.py) and passes each on to the command, unless the terminal sent it to
both. But the kernel hands a process's signal to any thread that does not block it, and a
thread inherits its creator's mask: a thread started before the loop blocks them (the
compile, the program loads behind it, the symbol prewarm) took such a signal while it
still ran, after the command had started. CPython then runs the handler in the main
thread, where who sent the signal cannot be told, so it was not passed on: a SIGINT sent to
`record` by a script left the command running to its end (tests/integration/
test_record_robustness.py failed 1-4 times in 8 so). `start_quiet` starts a thread with
those signals blocked from its first instruction.
"""
from __future__ import annotations

import signal
import threading

FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def start_quiet(thread: threading.Thread) -> threading.Thread:
    """Start `thread` with FORWARDED_SIGNALS and SIGCHLD blocked in it; returns it."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED_SIGNALS + (signal.SIGCHLD,))
    try:
        thread.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)
    return thread
