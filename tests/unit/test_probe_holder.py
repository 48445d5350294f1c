"""probe_holder: a forked process keeps descriptors open after the recorder closes its own
copies, and closes them when told, so that the recorder never makes a perf event's last
close (which waits out RCU grace periods in the kernel). Real fork, real pipes: a pipe's
read end sees EOF only once every copy of its write end is closed, which tells from the
outside whether the holder still holds one."""
from __future__ import annotations

import os
import select
import signal
import time

from memprof.sources.ebpf import probe_holder


def eof_within(read_end: int, seconds: float) -> bool:
    """Whether `read_end` reads EOF within `seconds` (no writer is left anywhere)."""
    ready, _, _ = select.select([read_end], [], [], seconds)
    return bool(ready) and os.read(read_end, 1) == b""


def test_the_holder_keeps_each_group_open_until_it_is_released():
    first_r, first_w = os.pipe()
    later_r, later_w = os.pipe()
    holder = probe_holder.hold([first_w], later=[later_w])
    assert holder is not None
    os.close(first_w)
    os.close(later_w)  # the recorder's copies: now only the holder's remain
    assert not eof_within(first_r, 0.3) and not eof_within(later_r, 0.01)
    holder.release_first()
    assert eof_within(first_r, 5)
    assert not eof_within(later_r, 0.3)  # the later group outlives the first release
    holder.release_later()
    assert eof_within(later_r, 5)
    for fd in (first_r, later_r):
        os.close(fd)


def test_the_holder_keeps_nothing_else_open_and_is_reaped():
    other_r, other_w = os.pipe()  # open in this process when the holder forks, in no group
    held_r, held_w = os.pipe()
    holder = probe_holder.hold([held_w])
    os.close(other_w)
    assert eof_within(other_r, 5)  # the holder closed its copy at once
    os.close(held_w)
    holder.release_first()
    holder.release_later()
    assert eof_within(held_r, 5)
    deadline = time.monotonic() + 5
    while os.path.exists(f"/proc/{holder.pid}") and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not os.path.exists(f"/proc/{holder.pid}")  # exited and reaped: no zombie left
    for fd in (other_r, held_r):
        os.close(fd)


def test_the_holder_lets_go_when_the_recorder_closes_the_pipe_without_a_word():
    """A recorder that never says release_first (it died, or stopped early) closes the pipe
    at its exit: the holder closes both groups."""
    first_r, first_w = os.pipe()
    later_r, later_w = os.pipe()
    holder = probe_holder.hold([first_w], later=[later_w])
    os.close(first_w)
    os.close(later_w)
    holder.release_later()  # EOF alone, as at the recorder's exit
    assert eof_within(first_r, 5) and eof_within(later_r, 5)
    for fd in (first_r, later_r):
        os.close(fd)


def test_a_holder_holds_the_later_group_alone():
    """A command with no uprobe (`record -- true`) leaves the kmem tracepoints' links alone
    to hold: the holder still closes them, not the recorder (whose closes wait)."""
    later_r, later_w = os.pipe()
    holder = probe_holder.hold([], later=[later_w])
    assert holder is not None
    os.close(later_w)
    holder.release_first()
    assert not eof_within(later_r, 0.3)
    holder.release_later()
    assert eof_within(later_r, 5)
    os.close(later_r)


def test_no_holder_when_turned_off_or_with_nothing_to_hold(monkeypatch):
    r, w = os.pipe()
    assert probe_holder.hold([]) is None and probe_holder.hold([], later=[]) is None
    monkeypatch.setenv(probe_holder.HOLDER_ENV, "0")
    assert probe_holder.hold([w]) is None
    os.close(w)
    assert eof_within(r, 1)  # nothing forked that kept it
    os.close(r)


def test_a_failed_fork_leaves_no_descriptor_behind(monkeypatch):
    def refuse():
        raise BlockingIOError(11, "Resource temporarily unavailable")
    monkeypatch.setattr(probe_holder.os, "fork", refuse)
    before = set(os.listdir("/proc/self/fd"))
    assert probe_holder.hold([0]) is None
    assert set(os.listdir("/proc/self/fd")) == before


def test_a_killed_holder_makes_its_release_a_no_op():
    """Its exit closed its copies; the recorder must not fail on the pipe it leaves."""
    r, w = os.pipe()
    holder = probe_holder.hold([w])
    os.close(w)
    os.kill(holder.pid, signal.SIGKILL)
    assert eof_within(r, 5)  # the kernel closed the holder's copy at its death
    holder.release_first()  # EPIPE inside, not raised
    holder.release_later()
    os.close(r)


def test_a_forked_helper_keeps_exactly_what_it_is_told_fd_0_and_neighbours_included():
    """forked.close_all_but: os.closerange(0, 0) in CPython 3.11 closes every descriptor, so
    keeping fd 0 (compile_child.py keeps 0-2 on /dev/null) must not ask for that range."""
    import socket
    from memprof.sources.ebpf.forked import close_all_but
    ours, theirs = socket.socketpair()
    kept = theirs.fileno()
    spare = os.open(os.devnull, os.O_RDONLY)
    pid = os.fork()
    if pid == 0:
        try:  # the child never returns into pytest, whatever fails
            close_all_but([0, 1, 2, theirs.fileno()])
            theirs.sendall(" ".join(sorted(os.listdir("/proc/self/fd"), key=int)).encode())
        finally:
            os._exit(0)
    theirs.close()
    os.close(spare)
    seen = ours.recv(4096).decode().split()
    os.waitpid(pid, 0)
    # 0-2, the socket, and the listing's own descriptor (the spare and our end were closed)
    assert {"0", "1", "2", str(kept)} <= set(seen) and len(seen) == 5, seen
