"""`detach_in_parallel`: bcc's perf-event probes are closed on threads before its cleanup(),
since each close waits out an RCU grace period (memprof/sources/ebpf/source.py)."""
from __future__ import annotations

import os
import select
import threading

import pytest

from memprof.sources.ebpf.source import detach_in_parallel


class FakeBcc:
    """bcc's BPF object as detach_in_parallel sees it: the two fd tables and their detach
    methods, which remove the key as bcc's do; `fail` keys raise as bcc does."""

    def __init__(self, tracepoints, uprobes, fail=()):
        self.tracepoint_fds = {key: 3 for key in tracepoints}
        self.uprobe_fds = {key: 4 for key in uprobes}
        self.raw_tracepoint_fds = {}
        self.fail = set(fail)
        self.detached: list[bytes] = []
        self._lock = threading.Lock()
        self._active = 0
        self.most_at_once = 0
        self._all_in = threading.Barrier(len(self.tracepoint_fds) + len(self.uprobe_fds), timeout=5)

    def _detach(self, table: dict, key) -> None:
        with self._lock:
            self._active += 1
            self.most_at_once = max(self.most_at_once, self._active)
        try:
            self._all_in.wait()  # every close in flight at once, as the kernel's waits are
        finally:
            with self._lock:
                self._active -= 1
        if key in self.fail:
            raise Exception(f"Failed to detach {key!r}")
        del table[key]
        with self._lock:
            self.detached.append(key)

    def detach_tracepoint(self, key) -> None:
        self._detach(self.tracepoint_fds, key)

    def detach_uprobe_event(self, key) -> None:
        self._detach(self.uprobe_fds, key)


def test_every_probe_is_detached_once_and_all_at_once():
    tracepoints = [b"sched:sched_process_exit", b"sched:sched_process_fork", b"syscalls:sys_enter_mmap"]
    uprobes = [b"p__lib_0x10_1", b"r__lib_0x10_1"]
    bpf = FakeBcc(tracepoints, uprobes)
    detach_in_parallel(bpf)
    assert sorted(bpf.detached) == sorted(tracepoints + uprobes)
    assert bpf.tracepoint_fds == {} and bpf.uprobe_fds == {}
    assert bpf.most_at_once == 5


def test_a_probe_that_fails_is_left_for_cleanup():
    bpf = FakeBcc([b"sched:a", b"sched:b"], [], fail=[b"sched:b"])
    detach_in_parallel(bpf)
    assert bpf.detached == [b"sched:a"]
    assert bpf.tracepoint_fds == {b"sched:b": 3}  # bcc's cleanup() meets it, and says why


def test_one_probe_is_left_to_cleanup():
    bpf = FakeBcc([b"sched:a"], [])
    bpf._all_in = threading.Barrier(1)
    detach_in_parallel(bpf)
    assert bpf.detached == [] and bpf.tracepoint_fds == {b"sched:a": 3}


class FakeBccWithCleanup(FakeBcc):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.cleaned_up_after: list[bytes] | None = None

    def cleanup(self) -> None:
        self.cleaned_up_after = list(self.detached)


def test_process_probes_are_detached_when_the_tree_exits_and_stop_waits_for_them(monkeypatch):
    """Without a holder (MEMPROF_PROBE_HOLDER=0, or fork failed), EbpfSource.detach_process_probes
    detaches the perf-event probes (uprobes, sched and syscall tracepoints) on a thread, while
    the session waits for the kernel's last frees; stop() waits for that thread before bcc's
    cleanup(), and detaches nothing twice."""
    from memprof.sources.ebpf.source import EbpfSource
    monkeypatch.setenv("MEMPROF_PROBE_HOLDER", "0")
    tracepoints, uprobes = [b"sched:sched_process_exit", b"syscalls:sys_enter_mmap"], [b"p__lib_0x10_1"]
    bpf = FakeBccWithCleanup(tracepoints, uprobes)
    source = EbpfSource()
    source._bpf = bpf
    source.detach_process_probes()
    source.detach_process_probes()  # once only
    source.stop()
    assert sorted(bpf.detached) == sorted(tracepoints + uprobes)
    assert bpf.cleaned_up_after == bpf.detached  # cleanup() came after every detach
    assert source._bpf is None


