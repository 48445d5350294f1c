"""The recorder's C heap given back to the system.

glibc keeps memory freed below its heap's top for reuse: a recorder that parsed the kernel's
BTF at start-up, or folded a large part, would hold that peak's pages for the rest of a
recording that may run for hours. `malloc_trim(0)` returns the free pages; it walks the heap
once (a few milliseconds at the sizes here)."""
from __future__ import annotations

import ctypes


def trim_heap() -> None:
    """Give glibc's free heap pages back to the system; nothing where libc is not glibc."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass
