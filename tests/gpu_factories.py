"""Synthetic GPU timelines and growth series with known answers, and a recording writer for
CLI tests (beside tests/factories.py, which they build on)."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow as pa

from memprof.model.meta import RecordingMeta
from memprof.recording import RecordingWriter
from tests.factories import ev, events_frame, mark

S = 1_000_000_000
MiB = 1 << 20
GiB = 1 << 30
PID = 100


def cuda(ts_ns: int, action: str, addr: int, size=None, layer: str = "cuda_block", device: str = "cuda:0",
         **columns) -> dict:
    """One event of a cuda layer (default: a caching-allocator block on cuda:0)."""
    return ev(ts_ns, action, addr, size, layer=layer, device=device, **columns)


def step_marks(steps, every_ns: int = S, start_ns: int = 0, pid: int = PID) -> list[dict]:
    """Step marks: step k begins at start_ns + k·every_ns."""
    rows = []
    for k in steps:
        row = mark(start_ns + k * every_ns, pid, "step")
        row["step"] = int(k)
        rows.append(row)
    return rows


def timeline_of(rows) -> pd.DataFrame:
    """An events frame in time order (the analyses read steps from the marks themselves)."""
    return events_frame(sorted(rows, key=lambda r: r["ts_ns"]))


def samples_frame(rows) -> pd.DataFrame:
    """Samples table from (ts_ns, metric, device, value) tuples."""
    frame = pd.DataFrame(rows, columns=["ts_ns", "metric", "device", "value"])
    return frame.astype({"ts_ns": "int64", "value": "float64"})


# The GPU equation with known terms on cuda:0, all held from 3 s to 5 s:
#   driver 10 GiB = a 9 GiB segment's driver allocation + 1 GiB NCCL-like (in no segment);
#   reserved 9 GiB (one segment); allocated 6 GiB in two blocks (4 GiB asking 3, 2 asking 2):
#   requested 5 GiB; NVML's process figure 10.5 GiB at 4 s, its first peak.
# => context 0.5 GiB, not_pytorch 1 GiB, cached_free 3 GiB, fragmentation 1/3, amplification 9/5.
# Pinned host memory (cuda_driver on "cpu", 2 GiB) must not count.
EQUATION_EVENTS = [
    cuda(1 * S, "alloc", 0x1000, 9 * GiB, layer="cuda_driver"),
    cuda(1 * S, "alloc", 0x9000, 1 * GiB, layer="cuda_driver"),
    cuda(1 * S, "alloc", 0x7000, 2 * GiB, layer="cuda_driver", device="cpu"),
    cuda(2 * S, "alloc", 0x1000, 9 * GiB, layer="cuda_segment"),
    cuda(3 * S, "alloc", 0x1000, 4 * GiB, requested_bytes=3 * GiB),
    cuda(3 * S, "alloc", 0x2000, 2 * GiB, requested_bytes=2 * GiB),
    cuda(5 * S, "free", 0x1000),
]
EQUATION_SAMPLES = samples_frame(
    [(t, "gpu_process_bytes", "cuda:0", v) for t, v in ((S // 2, 0.5 * GiB), (4 * S, 10.5 * GiB), (6 * S, 10.5 * GiB))]
    + [(t, "gpu_used_bytes", "cuda:0", 12.0 * GiB) for t in (S // 2, 4 * S, 6 * S)]
    + [(t, "gpu_total_bytes", "cuda:0", 80.0 * GiB) for t in (S // 2, 4 * S, 6 * S)]
)


def leak_per_step(steps: int, per_step: int = MiB, *, layer: str = "native_heap", device: str = "cpu",
                  stack_id: int = 7, churn_stack: int = 8) -> list[dict]:
    """Step marks 1..steps (1 s apart); in each step one `per_step` allocation kept (stack
    `stack_id`) and a 64 KiB one freed within the step (`churn_stack`). At step k's mark,
    (k − 1)·per_step bytes are live."""
    rows = step_marks(range(1, steps + 1))
    for k in range(1, steps + 1):
        t = k * S
        rows += [ev(t + S // 4, "alloc", 0x10_0000 + k * 0x1000, per_step, stack_id, layer=layer, device=device),
                 ev(t + S // 2, "alloc", 0x90_0000, 64 << 10, churn_stack, layer=layer, device=device),
                 ev(t + 3 * S // 4, "free", 0x90_0000, layer=layer, device=device)]
    return rows


def power_law_steps(steps: int, a: float = 1000.0, b: float = 1.5) -> list[dict]:
    """Step marks 1..steps (1 s apart); just before the mark of step k, an allocation brings
    the live bytes to round(a·k^b), so at step k's mark exactly that many are live."""
    rows = step_marks(range(1, steps + 1))
    live = 0
    for k in range(1, steps + 1):
        target = int(round(a * k ** b))
        rows.append(ev(k * S - S // 2, "alloc", 0x10_0000 + k * 0x1000, target - live, 7))
        live = target
    return rows


def write_recording(path: Path, events: pd.DataFrame, samples: pd.DataFrame | None = None,
                    meta: RecordingMeta | None = None) -> Path:
    """A finalized recording at `path` holding these events and samples."""
    writer = RecordingWriter(path, meta or RecordingMeta(memprof_version="0.1.0", command=["python", "t.py"],
                                                         start_ns=0, pid=PID))
    if len(events):
        writer.append("events", {name: _arrow(events[name]) for name in events.columns})
    if samples is not None and len(samples):
        writer.append("samples", {name: samples[name].to_numpy() for name in samples.columns})
    writer.finalize(end_ns=int(events["ts_ns"].max()) + 1 if len(events) else 1)
    return path


def _arrow(column: pd.Series):
    return column.values if isinstance(column.dtype, pd.CategoricalDtype) else pa.Array.from_pandas(column)