def test_kernel_symbols_are_read_once_prefetched(monkeypatch):
    from memprof.sources.ebpf import source as S
    reads = []
    monkeypatch.setattr(S, "load_kernel_symbols", lambda programs: reads.append(programs) or "kallsyms")
    src = S.EbpfSource()
    src.prefetch_kernel_symbols()
    src.prefetch_kernel_symbols()
    assert src._kernel_symbols() == "kallsyms" and src._kernel_symbols() == "kallsyms"
    assert reads == [S._program_symbols]  # once, naming the programs from their info


class PipeBcc:
    """bcc's BPF object with pipes' write ends for its perf-event and raw tracepoint
    descriptors: its detach methods close them as bcc's do, and a pipe's read end tells
    when the last copy, the holder's included, is closed."""

    def __init__(self):
        self.read_ends = {}
        self.tracepoint_fds, self.uprobe_fds, self.raw_tracepoint_fds = {}, {}, {}
        for table, key in ((self.tracepoint_fds, b"sched:sched_process_fork"), (self.uprobe_fds, b"p__lib_0x10_1"),
                           (self.raw_tracepoint_fds, b"sys_enter")):
            self.read_ends[key], table[key] = os.pipe()

    def detach_tracepoint(self, key) -> None:
        os.close(self.tracepoint_fds.pop(key))

    def detach_uprobe_event(self, key) -> None:
        os.close(self.uprobe_fds.pop(key))

    def cleanup(self) -> None:
        for fd in self.raw_tracepoint_fds.values():
            os.close(fd)
        self.raw_tracepoint_fds = {}

    def closed_everywhere(self, key, seconds: float) -> bool:
        ready, _, _ = select.select([self.read_ends[key]], [], [], seconds)
        return bool(ready) and os.read(self.read_ends[key], 1) == b""


def test_a_holder_makes_the_last_closes_of_the_process_probes_then_of_the_kmem_links():
    """EbpfSource.detach_process_probes hands the perf events and the kmem links to a forked
    holder (probe_holder.py) and closes its own copies at once: the perf events are closed
    everywhere soon after, the raw tracepoints' links only after stop()."""
    from memprof.sources.ebpf.source import EbpfSource
    bpf = PipeBcc()
    source = EbpfSource()
    source._bpf = bpf
    source.detach_process_probes()
    assert bpf.tracepoint_fds == {} and bpf.uprobe_fds == {}  # the recorder's copies: closed
    assert bpf.closed_everywhere(b"sched:sched_process_fork", 5) and bpf.closed_everywhere(b"p__lib_0x10_1", 5)
    assert not bpf.closed_everywhere(b"sys_enter", 0.3)  # the kmem side still reports frees
    source.stop()
    assert bpf.closed_everywhere(b"sys_enter", 5)
    for fd in bpf.read_ends.values():
        os.close(fd)


def test_the_holder_is_released_even_when_bccs_cleanup_raises():
    from memprof.sources.ebpf.source import EbpfSource

    class FailingCleanup(PipeBcc):
        def cleanup(self) -> None:
            super().cleanup()
            raise Exception("Failed to detach BPF from uprobe")  # as bcc raises

    bpf = FailingCleanup()
    source = EbpfSource()
    source._bpf = bpf
    source.detach_process_probes()
    with pytest.raises(Exception, match="Failed to detach"):
        source.stop()
    assert bpf.closed_everywhere(b"sys_enter", 5)  # the holder let go of the links all the same
    for fd in bpf.read_ends.values():
        os.close(fd)
