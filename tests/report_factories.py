"""A known recording every report can be checked on (tests of memprof.api and the reporters):
written to disk as `memprof record` would leave it, read back through memprof.api.analyse."""
from __future__ import annotations

from pathlib import Path

from tests.diff_factories import write_recording
from tests.factories import ev, events_frame

S = 1_000_000_000
KiB = 1024
LEAKY = [("native", "c10::alloc_cpu", "libc10.so", None, None), ("python", "train_step", "train", "train.py", 34),
         ("python", "main", "train", "train.py", 56)]
SETUP = [("native", "c10::alloc_cpu", "libc10.so", None, None), ("python", "build[model]", "model", "model.py", 9)]
HELD = (1 << 20) + 20 * 128 * KiB  # torch_cpu's bytes at its peak and at the end of `known_recording`


def known_recording(path: Path) -> Path:
    """20 steps of 1 s; each keeps 128 KiB on LEAKY (stack 1); a 1 MiB model held from the
    start (stack 2); the root process (pid 100) begins to exit at 21 s; the recording runs
    from 0 to 22 s and holds 42 events."""
    rows = [ev(S // 2, "alloc", 0x9000, 1 << 20, 2)]
    for k in range(1, 21):
        rows.append(dict(ts_ns=k * S, action="mark", category="step", step=k, pid=100, tid=100))
        rows.append(ev(k * S + S // 4, "alloc", 0x10_0000 * k, 128 * KiB, 1))
    rows.append(dict(ts_ns=21 * S, action="mark", category="exit", pid=100, tid=100))
    return write_recording(path, events_frame(rows, layer="torch_cpu"), {1: LEAKY, 2: SETUP}, end_ns=22 * S)
