"""The layout of `struct mp_event` (bpf/memprof.h) as a numpy dtype, and its kind codes.

A batch of records is decoded with one strided view: no Python object per event."""
from __future__ import annotations

import numpy as np

# Must match struct mp_event in bpf/memprof.h (checked by tests/unit/test_records.py).
EVENT_DTYPE = np.dtype([
    ("ts_ns", "<u8"),
    ("addr", "<u8"),
    ("call_site", "<u8"),
    ("pid", "<u4"),
    ("tid", "<u4"),
    ("size", "<u4"),
    ("requested", "<u4"),
    ("kstack_id", "<i4"),
    ("ustack_id", "<i4"),
    ("kind", "u1"),
    ("sampled", "u1"),
    ("pad", "V6"),
])
assert EVENT_DTYPE.itemsize == 56

SLAB_ALLOC = 1
SLAB_FREE = 2
PAGE_ALLOC = 3
PAGE_FREE = 4
PROC_FORK = 8
PROC_EXEC = 9
PROC_EXIT = 10
EXIT_MARK = 11

ALLOC_KINDS = (SLAB_ALLOC, PAGE_ALLOC)
MEMORY_KINDS = (SLAB_ALLOC, SLAB_FREE, PAGE_ALLOC, PAGE_FREE)
LIFECYCLE_KINDS = (PROC_FORK, PROC_EXEC, PROC_EXIT)

# Counter slots of the per-CPU `counters` array.
CNT_RINGBUF_FULL = 0
CNT_STACK_FAIL = 1
CNT_SAMPLE_TICK = 2
CNT_SITE_FULL = 3
CNT_NESTED_FREES = 4  # + the free tracepoint's index in FREE_TRACEPOINTS
FREE_TRACEPOINTS = ("kfree", "kmem_cache_free", "mm_page_free", "mm_page_free_batched")

# Why an exit mark was emitted (stored in `requested`): 0 exit_group, 1..63 a fatal
# signal's number, 1000 the interpreter began to finalize.
EXIT_WHY_FINALIZE = 1000
