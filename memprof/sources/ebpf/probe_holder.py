"""Detach bcc's perf-event probes without waiting for the kernel: a forked holder makes the
last close of each, after `record` has let go of its own copies.

Closing the last reference to a perf event (a tracepoint, a uprobe) waits out RCU grace
periods in the kernel, 60-110 ms each here, and the kernel serializes them (event_mutex):
the process probes' detach took 0.40-0.44 s after a torch command's exit, 0.11-0.14 s of it
after the teardown's 0.3 s grace (bench/RESULTS.md). A perf event's file is shared by fork,
so a forked child that holds the descriptors turns the recorder's closes into plain
reference drops; the child, which nobody waits for, pays the waits. bcc's close disables
each event first (PERF_EVENT_IOC_DISABLE), but a tracepoint's program stays in its
tracepoint's program array until the last close: until the holder exits (0.5-0.8 s after
`record` returns, here) memprof's programs may still run, as during the recording, and find
no tracked process; what they write to the ring buffer nobody reads.

The holder is a fork, not an executed helper, so that root runs no program by path; it
calls only os functions (no lock another thread of the recorder could have held at the
fork) and closes every other descriptor first, so that it keeps neither the kmem probes,
nor the maps, nor the recording's files. It also holds the kmem tracepoints' links, whose
closes took 56-67 ms of `stop()` (a tracepoint's unregistering patches kernel text), and
closes them once the recorder has closed its own copies at the end of the teardown; until
then the recorder still reads their events.
"""
from __future__ import annotations

import os
import warnings

from memprof.sources.ebpf.forked import close_all_but, reap_behind

HOLDER_ENV = "MEMPROF_PROBE_HOLDER"  # "0": close in the recorder, as before (benches compare)


class Holder:
    """A forked process holding two groups of descriptors: it closes the `first` at
    `release_first()`, the `later` at `release_later()` (or when the recorder dies: the
    pipe it waits on reads EOF), then exits. Reaped by a daemon thread, so that an
    in-process caller collects no zombie."""

    def __init__(self, pid: int, go: int):
        self.pid = pid
        self._go = go  # the write end of the pipe the holder waits on
        reap_behind(pid, "memprof-holder-reap")

    def release_first(self) -> None:
        """The recorder's copies of the first group are closed: the holder closes its own."""
        if self._go >= 0:
            try:
                os.write(self._go, _FIRST)
            except BrokenPipeError:  # the holder was killed: its exit closed its copies already
                pass

    def release_later(self) -> None:
        """The recorder's copies of the later group are closed too: the holder closes the rest."""
        if self._go >= 0:
            os.close(self._go)
            self._go = -1


_FIRST = b"1"


def hold(first: list[int], later: list[int] = ()) -> Holder | None:
    """A forked holder of `first` and `later` (each open in this process), or None when the
    holder is off (MEMPROF_PROBE_HOLDER=0), there is nothing to hold, or fork failed
    (EAGAIN, ENOMEM): the caller then closes them itself, waiting as before."""
    if not (first or later) or os.environ.get(HOLDER_ENV, "1") == "0":
        return None
    wait_end, go_end = os.pipe()
    try:
        with warnings.catch_warnings():
            # Python 3.12+ warns of fork in a threaded process: past the interpreter's own
            # at-fork handlers the child here makes only os calls (module docstring), so it
            # takes no lock another thread may have held.
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
    except OSError:
        os.close(wait_end)
        os.close(go_end)
        return None
    if pid == 0:
        _holder(wait_end, list(first), list(later))  # never returns
    os.close(wait_end)
    return Holder(pid, go_end)


def _holder(wait_end: int, first: list[int], later: list[int]) -> None:
    """The forked child: keep only its groups and the pipe's read end; close `first` once
    the recorder says so (or the pipe reads EOF), `later` at EOF; exit. The closes are the
    final ones, which wait."""
    try:
        close_all_but([wait_end, *set(first) | set(later)])
        said = os.read(wait_end, 1)
        for fd in first:
            os.close(fd)
        while said:
            said = os.read(wait_end, 1)
        for fd in later:
            if fd not in first:
                os.close(fd)
    finally:
        os._exit(0)

