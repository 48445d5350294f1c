"""Reading a recording's events in bounded memory (issue 23): the allocation rows part by
part, in time order, and the other rows (marks, out-of-memory) apart, all at once (they are
few: steps, module boundaries, notes).

Each events part is sorted by (ts_ns, seq) when written (writer._write_part), but parts
overlap a little in time (the ring buffer and the agent hand rows over late). Every part's
first and last ts_ns come from its Parquet footer's statistics, so a row is released only
once no later part can hold a row before it: memory is one part plus that overlap, whatever
the length of the recording.

Frames come out typed exactly as `open_recording` types them (reader._read_part conforms and
validates each part). Times are CLOCK_MONOTONIC ns.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from memprof.model.schema import Action
from memprof.recording.parts import PART_ERRORS, arrow_source, corrupt_part
from memprof.recording.reader import _part_paths, _read_part, frame_of_tables
from memprof.recording.writer import TABLES

PAIRED_ACTIONS = (Action.ALLOC.value, Action.FREE.value, Action.FREE_REQUESTED.value)
_SCHEMA = TABLES["events"]
# Rows per batch handed on: the fixed cost of a batch (pairing, its context) is then paid once
# per 10^6 rows, not once per part (a flush every 0.25 s writes parts of a few thousand), and
# a batch's pairing temporaries stay a few hundred MB.
BATCH_ROWS = 1 << 20


@dataclass(frozen=True)
class EventPart:
    """One events part: its path, rows, and the first and last `ts_ns` of its rows."""

    path: Path
    rows: int
    first_ts_ns: int
    last_ts_ns: int


def event_parts(path: Path | str) -> list[EventPart]:
    """The recording's events parts in write order, from their footers alone (no rows are
    read unless a part's writer left no ts_ns statistics). BadRecordingError for a damaged one."""
    return [_part_of(part) for part in _part_paths(Path(path) / "events")]


def _part_of(part: Path) -> EventPart:
    try:
        metadata = pq.ParquetFile(arrow_source(part)).metadata
    except PART_ERRORS as e:
        raise corrupt_part(part, e) from e
    if metadata.num_rows == 0:
        return EventPart(part, 0, 0, 0)
    span = _ts_statistics(metadata)
    if span is None:  # no usable statistics: the part read and checked as open_recording does
        ts = _read_part(part, "events", _SCHEMA)["ts_ns"]
        span = (pc.min(ts).as_py(), pc.max(ts).as_py())
    return EventPart(part, metadata.num_rows, int(span[0]), int(span[1]))


def _ts_statistics(metadata: pq.FileMetaData) -> tuple[int, int] | None:
    """(min, max) of ts_ns over the row groups; None when the column is missing, is no int64
    column, or a row group has no statistics (a part memprof did not write)."""
    names = [metadata.schema.column(i).name for i in range(metadata.num_columns)]
    if "ts_ns" not in names:
        return None
    column = names.index("ts_ns")
    if metadata.schema.column(column).physical_type != "INT64":
        return None
    lows, highs = [], []
    for group in range(metadata.num_row_groups):
        statistics = metadata.row_group(group).column(column).statistics
        if statistics is None or not statistics.has_min_max:
            return None
        lows.append(statistics.min)
        highs.append(statistics.max)
    return min(lows), max(highs)


def other_events(parts: list[EventPart]) -> pd.DataFrame:
    """Every row that is no allocation or free (marks, steps, module boundaries, notes, exits,
    out-of-memory), in write order, typed as open_recording types events."""
    return frame_of_tables("events", [_rows(part, paired=False) for part in parts])


def paired_batches(parts: list[EventPart], batch_rows: int = BATCH_ROWS) -> Iterator[pd.DataFrame]:
    """The allocation and free rows (PAIRED_ACTIONS) of every part, in (ts_ns, seq) order, in
    frames of about `batch_rows` rows or more (whole parts; a part's rows that a later part
    may precede wait for it)."""
    later_first = _suffix_min([p.first_ts_ns for p in parts if p.rows])
    held: pa.Table | None = None
    ready_tables: list[pa.Table] = []
    for part, bound in zip([p for p in parts if p.rows], later_first):
        rows = _rows(part, paired=True)
        if held is not None and held.num_rows:
            rows = pa.concat_tables([held, rows])
        rows = _in_time_order(rows)
        ready = pc.less(rows["ts_ns"], pa.scalar(bound, pa.int64()))
        held = rows.filter(pc.invert(ready))
        ready_tables.append(rows.filter(ready))
        if sum(t.num_rows for t in ready_tables) >= batch_rows:
            yield from _cut(pa.concat_tables(ready_tables), batch_rows)
            ready_tables = []
    if held is not None:
        ready_tables.append(held)
    if sum(t.num_rows for t in ready_tables):
        yield from _cut(pa.concat_tables(ready_tables), batch_rows)


def _cut(rows: pa.Table, batch_rows: int) -> Iterator[pd.DataFrame]:
    """`rows` (in time order) as frames of about `batch_rows`, each cut between two times
    (every event of one time in one frame: analysis.fold.PeakTracker judges a time whole)."""
    ts = rows["ts_ns"].to_numpy()
    start = 0
    while start < len(ts):
        stop = min(start + batch_rows, len(ts))
        if stop < len(ts):  # move the cut past the rows of the time it falls in
            stop = int(np.searchsorted(ts, ts[stop - 1], side="right"))
        yield frame_of_tables("events", [rows.slice(start, stop - start)])
        start = stop


def _in_time_order(rows: pa.Table) -> pa.Table:
    """`rows` sorted by (ts_ns, seq); the same table when it already is (every part this
    version writes; recordings of older versions may hold unsorted ones)."""
    ts, seq = rows["ts_ns"].to_numpy(), rows["seq"].to_numpy()
    if len(ts) < 2 or ((ts[1:] > ts[:-1]) | ((ts[1:] == ts[:-1]) & (seq[1:] > seq[:-1]))).all():
        return rows
    return rows.sort_by([("ts_ns", "ascending"), ("seq", "ascending")])


def _suffix_min(firsts: list[int]) -> list[int]:
    """For each part, the earliest first ts_ns of the parts after it (int64 max for the last)."""
    bounds = np.full(len(firsts), np.iinfo(np.int64).max, dtype=np.int64)
    if len(firsts) > 1:
        bounds[:-1] = np.minimum.accumulate(np.asarray(firsts[1:], dtype=np.int64)[::-1])[::-1]
    return bounds.tolist()


def _rows(part: EventPart, *, paired: bool) -> pa.Table:
    """The part's paired rows (in its (ts_ns, seq) order) or its other rows."""
    table = _read_part(part.path, "events", _SCHEMA)
    is_paired = np.concatenate([_paired_mask(chunk) for chunk in table["action"].chunks] or [np.zeros(0, bool)])
    return table.filter(pa.array(is_paired if paired else ~is_paired))


def _paired_mask(actions: pa.DictionaryArray) -> np.ndarray:
    """Per row of a dictionary-encoded `action` chunk: one of PAIRED_ACTIONS (judged on the
    dictionary's few words, then on the int codes)."""
    paired = np.array([word in PAIRED_ACTIONS for word in actions.dictionary.to_pylist()] + [False])
    return paired[actions.indices.fill_null(-1).to_numpy(zero_copy_only=False)]
