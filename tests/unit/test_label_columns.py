"""Mark labels in the `category` column: many distinct ones, in one batch and over a run.

A training loop that calls `memprof.mark(f"batch {i}")` every step gives one label per step.
The column's index was int8 (a batch of more than 128 labels could not be written) and the
reader kept int16 codes (more than 32,767 labels could never be read); both are wider now,
and parts written with int8 indices still read."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from memprof.model.meta import RecordingMeta
from memprof.recording import RecordingWriter, open_recording


def marks(labels: list[str], start: int = 0) -> dict:
    """One mark row per label, at consecutive times."""
    n = len(labels)
    i = np.arange(start, start + n, dtype=np.int64)
    return dict(ts_ns=i * 10, seq=i, layer=None, action="mark", addr=np.zeros(n, np.uint64), device="cpu",
                pid=np.full(n, 7, np.int32), tid=np.full(n, 7, np.int32), category=labels)


def write(path: Path, *batches: dict) -> Path:
    writer = RecordingWriter(path, RecordingMeta(memprof_version="0.1.0", command=["python"], start_ns=0))
    for batch in batches:
        writer.append("events", batch)
        writer.flush()
    writer.finalize(end_ns=10**12)
    return path


def test_two_hundred_distinct_labels_in_one_batch_are_written_and_read(tmp_path):
    labels = [f"batch {i}" for i in range(200)]
    events = open_recording(write(tmp_path / "r.memprof", marks(labels))).events
    assert list(events["category"].astype(str)) == labels


def test_more_labels_than_int16_codes_hold_are_read_back(tmp_path):
    labels = [f"batch {i}" for i in range(40_000)]  # > 32,767: past int16 codes
    batches = [marks(labels[k:k + 10_000], start=k) for k in range(0, len(labels), 10_000)]
    events = open_recording(write(tmp_path / "r.memprof", *batches)).events
    assert len(events["category"].cat.categories) == 40_000
    assert list(events["category"].astype(str)) == labels


def test_a_part_written_with_int8_label_indices_still_reads(tmp_path):
    path = write(tmp_path / "r.memprof", marks(["first"]))
    part = next((path / "events").glob("*.parquet"))
    table = pq.read_table(part)
    old = pa.dictionary(pa.int8(), pa.string())
    at = table.schema.get_field_index("category")
    table = table.set_column(at, pa.field("category", old), table["category"].cast(old))
    pq.write_table(table, part)
    assert pq.read_schema(part).field("category").type == old  # really an old-style part
    assert list(open_recording(path).events["category"].astype(str)) == ["first"]
