"""`memprof import`: PyTorch CUDA memory snapshots and torch.profiler Chrome traces → a
recording every report reads.

A file whose content starts with `{` is a Chrome trace (JSON, memprof/sources/torch_import/profiler.py);
any other is a snapshot pickle, loaded without running anything it names
(memprof/sources/torch_import/safe_pickle.py) and converted by memprof/sources/torch_import/snapshot.py. Both may
be gzip-compressed. Only when every file has been read is the recording written, under a hidden
temporary name beside the output that is renamed into place once complete: a bad file, a
failure while writing, or Ctrl-C leaves nothing behind (and never a recording that says
"recording"). Times stay the files' own: epoch ns (CLOCK_REALTIME), recorded as
`meta.clock`; a snapshot's rows have pid and tid 0 (it records neither).
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from memprof import __version__
from memprof.errors import BadInputError, MemprofError, UsageError
from memprof.model import RecordingMeta, SourceStats
from memprof.recording import RecordingWriter
from memprof.sources.symbols.frame_interner import FrameInterner
from memprof.sources.torch_import.safe_pickle import loads_plain, read_input
from memprof.sources.torch_import.profiler import profiler_rows
from memprof.sources.torch_import.snapshot import SnapshotRows, realtime_ns, snapshot_rows

SNAPSHOT, PROFILER = "torch_snapshot", "torch_profiler"
CLOCK = "CLOCK_REALTIME"
CLOCK_NOTE = ("imported: times are the files' own epoch clock (CLOCK_REALTIME ns, to the microsecond), not "
              "CLOCK_MONOTONIC; a CUDA snapshot's events have pid and tid 0 (it records neither)")
_SUFFIXES = (".gz", ".pickle", ".pkl", ".json")
# The device column holds at most 128 names per part (an int8 dictionary); a recording of
# more devices than that is not one torch wrote.
MAX_DEVICES = 128
# Items (trace entries, blocks, segments, annotations, Chrome trace events) per byte of a
# file, at most: each costs a real file dozens of bytes, so more are objects shared by
# reference, which would cost hundreds of bytes of rows each.
BYTES_PER_ITEM = 8
_MIN_ITEMS = 4096


@dataclass
class ImportResult:
    """What was written: the recording's path, its event count, and warnings for the user."""

    path: Path
    files: int
    events: int
    devices: list[str]
    warnings: list[str] = field(default_factory=list)


def default_output(first: Path | str, directory: Path | str = ".") -> Path:
    """`DIR/STEM.memprof` for the first input file (snap.pickle, snap.pickle.gz → snap.memprof)."""
    name = Path(first).name
    for suffix in _SUFFIXES:
        if name.endswith(suffix) and len(name) > len(suffix):
            name = name[: -len(suffix)]
    return Path(directory) / f"{name}.memprof"


def import_snapshots(paths: list[Path | str], output: Path | str | None = None, *, force: bool = False) -> ImportResult:
    """Convert the snapshot and trace files at `paths` (rows appended file after file) into a recording
    at `output` (default: `default_output(paths[0])`). Raises BadInputError (UnsafeInputError
    for a pickle that names code) naming the file, UsageError when `output` exists and not
    `force`."""
    if not paths:
        raise BadInputError("no file given", "pass snapshots (torch.cuda.memory._dump_snapshot) or Chrome traces")
    output = Path(output) if output is not None else default_output(paths[0])
    if not force and os.path.lexists(output):
        raise UsageError(f"{output} exists", "choose another -o path or pass --force")
    interner, converted, seq = FrameInterner(), [], 0
    for path in map(Path, paths):
        source, rows = _convert(path, interner, seq)
        converted.append((path, source, rows))
        seq += len(rows.events["ts_ns"])
    devices = sorted({d for _, _, rows in converted for d in rows.stats["devices"]})
    if len(devices) > MAX_DEVICES:
        raise BadInputError(f"the files name {len(devices)} devices, more than the {MAX_DEVICES} a recording holds",
                            "import the files of one machine's job, as torch.cuda.memory._dump_snapshot wrote them")
    _write(output, _meta(converted), converted, force)
    return ImportResult(path=output, files=len(converted), events=seq, devices=devices, warnings=_overlaps(converted))


def _write(output: Path, meta: RecordingMeta, converted: list[tuple[Path, str, SnapshotRows]], force: bool) -> None:
    """Write the recording under a hidden sibling name, then rename it to `output` (replacing
    an old recording there only with `force`, as RecordingWriter does). On any failure the
    temporary recording is removed and `output` is as it was. Raises MemprofError when the
    recording cannot be written (OSError), UsageError when `output` cannot be replaced."""
    temporary = output.parent / f".{output.name}.import-{secrets.token_hex(6)}"
    try:
        writer = RecordingWriter(temporary, meta)
        for path, _, rows in converted:
            try:
                _append(writer, rows)
            except ValueError as e:  # a value the file holds that no column can store
                raise BadInputError(f"{path}: {e}", "the file is damaged, or was not written by torch") from None
            writer.flush()
        writer.finalize()
        _move_into_place(temporary, output, force)
    except OSError as e:  # disk full, quota, a folder gone: nothing was written
        raise MemprofError(f"cannot write {output}: {e.strerror or e}",
                           "free some space, or choose another -o path") from None
    finally:
        if os.path.lexists(temporary):
            shutil.rmtree(temporary, ignore_errors=True)


