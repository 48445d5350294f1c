"""The merged timeline, its marks and the leak findings as tables for any CSV or Parquet
reader: a directory holding events.csv, marks.csv and findings.csv (or .parquet).

Render only: the events are the timeline as `memprof.timeline.timeline` gives it (columns
and units of DESIGN.md §3: ts_ns CLOCK_MONOTONIC ns, sizes bytes); the findings are an
`analysis.leaks.LeakResult`, one row per finding (leaks first, then what is not a leak); the
marks are `analysis.series.marks_table` (steps and the user's own marks, by label).
In Parquet, category columns stay dictionary columns; in CSV they are their labels.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from memprof.analysis.leaks import LeakFinding, LeakResult
from memprof.analysis.lifetimes import label_of
from memprof.report.labels import NO_STACK_FRAME, frame_label
from memprof.report.safe_text import visible
from memprof.report.wording import explain
from memprof.safe_output import output_directory, output_file

FINDING_COLUMNS = ["kind", "reason", "layer", "bytes", "count", "slope_bytes_per_step", "slope_bytes_per_s",
                   "confidence", "released_at_exit", "confirmed", "first_ns", "last_ns", "stack_id",
                   "explanation", "chain"]
CHAIN_SEPARATOR = ";"  # as in folded stacks: outermost frame first


def findings_frame(result: LeakResult, chains: dict[int, list[dict]]) -> pd.DataFrame:
    """One row per finding (FINDING_COLUMNS): bytes/count are live bytes and allocations,
    slopes bytes per step (or window) and per second, confidence 0..1 (Mann–Kendall; NA
    without a trend), `chain` the frame labels outermost first joined by ';'."""
    findings = result.findings + result.not_leaks
    frame = pd.DataFrame([_finding_row(f, result, chains) for f in findings], columns=FINDING_COLUMNS)
    # Built as Int64 directly: via pandas' float64 inference an id near 2^63 (a recording
    # can hold any) would not convert back exactly, or at all.
    frame["stack_id"] = pd.array([f.stack_id for f in findings], dtype="Int64")
    return frame.astype({"bytes": "int64", "count": "int64", "slope_bytes_per_step": "Float64",
                         "slope_bytes_per_s": "Float64", "confidence": "Float64", "released_at_exit": "bool",
                         "confirmed": "bool", "first_ns": "int64", "last_ns": "int64"})


def _finding_row(finding: LeakFinding, result: LeakResult, chains: dict[int, list[dict]]) -> dict:
    frames = [] if finding.stack_id is None else chains.get(finding.stack_id, [])
    chain = CHAIN_SEPARATOR.join(_plain(frame_label(f)) for f in reversed(frames)) or NO_STACK_FRAME
    return {"kind": finding.kind, "reason": finding.reason, "layer": finding.layer, "bytes": finding.live_bytes,
            "count": finding.live_count, "slope_bytes_per_step": finding.slope_bytes_per_step,
            "slope_bytes_per_s": finding.slope_bytes_per_s, "confidence": finding.confidence,
            "released_at_exit": finding.released_at_exit, "confirmed": finding.confirmed,
            "first_ns": finding.first_ns, "last_ns": finding.last_ns, "stack_id": finding.stack_id,
            "explanation": explain(finding, result), "chain": chain}


def _plain(label: str) -> str:
    """';' joins frames and a row is one line: neither may appear inside a label."""
    return label.replace(CHAIN_SEPARATOR, ",").replace("\r", " ").replace("\n", " ")


def write_tables(tables: dict[str, pd.DataFrame], directory: Path, fmt: str) -> list[Path]:
    """Write each of `tables` as NAME.<fmt> ("csv" or "parquet") into `directory` (created if
    missing; a real directory, never a link: memprof.safe_output); the paths written, in
    the order given. OSError and UnsafeOutputError propagate (the caller says what to do)."""
    if fmt not in ("csv", "parquet"):
        raise ValueError(f"fmt must be 'csv' or 'parquet', not {fmt!r}")
    paths = []
    with output_directory(directory) as fd:
        for name, frame in tables.items():
            with output_file(f"{name}.{fmt}", dir_fd=fd) as f:
                _write(arrow_table(frame), f, fmt)
            paths.append(directory / f"{name}.{fmt}")
    return paths


def _write(table: pa.Table, f, fmt: str) -> None:
    if fmt == "parquet":
        import pyarrow.parquet as pq
        pq.write_table(table, f)
        return
    import pyarrow.csv as pcsv
    pcsv.write_csv(csv_table(table), f)


def csv_table(table: pa.Table) -> pa.Table:
    """`table` for a CSV file: each dictionary column as its labels (CSV has no
    dictionaries), and every text visible (safe_text.visible: a name from the recording
    holds no control character, so it cannot drive a terminal that shows the file, nor
    break a row)."""
    columns = [_csv_column(table.column(i)) for i in range(table.num_columns)]
    return pa.table(columns, names=table.column_names) if columns else table


def _csv_column(column: pa.ChunkedArray) -> pa.ChunkedArray:
    if pa.types.is_dictionary(column.type):
        return pa.chunked_array([_visible_labels(chunk) for chunk in column.chunks], type=pa.string())
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        return pa.chunked_array([_visible_labels(chunk.dictionary_encode()) for chunk in column.chunks],
                                type=column.type)
    return column


def _visible_labels(chunk: pa.DictionaryArray) -> pa.Array:
    """`chunk` as plain strings, each label through `visible` once (not each row)."""
    labels = pa.array([None if text is None else visible(text) for text in chunk.dictionary.to_pylist()],
                      type=pa.string())
    return pa.DictionaryArray.from_arrays(chunk.indices, labels).cast(chunk.type.value_type)


def arrow_table(frame: pd.DataFrame) -> pa.Table:
    """`frame` as an Arrow table, each categorical column a dictionary<int32, string> (labels as
    text, also when a column is empty or all null), no index."""
    columns = {}
    for name in frame.columns:
        column = frame[name]
        if isinstance(column.dtype, pd.CategoricalDtype):
            codes = column.cat.codes.to_numpy().astype(np.int32)
            labels = pa.array([label_of(x) for x in column.cat.categories], type=pa.string())
            columns[name] = pa.DictionaryArray.from_arrays(pa.array(codes, mask=codes < 0), labels)
        else:
            columns[name] = pa.Array.from_pandas(column)
    return pa.table(columns) if columns else pa.table({})
