"""Reading a recording: meta.json + Parquet parts → pandas DataFrames.

Readers refuse format versions they do not know (DESIGN.md §7.1). Every problem with a path
is a `BadRecordingError` naming the path, with a hint.
"""
from __future__ import annotations

import functools
import json
import os
import stat
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from memprof.errors import BadRecordingError
from memprof.model.meta import (
    KNOWN_FORMAT_VERSIONS, MAX_META_DEPTH, META_SCHEMA, RecordingMeta, row_field_error,
)
from memprof.model.schema import ACTIONS, FRAME_KEYS, LAYERS
from memprof.recording.columns import column_filler
from memprof.recording.parts import PART_ERRORS as _PART_ERRORS
from memprof.recording.parts import corrupt_part as _corrupt_part
from memprof.recording.parts import arrow_source
from memprof.recording.parts import first_line as _first_line
from memprof.recording.parts import row_count as _row_count
from memprof.recording.writer import META_NAME, PART_NAME, REQUIRED_COLUMNS, TABLES

NOT_FINALIZED_NOTE = "recording was not finalized (recorder killed?): data up to the last flush"
_NO_RECORDING_HINT = "run `sudo memprof record -- CMD` first, or pass a path"
# Integer columns that may hold nulls: pandas nullable Int64/Int32 after their Arrow type.
_NULLABLE_INTEGERS = {
    "events": ("size_bytes", "requested_bytes", "stack_id", "alloc_id", "step"),
    "frames": ("line",),
}
MAX_META_BYTES = 64 << 20  # a meta.json larger than this is not one memprof wrote
_INT64_MIN, _INT64_MAX = -2**63, 2**63 - 1


@dataclass(eq=False)
class Recording:
    """A recording read into memory. Times are ns on `meta.clock` (CLOCK_MONOTONIC).

    `events`: layer/action/device/category are pandas Categorical (layer and action with every
    known value as a category); size_bytes, requested_bytes, stack_id and alloc_id are nullable
    Int64, step nullable Int32 (its schema type); ts_ns and seq int64; addr uint64; pid and tid
    int32. `frames.line` is nullable Int32. Rows are in the order they were flushed: parts in
    order, rows within a part in append order (not sorted by ts_ns: that is the timeline's job).
    """

    path: Path
    meta: RecordingMeta
    events: pd.DataFrame = field(repr=False)
    stacks: pd.DataFrame = field(repr=False)
    frames: pd.DataFrame = field(repr=False)
    samples: pd.DataFrame = field(repr=False)
    _cache: dict[str, Any] = field(default_factory=dict, init=False, repr=False)

    @property
    def complete(self) -> bool:
        """False when the recorder stopped before `finalize()`: data up to the last flush."""
        return self.meta.status == "complete"

    def stack_frames(self, stack_id: int | None) -> list[dict[str, Any]]:
        """Frames of `stack_id`, innermost first (depth 0 first), as dicts with keys kind,
        function, module, file, line (None where unknown). A null stack_id, or one whose
        stack is not in the recording (lost), has no frames."""
        if stack_id is None or pd.isna(stack_id):
            return []
        ids, frame_ids = self._stack_index()
        lo, hi = np.searchsorted(ids, stack_id, "left"), np.searchsorted(ids, stack_id, "right")
        positions, columns = self._frame_lookup()
        return [_frame_dict(columns, p) for p in positions.get_indexer(frame_ids[lo:hi])]

    def _stack_index(self) -> tuple[np.ndarray, np.ndarray]:
        """stack_ids sorted by (stack_id, depth), and the frame_ids in that order."""
        if "stacks" not in self._cache:
            ids = self.stacks["stack_id"].to_numpy()
            order = np.lexsort((self.stacks["depth"].to_numpy(), ids))
            self._cache["stacks"] = (ids[order], self.stacks["frame_id"].to_numpy()[order])
        return self._cache["stacks"]

    def _frame_lookup(self) -> tuple[pd.Index, dict[str, list]]:
        """frame_id → row position, and the frame columns as lists with None for nulls."""
        if "frames" not in self._cache:
            columns = {
                key: [None if pd.isna(v) else v for v in self.frames[key].astype(object).tolist()]
                for key in FRAME_KEYS
            }
            self._cache["frames"] = (pd.Index(self.frames["frame_id"]), columns)
        return self._cache["frames"]


