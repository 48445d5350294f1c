"""Allocations made from known Python functions at known lines, three calls deep — the known
answer for memprof's Python frames (tests/integration/test_python_frames.py).

    python examples/py_frames.py [--torch] [--threads N] [--deep]

Each allocation is kept until exit, so each is "held at the end":
  * a libc block of NATIVE_BYTES (ctypes → malloc) from native_inner ← native_middle ← native_outer;
  * a pipe (kernel: pipe_inode_info, files, the buffer array) from pipe_inner ← pipe_middle ← pipe_outer;
  * with --torch, a uint8 CPU tensor of TENSOR_BYTES from tensor_inner ← tensor_middle ← tensor_outer.
With --deep, a libc block of DEEP_BYTES from deep_inner ← DEEP_FRAMES nested calls of deep() ←
deep_outer, whose frames are large (DEEP_LOCALS locals each): the chain spans several pages and,
since 3.11, more than one of the thread's data-stack chunks (16 KiB), which memprof reads a page
at a time. With --threads N: two threads at the same time, for N rounds each, allocate THREAD_A_BYTES from
thread_a_inner ← thread_a_middle ← thread_a_outer and THREAD_B_BYTES from thread_b_*, while a
third thread spins in pure Python (so another thread holds the GIL while they allocate: ctypes
releases it around malloc). The lines the test checks carry a `# line:` comment.

Runs on CPython 3.10 – 3.13; torch is needed only with --torch.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import threading
import time

NATIVE_BYTES = 777_777
TENSOR_BYTES = 3_333_333
THREAD_A_BYTES = 111_111
THREAD_B_BYTES = 222_222
DEEP_BYTES = 444_444
DEEP_FRAMES = 40
DEEP_LOCALS = 48  # ~0.5 KiB a frame: 40 frames take ~20 KiB of the data stack

_libc = ctypes.CDLL(None)
_libc.malloc.restype = ctypes.c_void_p
_libc.malloc.argtypes = [ctypes.c_size_t]
held: list = []


def native_inner():
    held.append(_libc.malloc(NATIVE_BYTES))  # line: native_inner


def native_middle():
    native_inner()  # line: native_middle


def native_outer():
    native_middle()  # line: native_outer


def pipe_inner():
    held.append(os.pipe())  # line: pipe_inner


def pipe_middle():
    pipe_inner()  # line: pipe_middle


def pipe_outer():
    pipe_middle()  # line: pipe_outer


def tensor_inner():
    import torch
    held.append(torch.empty(TENSOR_BYTES, dtype=torch.uint8))  # line: tensor_inner


def tensor_middle():
    tensor_inner()  # line: tensor_middle


def tensor_outer():
    tensor_middle()  # line: tensor_outer


def deep_inner():
    held.append(_libc.malloc(DEEP_BYTES))  # line: deep_inner


def deep(n):
    (p00, p01, p02, p03, p04, p05, p06, p07, p08, p09, p10, p11, p12, p13, p14, p15,
     p16, p17, p18, p19, p20, p21, p22, p23, p24, p25, p26, p27, p28, p29, p30, p31,
     p32, p33, p34, p35, p36, p37, p38, p39, p40, p41, p42, p43, p44, p45, p46, p47) = range(DEEP_LOCALS)
    if n == 0:
        deep_inner()  # line: deep_bottom
    else:
        deep(n - 1)  # line: deep


def deep_outer():
    deep(DEEP_FRAMES - 1)  # line: deep_outer


def thread_a_inner():
    held.append(_libc.malloc(THREAD_A_BYTES))  # line: thread_a_inner


def thread_a_middle():
    thread_a_inner()  # line: thread_a_middle


def thread_a_outer(rounds, go):
    go.wait()
    for _ in range(rounds):
        thread_a_middle()  # line: thread_a_outer


def thread_b_inner():
    held.append(_libc.malloc(THREAD_B_BYTES))  # line: thread_b_inner


def thread_b_middle():
    thread_b_inner()  # line: thread_b_middle


def thread_b_outer(rounds, go):
    go.wait()
    for _ in range(rounds):
        thread_b_middle()  # line: thread_b_outer


def spin(stop):
    """Pure Python: holds the GIL whenever it runs."""
    n = 0
    while not stop.is_set():
        n += 1


def run_threads(rounds: int) -> None:
    go, stop = threading.Event(), threading.Event()
    spinner = threading.Thread(target=spin, args=(stop,))
    workers = [threading.Thread(target=thread_a_outer, args=(rounds, go)),
               threading.Thread(target=thread_b_outer, args=(rounds, go))]
    spinner.start()
    for w in workers:
        w.start()
    go.set()
    for w in workers:
        w.join()
    stop.set()
    spinner.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--torch", action="store_true", help="also allocate a CPU tensor (needs torch)")
    parser.add_argument("--threads", type=int, default=0, metavar="N", help="two allocating threads, N rounds each")
    parser.add_argument("--deep", action="store_true", help=f"also allocate from {DEEP_FRAMES} nested calls")
    parser.add_argument("--start-wait", type=float, default=0.3,
                        help="seconds to wait first, so a recorder has seen the interpreter (default 0.3)")
    args = parser.parse_args()
    time.sleep(args.start_wait)
    native_outer()
    pipe_outer()
    if args.torch:
        tensor_outer()
    if args.deep:
        deep_outer()
    if args.threads:
        run_threads(args.threads)


if __name__ == "__main__":
    main()
