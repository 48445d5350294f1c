"""`memprof import`: PyTorch CUDA memory snapshots → a recording every report reads.

Each file is loaded without running anything it names (memprof/sources/safe_pickle.py),
converted (memprof/sources/torch_snapshot.py), and only when every file has been read is the
recording written, so a bad file leaves nothing behind. Times stay the snapshot's own: epoch
ns (CLOCK_REALTIME), recorded as `meta.clock`; pid and tid are 0 (a snapshot has neither).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from memprof import __version__
from memprof.errors import BadInputError
from memprof.model import RecordingMeta, SourceStats
from memprof.recording import RecordingWriter
from memprof.sources.frame_interner import FrameInterner
from memprof.sources.safe_pickle import load_plain
from memprof.sources.torch_snapshot import SnapshotRows, realtime_ns, snapshot_rows

SOURCE = "torch_snapshot"
CLOCK = "CLOCK_REALTIME"
CLOCK_NOTE = ("imported from CUDA memory snapshots: times are the snapshot's own epoch clock (CLOCK_REALTIME "
              "ns, to the microsecond), not CLOCK_MONOTONIC; pid and tid are 0 (a snapshot records neither)")
_SUFFIXES = (".gz", ".pickle", ".pkl")


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
    """Convert the snapshot files at `paths` (rows appended file after file) into a recording
    at `output` (default: `default_output(paths[0])`). Raises BadInputError (UnsafeInputError
    for a pickle that names code) naming the file, UsageError when `output` exists and not
    `force`."""
    if not paths:
        raise BadInputError("no snapshot file given", "pass one or more files written by torch.cuda.memory._dump_snapshot")
    interner, converted, seq = FrameInterner(), [], 0
    for path in map(Path, paths):
        rows = _convert(path, interner, seq)
        converted.append((path, rows))
        seq += len(rows.events["ts_ns"])
    output = Path(output) if output is not None else default_output(paths[0])
    meta = _meta(converted)
    writer = RecordingWriter(output, meta, force=force)
    for _, rows in converted:
        _append(writer, rows)
        writer.flush()
    writer.finalize()
    devices = sorted({d for _, rows in converted for d in rows.stats["devices"]})
    return ImportResult(path=output, files=len(converted), events=seq, devices=devices, warnings=_overlaps(converted))


def _convert(path: Path, interner: FrameInterner, seq_start: int) -> SnapshotRows:
    snapshot = load_plain(path)
    try:
        return snapshot_rows(snapshot, realtime_ns, interner=interner, seq_start=seq_start)
    except BadInputError as e:
        raise type(e)(f"{path}: {e.message}", e.hint) from None


def _append(writer: RecordingWriter, rows: SnapshotRows) -> None:
    for table, columns in (("events", rows.events), ("stacks", rows.stacks), ("frames", rows.frames)):
        if columns and len(next(iter(columns.values()))):
            writer.append(table, columns)


def _meta(converted: list[tuple[Path, SnapshotRows]]) -> RecordingMeta:
    firsts = [r.stats["first_ns"] for _, r in converted if r.stats["first_ns"] is not None]
    lasts = [r.stats["last_ns"] for _, r in converted if r.stats["last_ns"] is not None]
    notes = [CLOCK_NOTE]
    for path, rows in converted:
        prefix = f"{path.name}: " if len(converted) > 1 else ""
        notes += [prefix + note for note in rows.stats["notes"]]
    notes += _overlaps(converted)
    files = [{"path": str(path), **{k: v for k, v in rows.stats.items() if k != "notes"}} for path, rows in converted]
    detail = {
        "files": files,
        "entries": sum(f["entries"] for f in files),
        "devices": sorted({d for f in files for d in f["devices"]}),
        "notes": notes[1:],
    }
    events = sum(f["events"] for f in files)
    return RecordingMeta(
        memprof_version=__version__, command=None, pid=None, clock=CLOCK,
        start_ns=min(firsts, default=0), end_ns=max(lasts, default=0), notes=notes,
        sources={SOURCE: SourceStats(events=events, timestamp_precision_ns=1000, detail=detail)},
    )


def _overlaps(converted: list[tuple[Path, SnapshotRows]]) -> list[str]:
    """Warnings for files whose traces cover the same time on the same device: two snapshots
    of one process repeat events, and two processes' addresses would pair with each other."""
    warnings = []
    for i, (a_path, a) in enumerate(converted):
        for b_path, b in converted[i + 1:]:
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