def _frame_dict(columns: dict[str, list], position: int) -> dict[str, Any]:
    if position < 0:  # a frame_id missing from `frames`: keep the depth, say nothing
        return dict.fromkeys(FRAME_KEYS)
    return {key: columns[key][position] for key in FRAME_KEYS}


def open_recording(path: Path | str) -> Recording:
    """Read the recording at `path` (a `NAME.memprof` directory). Raises BadRecordingError."""
    path = Path(path)
    meta = read_meta(path)
    if meta.status != "complete":
        meta.notes.append(NOT_FINALIZED_NOTE)
    return Recording(path=path, meta=meta, **{name: read_table(path, name) for name in TABLES})


def read_meta(path: Path | str) -> RecordingMeta:
    """Only the metadata of the recording at `path` (cheap: no tables are read)."""
    path = Path(path)
    data = _load_meta_json(path)
    version = data.get("format_version")
    if version is None:
        raise BadRecordingError(f"{path}: {META_NAME} has no format_version", _damaged_hint())
    _check_version(path, version)
    _check_meta(path, data)
    try:
        return RecordingMeta.from_dict(data)
    except (TypeError, ValueError, AttributeError) as e:
        raise BadRecordingError(f"{path}: {META_NAME} has unexpected fields ({e})", _damaged_hint()) from e


def _check_meta(path: Path, data: dict[str, Any]) -> None:
    """Raise BadRecordingError naming the first field of meta.json that is too deep, an
    integer outside int64, or not what META_SCHEMA (and ROW_FIELDS) says."""
    where = _out_of_bounds(data)
    if where:
        raise BadRecordingError(f"{path}: {META_NAME} field {where}", _damaged_hint())
    from jsonschema.exceptions import best_match
    error = best_match(_meta_validator().iter_errors(data))
    if error is None and (row := row_field_error(data)):
        raise BadRecordingError(f"{path}: {META_NAME} field {row[0]} is invalid: {row[1]}", _damaged_hint())
    if error is not None:
        field = _field_name(error.absolute_path)
        why = error.message if len(error.message) <= 200 else error.message[:200] + "…"
        raise BadRecordingError(f"{path}: {META_NAME} field {field} is invalid: {why}", _damaged_hint())


@functools.cache
def _meta_validator():
    """A jsonschema validator of META_SCHEMA (imported late: only readers of recordings need it)."""
    from jsonschema import Draft202012Validator
    return Draft202012Validator(META_SCHEMA)


def _out_of_bounds(data: Any) -> str | None:
    """'NAME is nested too deep' or 'NAME is outside int64' for the first such value, else None.
    Iterative: meta.json's depth is what is being checked."""
    pending = [((), data)]
    while pending:
        where, value = pending.pop()
        if len(where) > MAX_META_DEPTH:
            return f"{_field_name(where[:MAX_META_DEPTH])} is nested more than {MAX_META_DEPTH} deep"
        if isinstance(value, int) and not isinstance(value, bool) and not _INT64_MIN <= value <= _INT64_MAX:
            return f"{_field_name(where)} is outside int64"
        if isinstance(value, dict):
            pending += [((*where, k), v) for k, v in value.items()]
        elif isinstance(value, list):
            pending += [((*where, i), v) for i, v in enumerate(value)]
    return None


def _field_name(where) -> str:
    """sources.ebpf.lost, processes[3].pid, … (the top level: 'meta')."""
    name = ""
    for key in where:
        name += f"[{key}]" if isinstance(key, int) else (f".{key}" if name else str(key))
    return name[:200] or "meta"


