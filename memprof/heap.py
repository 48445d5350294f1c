"""The recorder's C heap: one arena, and its free pages given back to the system.

glibc keeps memory freed below its heap's top for reuse, and gives each thread that contends
for the heap an arena of its own. A recorder's threads (the loop, the file writer, the
kallsyms reader, the symbol tables' readers) each leave their passing garbage in their own
arena; `malloc_trim(0)` gives back free pages, but an arena whose live chunks sit among the
garbage keeps most of it: kallsyms parsed on its own thread left the recorder 10 MB larger
after a trim, 2 MB on the main thread's arena (bench/RESULTS.md, 2026-12-07)."""
from __future__ import annotations

import ctypes
import functools

_M_ARENA_MAX = -8  # glibc's malloc.h


@functools.cache
def _libc():
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc
        return None


def share_one_arena() -> None:
    """Have every thread this process starts from now on allocate from the main arena (as
    MALLOC_ARENA_MAX=1, which glibc reads only as a process starts). The recorder's threads
    take turns at Python's lock anyway; small allocations go through each thread's cache.
    Nothing where libc is not glibc."""
    libc = _libc()
    if libc is not None and hasattr(libc, "mallopt"):
        libc.mallopt(_M_ARENA_MAX, 1)


def trim_heap() -> None:
    """Give glibc's free heap pages back to the system (malloc_trim(0): it walks the heap
    once, a few milliseconds at the sizes here); nothing where libc is not glibc."""
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)
