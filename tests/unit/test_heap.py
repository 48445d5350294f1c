"""memprof/heap.py: after share_one_arena, a thread's allocations come from the main arena
(the [heap] mapping), not an arena of the thread's own; trim_heap gives freed pages back.
Each in a fresh process: glibc's arenas are per process, and pytest's has threads already."""
from __future__ import annotations

import subprocess
import sys

import pytest

_THREAD_MALLOC = """
import ctypes, sys, threading
from memprof import heap
if sys.argv[1] == "shared":
    heap.share_one_arena()
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
got = []
thread = threading.Thread(target=lambda: got.append(libc.malloc(200_000 // 4)))  # below mmap's threshold
thread.start(); thread.join()
with open("/proc/self/maps") as maps:
    heap_range = next(tuple(int(x, 16) for x in line.split()[0].split("-")) for line in maps if line.rstrip().endswith("[heap]"))
print("main" if heap_range[0] <= got[0] < heap_range[1] else "other")
"""


def _where_a_thread_allocates(mode: str) -> str:
    out = subprocess.run([sys.executable, "-c", _THREAD_MALLOC, mode], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def test_with_one_arena_a_threads_allocations_come_from_the_main_heap():
    assert _where_a_thread_allocates("shared") == "main"


def test_without_it_a_thread_has_an_arena_of_its_own():
    """The control: the test above could pass for a reason other than the call."""
    assert _where_a_thread_allocates("default") == "other"


_TRIM = """
import ctypes
from memprof import heap
def rss_kib():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssAnon:"))
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
blocks = [libc.malloc(64_000) for _ in range(1_000)]  # 64 MB below mmap's threshold: the heap
for b in blocks:
    ctypes.memset(b, 1, 64_000)
keep = libc.malloc(64_000)  # live above them (too large for a cache: from the top), so that
ctypes.memset(keep, 1, 64_000)  # free() cannot shrink the heap's top past them itself
for b in blocks:
    libc.free(b)
before = rss_kib()
heap.trim_heap()
print(before - rss_kib())
"""


def test_trim_heap_gives_back_what_was_freed_below_a_live_chunk():
    out = subprocess.run([sys.executable, "-c", _TRIM], capture_output=True, text=True, check=True)
    assert int(out.stdout) > 50 * 1024  # KiB: most of the 64 MB