def find_latest_recording(directory: Path | str = ".") -> Path:
    """The `*.memprof` recording in `directory` whose meta.json changed last."""
    directory = Path(directory)
    candidates = [p for p in directory.glob("*.memprof") if (p / META_NAME).is_file()]
    if not candidates:
        raise BadRecordingError(
            f"no memprof recording (*.memprof) in {directory.resolve()}", _NO_RECORDING_HINT
        )
    return max(candidates, key=lambda p: (p / META_NAME).stat().st_mtime_ns)


def _load_meta_json(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise BadRecordingError(f"{path} does not exist", _NO_RECORDING_HINT)
    if not path.is_dir() or not (path / META_NAME).is_file():
        why = f"no {META_NAME}" if path.is_dir() else "not a directory"
        raise BadRecordingError(
            f"{path} is not a memprof recording ({why})",
            "pass a NAME.memprof directory written by `memprof record`",
        )
    try:
        data = json.loads(_read_meta_bytes(path / META_NAME).decode("utf-8"), parse_constant=_no_constant)
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        why = _first_line(e) if not isinstance(e, RecursionError) else "nested too deep"
        raise BadRecordingError(f"{path}: {META_NAME} is not readable JSON ({why[:200]})", _damaged_hint()) from None
    if not isinstance(data, dict):
        raise BadRecordingError(f"{path}: {META_NAME} is not a JSON object", _damaged_hint())
    return data


def _read_meta_bytes(meta: Path) -> bytes:
    """meta.json's bytes: a regular file of at most MAX_META_BYTES (a FIFO would block the
    reader forever). Raises OSError, ValueError."""
    fd = os.open(meta, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError("not a regular file")
        if info.st_size > MAX_META_BYTES:
            raise ValueError(f"{info.st_size:,} bytes, more than memprof writes")
        return f.read(MAX_META_BYTES + 1)


def _no_constant(name: str):
    """json's hook for NaN, Infinity and -Infinity, which no memprof writes."""
    raise ValueError(f"{name} is not a number memprof writes")


def _check_version(path: Path, version: Any) -> None:
    if type(version) is int and version in KNOWN_FORMAT_VERSIONS:
        return
    reads = ", ".join(map(str, KNOWN_FORMAT_VERSIONS))
    if type(version) is int and version > max(KNOWN_FORMAT_VERSIONS):
        raise BadRecordingError(
            f"{path}: recorded by a newer memprof: format version {version}, this memprof reads {reads}",
            "upgrade memprof (pip install -U memprof) to read it",
        )
    raise BadRecordingError(
        f"{path}: unknown format version {version!r}, this memprof reads {reads}", _damaged_hint()
    )


def _damaged_hint() -> str:
    return "the recording is damaged or was not written by memprof; record again"


def _part_paths(folder: Path) -> list[Path]:
    """Complete parts in write order; temporary files (dot-names, *.tmp) of a killed writer are skipped."""
    if not folder.is_dir():
        if os.path.lexists(folder):
            raise BadRecordingError(f"{folder} is not a directory: the {folder.name} table cannot be read",
                                    _damaged_hint())
        return []
    parts = [(int(m.group(1)), bool(m.group(2)), p) for p in folder.iterdir() if (m := PART_NAME.match(p.name))]
    parts = _not_superseded(parts)
    for _, _, part in parts:
        if not part.is_file():  # a FIFO would block the reader forever, a device never end
            raise BadRecordingError(f"{part} is not a regular file", _damaged_hint())
    return [p for _, _, p in sorted(parts)]


def _not_superseded(parts: list[tuple[int, bool, Path]]) -> list[tuple[int, bool, Path]]:
    """Of (index, folded, path): the latest folded part and the parts after it (writer.py's
    PART_NAME says why the others may still be there)."""
    folded = [index for index, is_folded, _ in parts if is_folded]
    if not folded:
        return parts
    latest = max(folded)
    return [(index, is_folded, p) for index, is_folded, p in parts
            if index > latest or (index == latest and is_folded)]


def read_table(path: Path, name: str) -> pd.DataFrame:
    """Table `name` of the recording as pandas (columns.py: filled part by part into arrays
    sized for all parts, so no part outlives its copy)."""
    schema = TABLES[name]
    parts = _part_paths(path / name)
    counts = [_row_count(part) for part in parts]
    nullable = set(_NULLABLE_INTEGERS.get(name, ()))
    known = _KNOWN_CATEGORIES.get(name, {})
    fillers = {f.name: column_filler(f, sum(counts), nullable=f.name in nullable, known=known.get(f.name, ()))
               for f in schema}
    at = 0
    for (part, table), count in zip(_prefetched(parts, name, schema), counts):
        if table.num_rows != count:
            raise BadRecordingError(f"{part}: {table.num_rows} rows where its footer says {count}", _damaged_hint())
        for f in schema:
            fillers[f.name].fill(at, table[f.name])
        at += count
        del table
    # Arrow's allocator keeps freed parts for reuse; nothing is read after this, so it goes back.
    pa.default_memory_pool().release_unused()
    return pd.DataFrame({f.name: fillers[f.name].finish() for f in schema}, copy=False)


def frame_of_tables(name: str, tables: list[pa.Table]) -> pd.DataFrame:
    """Conformed tables of table `name` (as _read_part returns them) as one pandas frame,
    typed as open_recording types that table."""
    schema = TABLES[name]
    nullable = set(_NULLABLE_INTEGERS.get(name, ()))
    known = _KNOWN_CATEGORIES.get(name, {})
    fillers = {f.name: column_filler(f, sum(t.num_rows for t in tables), nullable=f.name in nullable,
                                     known=known.get(f.name, ())) for f in schema}
    at = 0
    for table in tables:
        for f in schema:
            fillers[f.name].fill(at, table[f.name])
        at += table.num_rows
    return pd.DataFrame({f.name: fillers[f.name].finish() for f in schema}, copy=False)


def _prefetched(parts: list[Path], name: str, schema: pa.Schema):
    """(part, its table) in order, the next part read on a thread while the caller copies this
    one (Parquet decoding releases the GIL): reading and copying overlap on two cores."""
    if not parts:
        return
    with ThreadPoolExecutor(1) as reader:
        upcoming = reader.submit(_read_part, parts[0], name, schema)
        for index, part in enumerate(parts):
            table = upcoming.result()
            if index + 1 < len(parts):
                upcoming = reader.submit(_read_part, parts[index + 1], name, schema)
            yield part, table
            del table


def _read_part(part: Path, name: str, schema: pa.Schema) -> pa.Table:
    """One part, conformed to `schema`: missing nullable columns become nulls, extra ones are dropped."""
    try:
        table = pq.read_table(arrow_source(part))
    except _PART_ERRORS as e:
        raise _corrupt_part(part, e) from e
    missing = REQUIRED_COLUMNS[name] - set(table.column_names)
    if missing:
        message = f"{part}: {name} part lacks required columns {sorted(missing)}"
        raise BadRecordingError(message, _damaged_hint())
    nulls = sorted(c for c in REQUIRED_COLUMNS[name] if table[c].null_count)
    if nulls:
        raise BadRecordingError(f"{part}: {name} part has nulls in required columns {nulls}", _damaged_hint())
    try:
        arrays = [_conform(table, f) for f in schema]
    except pa.ArrowException as e:
        message = f"{part}: {name} part has columns of unexpected types ({_first_line(e)})"
        raise BadRecordingError(message, _damaged_hint()) from e
    conformed = pa.Table.from_arrays(arrays, schema=schema)
    try:  # text that is not UTF-8, dictionary codes past their dictionary (30 ms per 10^7 rows)
        conformed.validate(full=True)
    except pa.ArrowException as e:
        raise _corrupt_part(part, e) from e
    return conformed


def _conform(table: pa.Table, field: pa.Field) -> pa.ChunkedArray | pa.Array:
    if field.name not in table.column_names:
        return pa.nulls(len(table), field.type)
    column = table[field.name]
    return column if column.type == field.type else column.cast(field.type)


_KNOWN_CATEGORIES = {"events": {"layer": LAYERS, "action": ACTIONS}}
