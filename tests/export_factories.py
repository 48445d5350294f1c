"""A small recording with known answers for the export tests, written to disk with the
recording writer (tests/factories.py builds the frames).

Known answers (times in ms after the start, S = 1 ms in CLOCK_MONOTONIC ns; the recording
spans 0..50_000 ms, root pid 100, so `report leaks`' 500 ms minimum age is passed):

- native_heap on cpu: 3 allocations of 4096 bytes (stack 2) at 1_000, 2_000, 3_000, never
  freed: peak = end = 12_288 bytes; one of 100 bytes (stack 3) at 4_000 freed at 4_500.
- cuda_block on cuda:0: 1 MiB (stack 7) at 10_000, 2 MiB (no stack) at 20_000, the 1 MiB freed
  at 30_000: peak 3 MiB at 20_000, end 2 MiB.
- an OOM on cuda_block cuda:0 asking 8 MiB at 25_000 (pid 100, tid 101); step marks 1 and 2 at
  5_000 and 15_000.
- samples: rss_bytes 1e6, 3e6, 2e6 at 1_000, 2_000, 3_000; nvml_used_bytes on cuda:0 5e8 at 2_000.
"""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa

from memprof.model.meta import ClockAnchor, RecordingMeta
from memprof.recording import RecordingWriter
from tests.factories import ev, events_frame, mark, stacks_frames

MiB = 1 << 20
END_NS = 50_000 * 1_000_000
PROCESSES = [{"pid": 100, "ppid": 1, "comm": "python3", "exe": "/usr/bin/python3.11", "start_ns": 0, "exit_ns": None}]
CHAINS = {
    2: [("native", "malloc", "libc.so.6", None, None), ("python", "train_step", None, "train.py", 42)],
    3: [("native", "malloc", "libc.so.6", None, None), ("python", "load", None, "data.py", 7)],
    7: [("native", "cudaMalloc", "libcudart.so", None, None), ("python", "cache_batch", None, "train.py", 10)],
}


MS = 1_000_000  # ns


def known_events():
    heap = dict(layer="native_heap", device="cpu")
    gpu = dict(layer="cuda_block", device="cuda:0")
    return events_frame([
        ev(1_000 * MS, "alloc", 0x1000, 4096, 2, **heap), ev(2_000 * MS, "alloc", 0x2000, 4096, 2, **heap),
        ev(3_000 * MS, "alloc", 0x3000, 4096, 2, **heap), ev(4_000 * MS, "alloc", 0x4000, 100, 3, **heap),
        ev(4_500 * MS, "free", 0x4000, **heap), {**mark(5_000 * MS, 100, "step"), "step": 1, "layer": None},
        ev(10_000 * MS, "alloc", 0xA000, MiB, 7, **gpu), {**mark(15_000 * MS, 100, "step"), "step": 2, "layer": None},
        ev(20_000 * MS, "alloc", 0xB000, 2 * MiB, None, **gpu),
        ev(25_000 * MS, "oom", 0, 8 * MiB, 7, requested_bytes=8 * MiB, tid=101, **gpu),
        ev(30_000 * MS, "free", 0xA000, **gpu),
    ])


def write_recording(path: Path, events=None, *, samples: bool = True, chains=None) -> Path:
    """Write `events` (default: known_events()) with the stacks of `chains` (default CHAINS)
    and the known samples as a finalized recording at `path`."""
    events = known_events() if events is None else events
    anchor = ClockAnchor(monotonic_ns=0, realtime_ns=1_700_000_000 * 10**9)
    meta = RecordingMeta(memprof_version="0.1.0", command=["python3", "train.py"], pid=100, start_ns=0,
                         processes=PROCESSES, clock_anchors=[anchor])
    writer = RecordingWriter(path, meta)
    if len(events):
        writer.append("events", {name: pa.Array.from_pandas(events[name]) for name in events.columns})
    stacks, frames = stacks_frames(CHAINS if chains is None else chains)
    writer.append("stacks", {name: stacks[name].to_numpy() for name in stacks.columns})
    writer.append("frames", {name: pa.Array.from_pandas(frames[name]) for name in frames.columns})
    if samples:
        writer.append("samples", {"ts_ns": [1_000 * MS, 2_000 * MS, 3_000 * MS, 2_000 * MS],
                                  "metric": ["rss_bytes"] * 3 + ["nvml_used_bytes"],
                                  "device": [None, None, None, "cuda:0"], "value": [1e6, 3e6, 2e6, 5e8]})
    writer.finalize(end_ns=END_NS)
    return path
