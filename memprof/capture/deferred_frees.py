"""The kernel's deferred frees after the recorded tree exits: wait for them, not for silence.

A process's exit hands much of what it held to RCU: files, sockets, inodes, dentries, the
task itself are freed by callbacks after a grace period, later on a loaded machine, and up
to seconds later where the kernel batches callbacks lazily (rcutree.enable_rcu_lazy on
CPUs whose callbacks are offloaded; this project's VM has the parameter set and no such
CPU). The recorder must see those frees, or it reports memory the exit released as memory
that outlived the process: a kernel leak, and a false one. It used to listen 0.3 s from the
exit and on until 0.2 s passed without such a free, a guess: the last came 101-161 ms after
a torch process's exit here (bench/RESULTS.md).

`rcu_barrier()` returns once every RCU callback queued before it has run, lazy ones
included. The kernel offers it to root as the rcutree module's `do_rcu_barrier` parameter
(written, it calls rcu_barrier() in the writer). The kernel throttles those calls, whoever
asks: the parameter's first version allowed one a second, and here two writes right after a
first took 75-76 ms each, so a recorder that ends just after another may wait; the session
stops waiting at TEARDOWN_MAX_S whatever the barrier does. `RcuBarrier` writes it on a
thread of its own, begun when the tree's exit is seen, so the recorder's loop drains the
ring buffer meanwhile. kfree_rcu()'s batches are not RCU callbacks, and the barrier may not
wait for them: the quiet after it stays. Where the parameter is missing (an older kernel, a
sysfs mounted read-only) the session keeps the old wait. The parameter is the kernel's own
file in /sys, which no user controls.
"""
from __future__ import annotations

import os
import threading
import time

from memprof.quiet_threads import start_quiet

DO_RCU_BARRIER = "/sys/module/rcutree/parameters/do_rcu_barrier"


class RcuBarrier:
    """One rcu_barrier(), asked on a thread from construction. `ended_s` is when it returned
    (time.monotonic() seconds), None while it runs or where it could not be asked (`error`
    then says why)."""

    def __init__(self, path: str = DO_RCU_BARRIER) -> None:
        self.began_s = time.monotonic()
        self.ended_s: float | None = None
        self.error: str | None = None
        self._path = path
        # A daemon: the recorder leaves with os._exit once finalized, and a barrier the kernel
        # still runs must not hold it (the teardown stops waiting at TEARDOWN_MAX_S).
        start_quiet(threading.Thread(target=self._run, name="memprof-rcu-barrier", daemon=True))

    def _run(self) -> None:
        try:
            fd = os.open(self._path, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                os.write(fd, b"1")
            finally:
                os.close(fd)
        except OSError as e:
            self.error = f"{self._path}: {e.strerror or e}"
            return
        self.ended_s = time.monotonic()

    def drained_by(self, poll_s: float) -> bool:
        """Whether the barrier had returned by `poll_s` (time.monotonic() seconds), so that a
        drain of the ring buffer begun then holds every free its callbacks made."""
        return self.ended_s is not None and self.ended_s <= poll_s

    def detail(self) -> dict:
        """meta.json's account of it: when it began and returned (CLOCK_MONOTONIC ns, the
        events' clock), or why it did not."""
        ended = {"rcu_barrier_ended_ns": int(self.ended_s * 1e9)} if self.ended_s is not None else {
            "rcu_barrier_error": self.error or "still running when the recording stopped"}
        return {"rcu_barrier_began_ns": int(self.began_s * 1e9), **ended}
