"""A recording with known answers for the HTML report, written with memprof.recording.writer.

    path = leaky_recording(tmp_path / "leak.memprof")

One process (pid 100), 1 s per step, 24 steps:
- native_heap: `LEAKY_FUNCTION` (Python, below malloc) allocates LEAK_BYTES per step and never
  frees: 24 × 4096 B live at the end, growing by 4096 B per step;
- native_heap: `churn_buffer` allocates 1 MiB and frees it half a step later, every step;
- cuda:0: one 8 MiB segment with a 6 MiB block inside it, freed before the end;
- an OOM on cuda_block at 12.5 s; samples rss_bytes (cpu) and gpu_used_bytes / gpu_process_bytes
  (cuda:0) every 0.5 s; the process begins to exit at 24.5 s, the recording ends at 25 s;
- the source "ebpf" lost LOST events (a warning on the page).
Times are CLOCK_MONOTONIC ns from START_NS.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from memprof.model.meta import RecordingMeta, SourceStats
from memprof.recording import RecordingWriter
from tests.factories import concat_events, ev, events_frame, mark

LEAKY_FUNCTION = "fill_leaky_cache_<lambda>"  # '<' and '>' must survive the page's escaping
START_NS = 1_000_000_000
STEP_NS = 1_000_000_000
STEPS = 24
LEAK_BYTES = 4096
LOST = 3
MiB = 1 << 20
OOM_NS = START_NS + 12 * STEP_NS + STEP_NS // 2
EXIT_NS = START_NS + STEPS * STEP_NS + STEP_NS // 2
END_NS = START_NS + (STEPS + 1) * STEP_NS
LEAK_STACK, CHURN_STACK, GPU_STACK = 7, 8, 9


def leaky_recording(path: Path) -> Path:
    """Write the recording (module docstring) at `path`; returns `path`."""
    meta = RecordingMeta(memprof_version="0.1.0", command=["python", "train.py"], pid=100, host="testhost",
                         kernel="6.8.0", start_ns=START_NS,
                         sources={"ebpf": SourceStats(events=1000, lost=LOST)})
    writer = RecordingWriter(path, meta)
    writer.append("events", _columns(leaky_events()))
    frames, stacks = _frames_and_stacks()
    writer.append("frames", frames)
    writer.append("stacks", stacks)
    writer.append("samples", _samples())
    writer.finalize(end_ns=END_NS)
    return path


def leaky_events() -> pd.DataFrame:
    """The events of the recording, in time order."""
    rows = []
    for step in range(STEPS):
        t = START_NS + step * STEP_NS
        rows.append(dict(ts_ns=t, action="mark", category="step", step=step))
        rows.append(ev(t + 1000, "alloc", 0x5500_0000 + step * 0x10000, LEAK_BYTES, LEAK_STACK))
        rows.append(ev(t + 2000, "alloc", 0x7700_0000, MiB, CHURN_STACK))
        rows.append(ev(t + STEP_NS // 2, "free", 0x7700_0000))
    gpu = dict(device="cuda:0", stack_id=GPU_STACK)
    rows += [ev(START_NS + 100, "alloc", 0xA000, 8 * MiB, layer="cuda_segment", **gpu),
             ev(START_NS + 200, "alloc", 0xA000, 6 * MiB, layer="cuda_block", **gpu),
             dict(ts_ns=OOM_NS, action="oom", layer="cuda_block", device="cuda:0", size_bytes=64 * MiB),
             ev(START_NS + 20 * STEP_NS, "free", 0xA000, layer="cuda_block", **gpu),
             ev(START_NS + 20 * STEP_NS + 100, "free", 0xA000, layer="cuda_segment", **gpu),
             mark(EXIT_NS, 100)]
    return concat_events(events_frame(rows))


def _columns(events: pd.DataFrame) -> dict:
    """A frame from tests.factories as the writer's column mapping."""
    out = {name: events[name] for name in events.columns}
    return {name: (col.array if isinstance(col.dtype, pd.CategoricalDtype) else col.to_numpy())
            for name, col in out.items() if col.notna().any() or name in ("ts_ns", "seq")}


def _frames_and_stacks() -> tuple[dict, dict]:
    """Chains innermost first: malloc ← LEAKY_FUNCTION ← main; malloc ← churn_buffer ← main;
    cudaMalloc ← forward ← main."""
    frames = {"frame_id": [1, 2, 3, 4, 5, 6], "kind": ["native", "python", "python", "python", "native", "python"],
              "function": ["malloc", LEAKY_FUNCTION, "main", "churn_buffer", "cudaMalloc", "forward"],
              "module": ["libc.so.6", None, None, None, "libcudart.so", None],
              "file": [None, "train.py", "train.py", "train.py", None, "model.py"],
              "line": [None, 42, 7, 55, None, 12]}
    chains = {LEAK_STACK: [1, 2, 3], CHURN_STACK: [1, 4, 3], GPU_STACK: [5, 6, 3]}
    stack_ids = [sid for sid, chain in chains.items() for _ in chain]
    depths = [d for chain in chains.values() for d in range(len(chain))]
    return frames, {"stack_id": stack_ids, "depth": depths, "frame_id": [f for c in chains.values() for f in c]}


def _samples() -> dict:
    times = START_NS + np.arange(0, 2 * (STEPS + 1)) * (STEP_NS // 2)
    n = len(times)
    rss = 100 * MiB + np.arange(n) * LEAK_BYTES
    return {"ts_ns": np.tile(times, 3),
            "metric": ["rss_bytes"] * n + ["gpu_used_bytes"] * n + ["gpu_process_bytes"] * n,
            "device": ["cpu"] * n + ["cuda:0"] * (2 * n),
            "value": np.concatenate([rss, np.full(n, 10.0 * MiB), np.full(n, 9.0 * MiB)]).astype(float)}
