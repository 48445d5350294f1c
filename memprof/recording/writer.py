"""Writing a recording while capturing: buffered columns → chunked Parquet parts + meta.json.

A recording is a directory `NAME.memprof/` holding `meta.json` and one folder per table
(`events/`, `stacks/`, `frames/`, `samples/`) of Parquet parts `part-000000.parquet`, … .
Every file is written under a dot-prefixed temporary name and `os.replace`d into place, so a
recorder killed at any moment leaves only complete parts and a complete meta.json: a reader
sees the data up to the last `flush()`.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import stat
import sys
import threading
import time
from pathlib import Path
from typing import Any, Mapping

from memprof.errors import UsageError
from memprof.lazy_import import numpy as np, pyarrow as pa
from memprof.recording import arrow_build
from memprof.model.meta import FOLDED_FORMAT_VERSION, RecordingMeta
from memprof.model import schema

META_NAME = "meta.json"


class _Tables(Mapping):
    """A recording's tables: name -> Arrow schema, each schema looked up in model.schema at
    its use, so that importing the writer imports no pyarrow (memprof/lazy_import.py)."""

    _NAMES = {"events": "EVENTS_SCHEMA", "stacks": "STACKS_SCHEMA", "frames": "FRAMES_SCHEMA",
              "samples": "SAMPLES_SCHEMA"}

    def __getitem__(self, name: str) -> pa.Schema:
        return getattr(schema, self._NAMES[name])

    def __iter__(self):
        return iter(self._NAMES)

    def __len__(self) -> int:
        return len(self._NAMES)


TABLES: Mapping[str, pa.Schema] = _Tables()
# Columns that may not be missing or null; every other column of a table is nullable.
REQUIRED_COLUMNS: dict[str, frozenset[str]] = {
    # `layer` is null on `mark` rows (an exit or a step belongs to no allocator layer).
    "events": frozenset({"ts_ns", "seq", "action", "addr", "device", "pid", "tid"}),
    "stacks": frozenset({"stack_id", "depth", "frame_id"}),
    "frames": frozenset({"frame_id", "kind"}),
    "samples": frozenset({"ts_ns", "metric", "value"}),
}
# A part `part-N-f.parquet` is folded (record --max-size, capture/compactor.py): it holds what
# parts 0..N held, folded, and supersedes them and every earlier folded part. It is renamed into
# place before they are deleted, so a recorder killed between the two leaves a recording that
# reads the same (readers skip superseded parts).
PART_NAME = re.compile(r"^part-(\d+)(-f)?\.parquet$")
COMPRESSION = "zstd"
MAX_FOLDS_KEPT = 256  # meta.json's folds: the first and the latest; "n" numbers them all

_Column = Any  # numpy array, list, pandas array/Series, pyarrow array, or a scalar to broadcast


def part_name(index: int, folded: bool = False) -> str:
    return f"part-{index:06d}{'-f' if folded else ''}.parquet"


class RecordingWriter:
    """Creates the recording at `path` and appends batches of rows to its tables.

    `meta` is written at creation (status "recording"), rewritten at every `flush()` (the
    caller mutates it between flushes: per-source counts, clock anchors) and by `finalize()`
    (status "complete"). Appends may come from several threads; nothing is written until
    `flush()`.
    """

    def __init__(self, path: Path | str, meta: RecordingMeta, *, force: bool = False, owner_uid: int | None = None,
                 read_back: bool = False):
        """`force` replaces an existing recording at `path`, and only that: a folder holding a
        memprof meta.json and owned by `owner_uid` (default: this process's euid). A file, a
        symlink or any other folder is refused (UsageError). `read_back`: the events parts
        will be read back while recording (record --max-size's folds), so each one's
        identity is kept for wrote(); otherwise nothing is kept (a part a flush, hours long).

        Under a root recorder, construct, flush and finalize the writer on the recording
        owner's `memprof.asuser.UserThread`: every path is then checked, and every file
        created, as that user's (docs/SECURITY.md)."""
        self.path = Path(path)
        self.meta = meta
        self._buffers: dict[str, list[pa.Table]] = {name: [] for name in TABLES}
        self._parts = dict.fromkeys(TABLES, 0)
        self._lock = threading.Lock()        # guards the buffers and the finalized flag
        self._write_lock = threading.Lock()  # one writer of parts and meta.json at a time
        self._finalized = False
        # With read_back, the identity (_identity) of each events part this writer put in place
        # and has not removed, by path: the recorded command can write into its recording too,
        # and what reads the parts back while recording (capture/compactor.py's folds) takes
        # only these (wrote()). Folds remove parts, so the parts kept stay few.
        self._read_back = read_back
        self._written: dict[str, tuple[int, ...]] = {}
        clear_for_new_recording(self.path, force, os.geteuid() if owner_uid is None else owner_uid)
        _create_dirs(self.path)
        self._write_meta()

    @property
    def finalized(self) -> bool:
        return self._finalized

    @property
    def buffered_rows(self) -> int:
        """Rows appended since the last flush, all tables together."""
        with self._lock:
            return sum(t.num_rows for tables in self._buffers.values() for t in tables)

    def append(self, table_name: str, columns: Mapping[str, _Column]) -> None:
        """Buffer a batch of rows: `columns` maps column name → array of one length.

        A missing nullable column is all nulls; a scalar is repeated over the batch. Category
        columns (layer, action, device, category) take strings (numpy, list, pyarrow) or, fastest,
        a pandas Categorical or pyarrow DictionaryArray. Raises ValueError on unknown table or
        column names, missing or null required columns, lengths that differ, or values that do
        not fit the column type.
        """
        schema = TABLES.get(table_name)
        if schema is None:
            raise ValueError(f"unknown table {table_name!r}; tables are {', '.join(TABLES)}")
        table = _to_table(table_name, schema, columns)
        with self._lock:
            self._check_open()
            self._buffers[table_name].append(table)

    def flush(self) -> None:
        """Write each table's buffered rows as one new part, then rewrite meta.json.

        Appends from other threads wait only while the buffers are handed over, not while
        parts are compressed and written (a recorder keeps draining the kernel meanwhile).
        Raises ValueError after `finalize()`; OSError (disk full, …) keeps the unwritten rows."""
        with self._write_lock:
            with self._lock:
                self._check_open()
                pending, taken_ns = self._take_buffers()
            self._write(pending, taken_ns)

    def finalize(self, end_ns: int | None = None) -> None:
        """Flush, mark the recording "complete" (with `end_ns` if given). Calling again does nothing."""
        with self._write_lock:
            with self._lock:
                if self._finalized:
                    return
                if end_ns is not None:
                    self.meta.end_ns = end_ns
                status, self.meta.status = self.meta.status, "complete"
                pending, taken_ns = self._take_buffers()
            try:
                self._write(pending, taken_ns)
            except BaseException:
                self.meta.status = status  # not complete on disk: meta.json must not say so later
                raise
            with self._lock:
                self._finalized = True

    def rewrite_meta(self) -> None:
        """Write meta.json again, after finalize() too: what is known only later (the
        command's exit status, once it has been waited for) still reaches the recording.
        Raises OSError as flush() does."""
        with self._write_lock:
            self._write_meta()

    def _check_open(self) -> None:
        if self._finalized:
            raise ValueError(f"{self.path}: recording already finalized")

    def _take_buffers(self) -> tuple[dict[str, list[pa.Table]], int]:
        """The buffered tables, handed over, and when (monotonic ns): every row came in before."""
        pending = {name: tables for name, tables in self._buffers.items() if tables}
        for name in pending:
            self._buffers[name] = []
        return pending, time.monotonic_ns()

    def _write(self, pending: dict[str, list[pa.Table]], taken_ns: int) -> None:
        """Write taken buffers (taken at `taken_ns`, monotonic), then meta.json saying what
        the parts now hold; on failure, put back what was not written (oldest first)."""
        written = set()
        try:
            for name, tables in pending.items():
                table = pa.concat_tables(tables)
                self._write_part(name, table)
                written.add(name)
                rows = self.meta.flushed_rows
                rows[name] = rows.get(name, 0) + table.num_rows
            self.meta.flushed_to_ns = taken_ns
            self._write_meta()
            _fsync_dir(self.path)
        except BaseException:
            with self._lock:
                for name, tables in pending.items():
                    if name not in written:
                        self._buffers[name] = tables + self._buffers[name]
            raise

    def _write_part(self, table_name: str, table: pa.Table) -> None:
        if table_name == "events" and table.num_rows > 1:
            # Each part in time order (ties in ingest order): the ring buffer interleaves
            # CPUs, and sorting a part here costs the recorder milliseconds where sorting
            # 10^7 rows at every report costs seconds. Readers still check the order. Sorted
            # by numpy, not Table.sort_by, which imports pyarrow.compute (arrow_build.sorted_by).
            table = arrow_build.sorted_by(table, ["ts_ns", "seq"])
        path, identity = self._write_file(self.path / table_name, part_name(self._parts[table_name]), table)
        self._parts[table_name] += 1
        if self._read_back and table_name == "events":
            self._written[str(path)] = identity

    def _write_file(self, folder: Path, name: str, table: pa.Table) -> tuple[Path, tuple[int, ...]]:
        """`table` as the Parquet file `folder/name`, written under a temporary name and
        renamed; returns its path and identity (_identity)."""
        final = folder / name
        tmp = folder / f".{final.name}.tmp"
        import pyarrow.parquet as pq  # here: the recorder imports this module before the command starts
        with _create_exclusive(tmp) as f:
            pq.write_table(table, f, compression=COMPRESSION)
            f.flush()
            os.fsync(f.fileno())
            os.replace(tmp, final)
            identity = _identity(os.fstat(f.fileno()))  # after the rename, which sets ctime
        _fsync_dir(folder)
        return final, identity

    def wrote(self, path: str, info: os.stat_result) -> bool:
        """Whether the file at `path` (its lstat `info`) is an events part this writer put
        there (always False without read_back)."""
        return self._written.get(str(path)) == _identity(info)

    def install_folded_events(self, index: int, table: pa.Table, superseded: list[Path], fold: dict[str, Any]) -> None:
        """Put `table`, the events of the parts `superseded` folded (capture/compactor.py), in
        their place as the folded part `index` (the last of theirs), delete them, then rewrite
        meta.json: `flushed_rows` counts the folded rows instead of theirs (fold["events_before"]),
        `fold` joins `meta.folds`, and the format version says folded. Renamed in before they
        are deleted, so the recording reads the same at every moment (PART_NAME).
        Call it on the thread that flushes; raises OSError as flush() does."""
        with self._write_lock:
            folder = self.path / "events"
            name = part_name(index, folded=True)
            final, identity = self._write_file(folder, name, table)
            self._written[str(final)] = identity
            for part in superseded:
                if part.name != name:
                    part.unlink(missing_ok=True)
                    self._written.pop(str(part), None)
            _fsync_dir(folder)
            rows = self.meta.flushed_rows
            rows["events"] = rows.get("events", 0) - int(fold["events_before"]) + table.num_rows
            folds = self.meta.folds
            folds.append({**fold, "n": (folds[-1].get("n", len(folds)) if folds else 0) + 1})
            if len(folds) > MAX_FOLDS_KEPT:  # meta.json is rewritten at every flush: keep it small
                del folds[1]  # the first fold, and the latest ones, stay
            self.meta.format_version = FOLDED_FORMAT_VERSION
            self._write_meta()

    def _write_meta(self) -> None:
        tmp = self.path / f".{META_NAME}.tmp"
        text = json.dumps(self.meta.to_dict(), indent=2) + "\n"
        with _create_exclusive(tmp) as f:
            f.write(text.encode("utf-8"))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path / META_NAME)


def _identity(info: os.stat_result) -> tuple[int, ...]:
    """What tells a file this writer wrote from another put at its name since: device and
    inode (which the file system may give the next file once this one is gone), size, and
    ctime, which no user can set."""
    return info.st_dev, info.st_ino, info.st_size, info.st_ctime_ns


def clear_for_new_recording(path: Path, force: bool, owner_uid: int) -> None:
    """Make room for a new recording at `path` (the writer's rule, and `memprof import`'s): with `force`, remove an old recording owned
    by `owner_uid`; refuse anything else (a file, a symlink, someone else's folder, a folder
    that is not a recording), so that --force can never delete what memprof did not make."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as e:
        raise UsageError(f"cannot create {path}: {e.strerror}", "choose another -o path") from e
    why_not = _not_a_replaceable_recording(path, info, owner_uid)
    if not force:
        raise existing_output_error(path, why_not)
    if why_not:
        raise UsageError(f"{path} exists and {why_not}; refusing to replace it", "choose another -o path")
    try:
        shutil.rmtree(path)  # fd-based on Linux (rmtree.avoids_symlink_attacks): never leaves the folder
    except OSError as e:
        raise UsageError(f"cannot remove the old recording {path}: {e.strerror}", "remove it yourself, or choose another -o path") from e


MAX_META_BYTES = 64 << 20  # a meta.json larger than this is not one memprof wrote


def existing_output_error(path, why_not: str | None) -> UsageError:
    """The error for an -o `path` that exists, without --force: --force is suggested only
    where it would replace it (`why_not`: why not, _not_a_replaceable_recording)."""
    if why_not:
        return UsageError(f"{path} exists and {why_not}: --force would not replace it either", "choose another -o path")
    return UsageError(f"{path} exists", "choose another -o path, or pass --force to overwrite it")


def why_not_replaceable(path, owner_uid: int) -> str | None:
    """Why the existing -o `path` may not be replaced by --force; None if it may, or if
    nothing is there."""
    try:
        info = os.lstat(path)
    except OSError:
        return None
    return _not_a_replaceable_recording(Path(path), info, owner_uid)


def _not_a_replaceable_recording(path: Path, info: os.stat_result, owner_uid: int) -> str | None:
    """Why the existing `path` (lstat `info`) may not be replaced by --force; None if it may."""
    if stat.S_ISLNK(info.st_mode):
        return "is a symlink, not a memprof recording"
    if not stat.S_ISDIR(info.st_mode):
        return "is not a memprof recording"
    if info.st_uid != owner_uid:
        return f"belongs to uid {info.st_uid}, not to you (uid {owner_uid})"
    try:
        fd = os.open(path / META_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return "is not a memprof recording (no meta.json)"
    try:
        meta_info = os.fstat(fd)
        if not stat.S_ISREG(meta_info.st_mode) or meta_info.st_size > MAX_META_BYTES:
            return "is not a memprof recording (its meta.json is not a plain file)"
        with os.fdopen(os.dup(fd), "rb") as f:
            meta = json.loads(f.read())
    except (OSError, ValueError, RecursionError):
        return "is not a memprof recording (its meta.json is not memprof's)"
    finally:
        os.close(fd)
    if not isinstance(meta, dict) or "memprof_version" not in meta:
        return "is not a memprof recording (its meta.json is not memprof's)"
    return None


def _create_dirs(path: Path) -> None:
    try:
        path.mkdir(parents=True)
        for name in TABLES:
            (path / name).mkdir()
    except OSError as e:
        raise UsageError(f"cannot create {path}: {e.strerror}", "choose another -o path") from e


def _create_exclusive(path: Path):
    """A new file at `path`, opened for binary writing. Whatever sat at that temporary name
    (a leftover of a killed recorder, or a symlink or FIFO the profiled program planted) is
    unlinked — the entry itself, never what it points to — and the file is created with
    O_EXCL|O_NOFOLLOW, so nothing is followed and no open blocks."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o644)
    except FileExistsError:
        os.unlink(path)
        fd = os.open(path, flags, 0o644)
    return os.fdopen(fd, "wb")


def _fsync_dir(path: Path) -> None:
    """Make renames in `path` durable (a power cut after flush() keeps the new parts)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def table_of(table_name: str, columns: Mapping[str, _Column]) -> pa.Table:
    """Rows for table `table_name` as append() takes them, as an Arrow table of its schema
    (ValueError as append() raises it)."""
    return _to_table(table_name, TABLES[table_name], columns)


def _to_table(table_name: str, schema: pa.Schema, columns: Mapping[str, _Column]) -> pa.Table:
    unknown = set(columns) - set(schema.names)
    if unknown:
        raise ValueError(f"{table_name}: unknown columns {sorted(unknown)}; columns are {schema.names}")
    required = REQUIRED_COLUMNS[table_name]
    missing = required - set(columns)
    if missing:
        raise ValueError(f"{table_name}: missing required columns {sorted(missing)}")
    length = _batch_length(table_name, columns)
    arrays = []
    for field in schema:
        array = _to_array(field, columns.get(field.name), length, f"{table_name}.{field.name}")
        if field.name in required and array.null_count:
            raise ValueError(f"{table_name}.{field.name}: {array.null_count} nulls in a required column")
        arrays.append(array)
    return pa.Table.from_arrays(arrays, schema=schema)


def _batch_length(table_name: str, columns: Mapping[str, _Column]) -> int:
    lengths = {name: len(value) for name, value in columns.items() if not _is_scalar(value)}
    if not lengths:
        raise ValueError(f"{table_name}: no array column gives the batch length")
    if len(set(lengths.values())) > 1:
        raise ValueError(f"{table_name}: columns of different lengths {lengths}")
    return next(iter(lengths.values()))


def _is_scalar(value: _Column) -> bool:
    return value is None or isinstance(value, (str, bytes, int, float, np.generic))


def _to_array(field: pa.Field, value: _Column, length: int, where: str) -> pa.Array:
    """Convert one column to `field.type` in bulk; ValueError names the column on failure.
    numpy arrays, lists and scalars are built by arrow_build (pa.array would import pandas
    into the recorder); anything else (a pandas column) goes to pa.array."""
    try:
        if value is None:
            return pa.nulls(length, field.type)
        if pa.types.is_dictionary(field.type):
            return _to_dictionary(field.type, value, length)
        if _is_scalar(value):
            return arrow_build.repeated(value, field.type, length)
        if isinstance(value, (pa.Array, pa.ChunkedArray)):
            return _cast(_combine(value), field.type)
        if arrow_build.convertible(value):
            if pa.types.is_string(field.type):
                return arrow_build.strings(value)
            return arrow_build.numeric(value, field.type)
        # from_pandas: NaN in a float input (e.g. sizes with gaps) means null.
        return pa.array(value, type=field.type, from_pandas=True)
    except (pa.ArrowException, TypeError, ValueError, OverflowError) as e:
        raise ValueError(f"{where}: cannot store as {field.type}: {e}") from e


def _to_dictionary(type_: pa.DataType, value: _Column, length: int) -> pa.Array:
    if _is_scalar(value):
        return arrow_build.repeated(value, type_, length)
    pd = sys.modules.get("pandas")  # a pandas Categorical can only come from a process that imported it
    if isinstance(value, (pa.Array, pa.ChunkedArray)):
        array = _combine(value)  # the recorder's (decode.py): codes and dictionary as they are
    elif pd is not None and isinstance(value, pd.Categorical):
        # Codes and categories as they are: no string is touched.
        codes = np.asarray(value.codes)
        array = pa.DictionaryArray.from_arrays(
            pa.array(codes, mask=codes < 0), pa.array(np.asarray(value.categories, dtype=object), type_.value_type))
    elif arrow_build.convertible(value) and all(v is None or isinstance(v, str) for v in value):
        if all(v is None for v in value):
            return pa.nulls(length, type_)  # as pa.array's null type below
        return arrow_build.dictionary(value, type_)  # of type_ already, encoded without pyarrow.compute
    else:
        array = pa.array(value, from_pandas=True)
        if pa.types.is_null(array.type):
            # An all-null batch: Arrow's null type cannot be dictionary-encoded into Parquet.
            return pa.nulls(length, type_)
    if not pa.types.is_dictionary(array.type):
        array = array.dictionary_encode()
    limit = np.iinfo(type_.index_type.to_pandas_dtype()).max + 1
    if len(array.dictionary) > limit:
        raise ValueError(f"{len(array.dictionary)} distinct values, a category column holds at most {limit}")
    return _cast(array, type_)


def _cast(array: pa.Array, type_: pa.DataType) -> pa.Array:
    """`array` as `type_`. The recorder's columns come typed already (decode.py, and
    arrow_build for the agent's strings), and Array.cast dispatches through pyarrow.compute
    even then: its import took 0.1 s of the recorder's first poll and ~11 MB of its RSS
    (nothing else of a recording imports it now), and each call ~20 µs of every poll."""
    return array if array.type == type_ else array.cast(type_)


def _combine(value: pa.Array | pa.ChunkedArray) -> pa.Array:
    return value.combine_chunks() if isinstance(value, pa.ChunkedArray) else value
