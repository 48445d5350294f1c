"""The layout of `struct mp_event` (bpf/memprof.h) as a numpy dtype, and its kind codes.

A batch of records is decoded with one strided view: no Python object per event.

numpy is imported when EVENT_DTYPE is first used, not with the module: the start-up's
program text and flags (loading.py, kmem.py) need only the codes here, and `record` begins
bcc's compile before it imports numpy (sources/ebpf/early.py)."""
from __future__ import annotations

import functools

# Must match struct mp_event in bpf/memprof.h (checked by tests/unit/test_records.py).
_EVENT_FIELDS = (
    ("ts_ns", "<u8"),
    ("addr", "<u8"),
    ("call_site", "<u8"),
    ("size", "<u8"),
    ("pid", "<u4"),
    ("tid", "<u4"),
    ("kstack_id", "<i4"),
    ("requested", "<u4"),
    ("kind", "u1"),
    ("layer", "u1"),
    ("flags", "u1"),
    ("device", "i1"),
    ("pad", "<u4"),
    ("ustack", "<u8"),
    ("py_stack", "<u8"),
)
EVENT_BYTES = 72


def __getattr__(name: str):
    """EVENT_DTYPE, built (and numpy imported) at its first use."""
    if name == "EVENT_DTYPE":
        return _event_dtype()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.lru_cache(maxsize=1)
def _event_dtype():
    import numpy as np
    dtype = np.dtype(list(_EVENT_FIELDS))
    assert dtype.itemsize == EVENT_BYTES
    return dtype

SLAB_ALLOC = 1
SLAB_FREE = 2
PAGE_ALLOC = 3
PAGE_FREE = 4
USER_ALLOC = 5
USER_FREE = 6
PROC_FORK = 8
PROC_EXEC = 9
PROC_EXIT = 10
EXIT_MARK = 11
MAP_EXEC = 12

ALLOC_KINDS = (SLAB_ALLOC, PAGE_ALLOC, USER_ALLOC)


def exec_comm(record) -> str:
    """The new program's name a PROC_EXEC record carries (the task's comm, 16 bytes over
    its call_site and size fields, NUL-padded), as text to show (undecodable bytes escaped)."""
    raw = record["call_site"].tobytes() + record["size"].tobytes()
    return raw.split(b"\0", 1)[0].decode("utf-8", "backslashreplace")
# Records whose `addr` is a kernel address (a slab object, a struct page): keyed before it
# leaves the recorder (memprof/sources/ebpf/addrkey.py).
KERNEL_KINDS = (SLAB_ALLOC, SLAB_FREE, PAGE_ALLOC, PAGE_FREE)
assert KERNEL_KINDS == tuple(range(SLAB_ALLOC, SLAB_ALLOC + 4))  # the decoder tests a range

# The `layer` byte, indexing these names (MP_LAYER_* in memprof.h).
LAYER_CODES = ("kernel_slab", "kernel_page", "torch_cpu", "cuda_driver", "native_heap")

FLAG_STACK_SAMPLED = 0x01
FLAG_HOST = 0x02
FLAG_ASYNC = 0x04
FLAG_MANAGED = 0x08
FLAG_PHYSICAL = 0x10
FLAG_HELD = 0x20  # kernel frees of an allocation the target held (bpf/kmem.bpf.c): the teardown's wait

# Counter slots of the per-CPU `counters` array.
CNT_RINGBUF_FULL = 0
CNT_STACK_FAIL = 1
CNT_SAMPLE_TICK = 2
CNT_SITE_FULL = 3
CNT_NESTED_FREES = 4  # + the free tracepoint's index in FREE_TRACEPOINTS
CNT_PY_NO_THREAD = 8
CNT_PY_BAD_CODE = 9
CNT_PY_MAP_FULL = 10
CNT_PY_RELEARNED = 11
CNT_SCRATCH_BUSY = 12
CNT_SITE_MIXED = 13  # reuse keys found to lead to two kernel stacks
CNT_PY_TAIL_FAILED = 14  # failed tail calls of the Python walk or learning (bpf/memprof.h)
CNT_IRQ_ALLOCS = 15  # kernel allocations in an interrupt while a tracked task was current: not recorded
CNT_PY_CODE_READS = 16  # code objects' heads read by the Python frames' learning (bpf/python.bpf.c)
CNT_PY_CALL_STACKS = 17  # events given the Python stack an earlier event of their system call walked
CNT_SCRATCH_SKIPPED = 18  # path-name buffers (names_cache) counted, not recorded (bpf/kmem.bpf.c)
CNT_SAMPLED_FULL = 19  # sampled kernel allocations left out: no room to remember them (bpf/kmem.bpf.c)
FREE_TRACEPOINTS = ("kfree", "kmem_cache_free", "mm_page_free", "mm_page_free_batched")

# Why an exit mark was emitted (stored in `requested`): 0 exit_group, 1..63 a fatal
# signal's number, 1000 the interpreter began to finalize.
EXIT_WHY_FINALIZE = 1000