def _move_into_place(temporary: Path, output: Path, force: bool) -> None:
    """Rename the complete recording at `temporary` to `output`. Raises UsageError."""
    if os.path.lexists(output):
        if not force:
            raise UsageError(f"{output} exists", "choose another -o path or pass --force")
        from memprof.recording.writer import clear_for_new_recording  # the one rule for what --force may replace
        clear_for_new_recording(output, True, os.geteuid())
    try:
        os.rename(temporary, output)
    except OSError as e:
        raise UsageError(f"cannot create {output}: {e.strerror}", "choose another -o path") from e


def _convert(path: Path, interner: FrameInterner, seq_start: int) -> tuple[str, SnapshotRows]:
    """(source name, rows) of one file."""
    data = read_input(path)
    if data.lstrip()[:1] == b"{":
        source, loaded = PROFILER, _json(data, path)
    else:
        source, loaded = SNAPSHOT, loads_plain(data, str(path))
    _check_items(loaded, len(data), path)
    convert = profiler_rows if source == PROFILER else snapshot_rows
    try:
        return source, convert(loaded, realtime_ns, interner=interner, seq_start=seq_start)
    except BadInputError as e:
        raise type(e)(f"{path}: {e.message}", e.hint) from None


def _check_items(loaded, size: int, path: Path) -> None:
    """Raise BadInputError when the file holds more items than BYTES_PER_ITEM allows."""
    items = _items(loaded)
    if items > max(_MIN_ITEMS, size // BYTES_PER_ITEM):
        raise BadInputError(
            f"{path}: {items:,} entries in {size:,} bytes, more than one per {BYTES_PER_ITEM} bytes: not a file "
            "torch wrote (entries shared by reference, or empty ones)",
            "pass a file written by torch.cuda.memory._dump_snapshot or torch.profiler's export_chrome_trace")


def _items(loaded) -> int:
    """Trace entries, blocks, segments, annotations and Chrome trace events in a loaded file."""
    if isinstance(loaded, list):
        loaded = {"segments": loaded}
    if not isinstance(loaded, dict):
        return 0
    lists = [loaded.get("traceEvents"), loaded.get("segments"), loaded.get("external_annotations")]
    traces = loaded.get("device_traces")
    lists += traces if isinstance(traces, list) else []
    segments = loaded.get("segments") if isinstance(loaded.get("segments"), list) else []
    lists += [s.get("blocks") for s in segments if isinstance(s, dict)]
    return len(lists) + sum(len(x) for x in lists if isinstance(x, list))


def _json(data: bytes, path: Path):
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as e:
        why = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise BadInputError(f"{path}: not valid JSON ({why})",
                            "pass a file written by torch.profiler's export_chrome_trace") from None


def _append(writer: RecordingWriter, rows: SnapshotRows) -> None:
    for table, columns in (("events", rows.events), ("stacks", rows.stacks), ("frames", rows.frames)):
        if columns and len(next(iter(columns.values()))):
            writer.append(table, columns)


def _meta(converted: list[tuple[Path, str, SnapshotRows]]) -> RecordingMeta:
    firsts = [r.stats["first_ns"] for _, _, r in converted if r.stats["first_ns"] is not None]
    lasts = [r.stats["last_ns"] for _, _, r in converted if r.stats["last_ns"] is not None]
    notes = [CLOCK_NOTE]
    for path, _, rows in converted:
        prefix = f"{path.name}: " if len(converted) > 1 else ""
        notes += [prefix + note for note in rows.stats["notes"]]
    notes += _overlaps(converted)
    sources = {}
    for source in (SNAPSHOT, PROFILER):
        files = [{"path": str(path), **{k: v for k, v in rows.stats.items() if k != "notes"}}
                 for path, kind, rows in converted if kind == source]
        if files:
            detail = {"files": files, "entries": sum(f["entries"] for f in files),
                      "devices": sorted({d for f in files for d in f["devices"]})}
            sources[source] = SourceStats(events=sum(f["events"] for f in files), timestamp_precision_ns=1000,
                                          detail=detail)
    return RecordingMeta(memprof_version=__version__, command=None, pid=None, clock=CLOCK,
                         start_ns=min(firsts, default=0), end_ns=max(lasts, default=0), notes=notes, sources=sources)


def _overlaps(converted: list[tuple[Path, str, SnapshotRows]]) -> list[str]:
    """Warnings for files whose traces cover the same time on the same device: two snapshots
    of one process repeat events, and two processes' addresses would pair with each other."""
    warnings = []
    for i, (a_path, _, a) in enumerate(converted):
        for b_path, _, b in converted[i + 1:]:
            shared = sorted(set(a.stats["devices"]) & set(b.stats["devices"]))
            if shared and _spans_meet(a.stats, b.stats):
                warnings.append(
                    f"{a_path.name} and {b_path.name} cover the same time on {', '.join(shared)}: snapshots of one "
                    "process repeat each other's trace (import the latest alone), and snapshots of different "
                    "processes should be imported into separate recordings")
    return warnings


def _spans_meet(a: dict, b: dict) -> bool:
    if a["first_ns"] is None or b["first_ns"] is None:
        return True  # no times: nothing tells them apart
    return a["first_ns"] <= b["last_ns"] and b["first_ns"] <= a["last_ns"]
