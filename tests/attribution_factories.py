"""A small recording with known attribution answers, for tests/unit/test_attribution.py.

Times (CLOCK_MONOTONIC ns): the recording starts at 0.5 s and stops at 10 s; the root process
(pid 100) begins to exit at 8 s ("the end"), its teardown frees at 9 s.

native_heap (chains below; a null stack with weight 4 is sampled):
    1 s  A 1000 B  chain 1          3 s  C  500 B  chain 3 (recursive walk)
    2 s  B 3000 B  chain 2          4 s  B freed        -> peak 4500 B at 3 s
    5 s  D  200 B  no stack, weight 4 (800 B, 4 allocations)
    6 s  E  100 B  chain 1          6.5 s F 10 B chain 6 (same frames as chain 1)
    9 s  A freed (teardown)     -> at the end: 2410 B in 8 allocations
kernel_slab:
    2 s  three 256 B allocations, chain 4;  2.5 s 64 B no stack;  3.5 s the 64 B freed
    7 s  one 256 B freed        -> peak 832 B at 2.5 s, at the end 512 B in 2
torch_cpu (no stacks; categories):
    1 s  4096 B parameter;  2 s 2048 B and 1024 B activation;  3 s 512 B (no category)
    4 s  the 2048 B activation freed  -> peak 7680 B at 3 s, at the end 5632 B in 3
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from memprof.model.meta import RecordingMeta
from memprof.recording import RecordingWriter
from tests.factories import concat_events, ev, events_frame, mark, stacks_frames

S = 1_000_000_000
START_NS, END_NS, RECORDING_END_NS = S // 2, 8 * S, 10 * S
PID = 100

MALLOC = ("native", "malloc", "libc.so.6", None, None)
EVAL = ("native", "_PyEval_EvalFrameDefault", "python3.11", None, None)
CHAINS = {  # innermost first
    1: [MALLOC, ("python", "load", None, "data.py", 10), EVAL, ("python", "main", None, "train.py", 5), EVAL],
    2: [MALLOC, ("python", "step", None, "train.py", 20), EVAL, ("python", "main", None, "train.py", 6), EVAL],
    3: [MALLOC, ("python", "walk", None, "tree.py", 3), ("python", "walk", None, "tree.py", 4),
        ("python", "main", None, "train.py", 7)],
    4: [("kernel", "__kmalloc_noprof", "vmlinux", None, None), ("kernel", "alloc_pipe_info", "vmlinux", None, None),
        ("kernel", "do_pipe2", "vmlinux", None, None), ("native", "__pipe", "libc.so.6", None, None),
        ("native", "main", "kernel_leak", None, None)],
}
TWIN = 6  # a second stack id with exactly chain 1's frames: canonically chain 1


def tables() -> tuple[pd.DataFrame, pd.DataFrame]:
    """(stacks, frames): CHAINS, and stack TWIN sharing chain 1's frame ids."""
    stacks, frames = stacks_frames(CHAINS)
    twin = stacks[stacks["stack_id"] == 1].assign(stack_id=TWIN)
    return pd.concat([stacks, twin], ignore_index=True), frames


def events() -> pd.DataFrame:
    """The timeline of the module docstring, in time order."""
    heap = events_frame([
        (1 * S, "alloc", 0xA, 1000, 1), (2 * S, "alloc", 0xB, 3000, 2), (3 * S, "alloc", 0xC, 500, 3),
        (4 * S, "free", 0xB), ev(5 * S, "alloc", 0xD, 200, None, weight=4.0), (6 * S, "alloc", 0xE, 100, 1),
        (int(6.5 * S), "alloc", 0xF, 10, TWIN), (9 * S, "free", 0xA),
    ], layer="native_heap")
    slab = events_frame([
        (2 * S, "alloc", 0x1, 256, 4), (2 * S, "alloc", 0x2, 256, 4), (2 * S, "alloc", 0x3, 256, 4),
        (int(2.5 * S), "alloc", 0x4, 64, None), (int(3.5 * S), "free", 0x4), (7 * S, "free", 0x1),
    ], layer="kernel_slab")
    torch = events_frame([
        ev(1 * S, "alloc", 0x10, 4096, category="parameter"), ev(2 * S, "alloc", 0x20, 2048, category="activation"),
        ev(2 * S, "alloc", 0x30, 1024, category="activation"), ev(3 * S, "alloc", 0x40, 512),
        ev(4 * S, "free", 0x20),
    ], layer="torch_cpu")
    return concat_events(heap, slab, torch, events_frame([mark(END_NS, PID)], layer=None))


def write_recording(path: Path) -> Path:
    """The timeline and its stacks as a finalized recording at `path`."""
    stacks, frames = tables()
    writer = RecordingWriter(path, RecordingMeta(memprof_version="0.1.0", command=["python", "train.py"], pid=PID,
                                                 start_ns=START_NS))
    for name, table in (("events", events()), ("stacks", stacks), ("frames", frames)):
        writer.append(name, {column: table[column] for column in table.columns})
    writer.finalize(end_ns=RECORDING_END_NS)
    return path
