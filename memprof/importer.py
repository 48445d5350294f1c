"""`memprof import`: PyTorch CUDA memory snapshots and torch.profiler Chrome traces → a
recording every report reads.

A file whose content starts with `{` is a Chrome trace (JSON, memprof/sources/torch_profiler.py);
any other is a snapshot pickle, loaded without running anything it names
(memprof/sources/safe_pickle.py) and converted by memprof/sources/torch_snapshot.py. Both may
be gzip-compressed. Only when every file has been read is the recording written, so a bad file
leaves nothing behind. Times stay the files' own: epoch ns (CLOCK_REALTIME), recorded as
`meta.clock`; a snapshot's rows have pid and tid 0 (it records neither).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from memprof import __version__
from memprof.errors import BadInputError
from memprof.model import RecordingMeta, SourceStats
from memprof.recording import RecordingWriter
from memprof.sources.frame_interner import FrameInterner
from memprof.sources.safe_pickle import loads_plain, read_input
from memprof.sources.torch_profiler import profiler_rows
from memprof.sources.torch_snapshot import SnapshotRows, realtime_ns, snapshot_rows

SNAPSHOT, PROFILER = "torch_snapshot", "torch_profiler"
CLOCK = "CLOCK_REALTIME"
CLOCK_NOTE = ("imported: times are the files' own epoch clock (CLOCK_REALTIME ns, to the microsecond), not "
              "CLOCK_MONOTONIC; a CUDA snapshot's events have pid and tid 0 (it records neither)")
_SUFFIXES = (".gz", ".pickle", ".pkl", ".json")


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
    interner, converted, seq = FrameInterner(), [], 0
    for path in map(Path, paths):
        source, rows = _convert(path, interner, seq)
        converted.append((path, source, rows))
        seq += len(rows.events["ts_ns"])
    output = Path(output) if output is not None else default_output(paths[0])
    meta = _meta(converted)
    writer = RecordingWriter(output, meta, force=force)
    for _, _, rows in converted:
        _append(writer, rows)
        writer.flush()
    writer.finalize()
    devices = sorted({d for _, _, rows in converted for d in rows.stats["devices"]})
    return ImportResult(path=output, files=len(converted), events=seq, devices=devices, warnings=_overlaps(converted))


def _convert(path: Path, interner: FrameInterner, seq_start: int) -> tuple[str, SnapshotRows]:
    """(source name, rows) of one file."""
    data = read_input(path)
    if data.lstrip()[:1] == b"{":
        source, loaded = PROFILER, _json(data, path)
    else:
        source, loaded = SNAPSHOT, loads_plain(data, str(path))
    convert = profiler_rows if source == PROFILER else snapshot_rows
    try:
        return source, convert(loaded, realtime_ns, interner=interner, seq_start=seq_start)
    except BadInputError as e:
        raise type(e)(f"{path}: {e.message}", e.hint) from None


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
