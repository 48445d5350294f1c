"""A sweep recording with known regions, written with memprof.recording.writer.

    path = sweep_recording(tmp_path / "sweep.memprof")

One process (pid 100). torch_cpu holds WEIGHTS bytes (stack 1) from START_NS + 1 ms to the end.
For each (seq_len, batch) of SEQ_LENS × BATCHES, in that order, one second apart from
START_NS + 1 s: memprof.mark("config", seq_len=…, batch=…) (its numbers stamped 30 µs before the
mark, seq_len first; the outermost forward's sizes 50 µs after it), then buffer_bytes(seq_len,
batch) allocated 100 ms later (stack 2) and freed 400 ms after that. So each region's
torch_cpu peak is WEIGHTS + buffer_bytes(seq_len, batch). The process begins to exit at
EXIT_NS; the recording ends at END_NS.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from memprof.model.meta import RecordingMeta
from memprof.recording import RecordingWriter
from tests.factories import concat_events, ev, events_frame, mark
from tests.html_factories import _columns

SEQ_LENS = (64, 128, 256)
BATCHES = (1, 2, 4)
START_NS = 1_000_000_000
SECOND = 1_000_000_000
WEIGHTS = 100 * 1024
EXIT_NS = START_NS + (len(SEQ_LENS) * len(BATCHES) + 1) * SECOND + SECOND // 2
END_NS = EXIT_NS + SECOND // 2


def buffer_bytes(seq_len: int, batch: int) -> int:
    """A configuration's working memory: a KV-like seq_len × batch part and a seq_len part."""
    return seq_len * batch * 10_000 + seq_len * 3_000


def peak_bytes(seq_len: int, batch: int) -> int:
    return WEIGHTS + buffer_bytes(seq_len, batch)


def configs() -> list[tuple[int, int, int]]:
    """(mark time, seq_len, batch), in the order they ran."""
    pairs = [(s, b) for s in SEQ_LENS for b in BATCHES]
    return [(START_NS + (k + 1) * SECOND, s, b) for k, (s, b) in enumerate(pairs)]


def sweep_recording(path: Path) -> Path:
    """Write the recording (module docstring) at `path`; returns `path`."""
    meta = RecordingMeta(memprof_version="0.1.0", command=["python", "sweep.py"], pid=100, host="testhost",
                         kernel="6.8.0", start_ns=START_NS)
    writer = RecordingWriter(path, meta)
    rows = [ev(START_NS + 1_000_000, "alloc", 0x10, WEIGHTS, 1, layer="torch_cpu")]
    samples = []
    for k, (t, seq_len, batch) in enumerate(configs()):
        rows += [mark(t, 100, "config"),
                 ev(t + SECOND // 10, "alloc", 0x1000 + k, buffer_bytes(seq_len, batch), 2, layer="torch_cpu"),
                 ev(t + SECOND // 2, "free", 0x1000 + k, layer="torch_cpu")]
        samples += [(t, "quantity:seq_len", seq_len), (t, "quantity:batch", batch),
                    (t + 50_000, "quantity:batch", batch), (t + 50_000, "quantity:seq_len", seq_len)]
    rows.append(mark(EXIT_NS, 100))
    writer.append("events", _columns(concat_events(events_frame(rows))))
    writer.append("frames", {"frame_id": [1, 2, 3], "kind": ["python"] * 3,
                             "function": ["load_weights", "forward", "main"], "module": [None] * 3,
                             "file": ["sweep.py", "model.py", "sweep.py"], "line": [10, 42, 5]})
    writer.append("stacks", {"stack_id": [1, 1, 2, 2], "depth": [0, 1, 0, 1], "frame_id": [1, 3, 2, 3]})
    writer.append("samples", {"ts_ns": np.array([s[0] for s in samples], dtype=np.int64),
                              "metric": [s[1] for s in samples], "device": [""] * len(samples),
                              "value": np.array([s[2] for s in samples], dtype=float)})
    writer.finalize(end_ns=END_NS)
    return path
