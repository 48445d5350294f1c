"""The free tracepoints' backup programs (bpf/kmem.bpf.c, on_nested_free), run by the kernel's
BPF_PROG_TEST_RUN on memprof's own compiled object with a free's arguments.

The kernel skips a free tracepoint's main program when the free nests in it (an interrupt's
RCU callbacks), and counts the skip; the backup program, which runs after the main one for
every event, sees the free. `Tracepoints.missed` reports as "skipped by the kernel" the
skips less the backups' count, so that count must take every nested free the backup saw,
also those of memory the target never had, which it rightly does not record. It counted
only the recorded ones, and a training loop's recording said "13 skipped by the kernel" of
frees that a program had seen.
"""
from __future__ import annotations

import ctypes

import pytest

from memprof.sources.ebpf import records as R
from memprof.sources.ebpf.bpfinfo import bpf_call
from memprof.sources.ebpf.loading import compile_program, counter_total
from memprof.sources.ebpf.options import EbpfOptions
from memprof.sources.ebpf.ringbuf import RingBufferConsumer

_BPF_PROG_TEST_RUN = 10  # bpf() command (include/uapi/linux/bpf.h)
NOT_THE_TARGETS = 0xFFFF888012345678  # a slab address no tracked process allocated
KMEM_CACHE_FREE = R.FREE_TRACEPOINTS.index("kmem_cache_free")


class _TestRunAttr(ctypes.Structure):  # union bpf_attr's `test` member
    _fields_ = [("prog_fd", ctypes.c_uint32), ("retval", ctypes.c_uint32), ("data_size_in", ctypes.c_uint32),
                ("data_size_out", ctypes.c_uint32), ("data_in", ctypes.c_uint64), ("data_out", ctypes.c_uint64),
                ("repeat", ctypes.c_uint32), ("duration", ctypes.c_uint32), ("ctx_size_in", ctypes.c_uint32),
                ("ctx_size_out", ctypes.c_uint32), ("ctx_in", ctypes.c_uint64), ("ctx_out", ctypes.c_uint64),
                ("flags", ctypes.c_uint32), ("cpu", ctypes.c_uint32), ("batch_size", ctypes.c_uint32)]


def _run_raw_tracepoint(prog_fd: int, *args: int) -> None:
    """Run the raw tracepoint program once, as the kernel would with `args`."""
    ctx = (ctypes.c_uint64 * len(args))(*args)
    bpf_call(_BPF_PROG_TEST_RUN, _TestRunAttr(prog_fd=prog_fd, ctx_in=ctypes.addressof(ctx),
                                              ctx_size_in=ctypes.sizeof(ctx)))


@pytest.fixture(scope="module")
def bpf():
    options = EbpfOptions(families=("kmem",), ringbuf_bytes=1 << 20)
    compiled = compile_program(options, options.enabled)
    yield compiled
    compiled.cleanup()


def _backup(bpf) -> int:
    return bpf.load_func(b"mp_kmem_cache_free_nested", bpf.RAW_TRACEPOINT).fd


def _seen_by_backup(bpf) -> int:
    return counter_total(bpf[b"counters"], R.CNT_NESTED_FREES + KMEM_CACHE_FREE)


def _set_free_seq(bpf, main_done: int, main_addr: int, backup_seen: int) -> None:
    """This tracepoint's free_seq on every CPU (the test run takes the current one)."""
    table = bpf[b"free_seqs"]
    key = table.Key(KMEM_CACHE_FREE)
    values = table.Leaf()
    for cpu in range(len(values)):
        values[cpu].main_done, values[cpu].main_addr, values[cpu].backup_seen = main_done, main_addr, backup_seen
    table[key] = values


def test_a_nested_free_of_memory_the_target_never_had_is_counted_as_seen_and_not_recorded(bpf):
    ring = RingBufferConsumer(bpf[b"events"].map_fd, 1 << 20, R.EVENT_BYTES, lambda: R.EVENT_DTYPE)
    try:
        ring.drain()
        _set_free_seq(bpf, main_done=7, main_addr=0, backup_seen=7)  # the main program did not run for it
        before = _seen_by_backup(bpf)
        _run_raw_tracepoint(_backup(bpf), 0xFFFFFFFF81000000, NOT_THE_TARGETS, 0)
        assert _seen_by_backup(bpf) == before + 1
        assert len(ring.drain()) == 0
    finally:
        ring.close()


def test_a_free_the_main_program_handled_is_not_counted_by_the_backup(bpf):
    _set_free_seq(bpf, main_done=8, main_addr=NOT_THE_TARGETS, backup_seen=7)  # the main one just handled it
    before = _seen_by_backup(bpf)
    _run_raw_tracepoint(_backup(bpf), 0xFFFFFFFF81000000, NOT_THE_TARGETS, 0)
    assert _seen_by_backup(bpf) == before
