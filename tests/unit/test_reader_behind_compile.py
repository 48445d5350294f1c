"""A first run reads kallsyms while bcc compiles (sources/ebpf/early.py): at nice 19 until
the compile is over, so that it does not take CPU from the compile the command waits for,
and at its own priority after, so that a command keeping every CPU busy cannot starve it
while the recording's first flush waits for it. Real threads and priorities (as root)."""
from __future__ import annotations

import os
import threading

import pytest

from memprof.sources.ebpf.early import _ReaderBehindCompile

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="only root lowers the reader (it must raise it again)")


def _own_nice() -> int:
    return os.getpriority(os.PRIO_PROCESS, 0)  # Linux: the calling thread's


def test_the_reader_runs_at_nice_19_until_the_compile_is_over_then_as_it_began():
    began = _own_nice()
    seen, compiled, checked = [], threading.Event(), threading.Event()

    def read():
        seen.append(_own_nice())
        assert compiled.wait(10)
        seen.append(_own_nice())
        checked.set()

    reader = _ReaderBehindCompile(read)
    thread = threading.Thread(target=reader.run)
    thread.start()
    while not seen:
        threading.Event().wait(0.001)
    reader.compile_over()
    compiled.set()
    assert checked.wait(10)
    thread.join(10)
    assert seen == [_ReaderBehindCompile.LOWEST, began]
    assert _own_nice() == began  # the test's own thread was never touched


def test_a_reader_that_starts_after_the_compile_is_never_lowered():
    seen = []
    reader = _ReaderBehindCompile(lambda: seen.append(_own_nice()))
    reader.compile_over()
    thread = threading.Thread(target=reader.run)
    thread.start()
    thread.join(10)
    assert seen == [_own_nice()]


def test_the_compile_ending_after_the_read_touches_no_thread():
    """The reader's thread id is forgotten when it ends: compile_over must not renice
    whatever thread (of this process or another) the kernel gives that id next."""
    reader = _ReaderBehindCompile(lambda: None)
    thread = threading.Thread(target=reader.run)
    thread.start()
    thread.join(10)
    assert reader._lowered_tid is None
    reader.compile_over()  # nothing to give back
