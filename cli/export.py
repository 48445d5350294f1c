"""`memprof export`: a recording in other tools' formats (timeline viewers, flame graphs,
profile viewers, tables)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import click

from memprof.cli.common import analysed, native_frames_option, max_memory_option

if TYPE_CHECKING:
    from memprof.api import Analysed

# memprof.report.exports.FORMATS (kept here so `memprof --help` does not import pandas).
FORMAT_CHOICES = ("perfetto", "chrome-trace", "speedscope", "pprof", "folded", "csv", "parquet")
# What writes every event: refused on a recording folded to fit --max-memory (its events are
# the recording's own Parquet parts, which DuckDB and pyarrow read as they are). speedscope,
# pprof and folded read the live chains at the end and at the peaks, which a fold keeps, and
# (pprof) what each chain allocated, which it counts; perfetto and chrome-trace draw each
# layer's curve through the moments a fold kept (Fold.instants_ns), exact there.
EVERY_EVENT = ("csv", "parquet")


@click.command()
@click.argument("path", required=False, type=click.Path(path_type=str))
@click.option("--format", "fmt", required=True, type=click.Choice(FORMAT_CHOICES), help="The format to write (below).")
# readable=False: an output is not read, and whatever is at its name (a link too) is replaced.
@click.option("-o", "--output", type=click.Path(readable=False, path_type=str),
              help="The file to write (csv and parquet: the directory; '-': stdout, for the single-file formats). "
                   "Default: next to the recording, RECORDING.pftrace, .trace.json, .speedscope.json, .pb.gz, "
                   ".folded or .export/.")
@click.option("--max-points", default=20_000, show_default=True, type=click.IntRange(min=2),
              help="perfetto and chrome-trace: at most this many points per counter track; the highest point "
                   "of each stretch is kept, so peaks survive.")
@native_frames_option
@max_memory_option
def export(path, fmt, output, max_points, native_frames):
    """Write a recording (default: the newest in the current directory) in another tool's format.

    \b
    perfetto      Perfetto trace (protobuf): live bytes per layer and device and the sampled
                  RSS/GPU metrics as counter tracks, OOMs, steps and memprof.mark labels as
                  instants, process and thread names.   Open in ui.perfetto.dev.
    chrome-trace  the same as Chrome trace-event JSON.  chrome://tracing, ui.perfetto.dev.
    speedscope    live bytes by chain at the end and at each layer's peak, two profiles.
                                                        www.speedscope.app.
    pprof         gzipped profile.proto: inuse_space/inuse_objects (live at the end) and
                  alloc_space/alloc_objects (every allocation).
                                                        go tool pprof -http=: FILE.
    folded        folded stacks of live bytes at the end (as `report chains --flame`).
                                                        flamegraph.pl, inferno, speedscope.
    csv, parquet  a directory: events (the merged timeline), marks (steps and memprof.mark
                  labels) and findings (`report leaks`).
                                                        pandas, DuckDB, a spreadsheet.

    Times are CLOCK_MONOTONIC ns of the recording host (chrome-trace: µs), sizes bytes. Layers
    nest (a tensor lives in the heap, a slab in pages): every format keeps them apart — one
    track per layer, the layer as each stack's root frame, pprof's `layer` label — so never
    add them up. A recording without events gives a valid, empty export (and a warning).
    A recording folded to fit --max-memory is exported as speedscope, pprof or folded as a
    whole one would be; as perfetto or chrome-trace with each layer's curve drawn through
    the moments the fold kept (steps, exits, the end, each peak) and its highest and lowest
    point in each of 500 even stretches between them (exact, a warning says so); csv and parquet need every
    event and refuse it (exit 2): its events/ folder is Parquet already, for DuckDB or pyarrow.
    """
    from memprof.cli import console, output as out
    from memprof.errors import UsageError
    from memprof.report.exports import FORMATS, TABULAR

    if out.to_stdout(output) and fmt in TABULAR:
        raise UsageError(f"{fmt} writes a directory of three files, not stdout", "give -o a directory, or leave it out")
    out.check_stdout(output, binary=FORMATS[fmt].binary)
    a = analysed(path, curves=fmt in ("perfetto", "chrome-trace"))
    if fmt in EVERY_EVENT:
        _every_event(a, fmt)
    if (len(a.events) if a.fold is None else a.fold.events) == 0:
        console.warning(f"{a.rec.path} has no events: the export holds no memory curves or chains")
    target = output or str(a.rec.path).rstrip("/") + FORMATS[fmt].suffix
    options = _Options(native_frames, max_points)
    build, stages = _RENDERERS[fmt]
    with console.progress(stages=stages) as stage:  # after the analysis's own stages (memprof.api.analyse)
        data = build(a, options, stage, Path(target)) if fmt in TABULAR else build(a, options, stage)
    if fmt in TABULAR:
        out.wrote(target, f"{fmt}: {', '.join(path.name for path in data)}; open with {FORMATS[fmt].viewer}")
    else:
        out.write(target, data, detail=f"{fmt}: open with {FORMATS[fmt].viewer}", binary=FORMATS[fmt].binary)


@dataclass(frozen=True)
class _Options:
    """The user's options every format may read."""

    native_frames: str
    max_points: int


def _every_event(a: Analysed, fmt: str) -> None:
    """Refuse `fmt` (csv, parquet: every event) on a folded recording, FoldedRecordingError
    (exit 2), pointing at the recording's own Parquet events too."""
    from memprof.errors import FoldedRecordingError
    try:
        a.every_event(f"`memprof export --format {fmt}`")
    except FoldedRecordingError as e:
        e.hint += (f"; its events are Parquet already ({a.rec.path}/events/*.parquet): DuckDB or pyarrow read "
                   "them as they are (README: the recordings are a dataset)")
        raise


def _timeline(a: Analysed, options: _Options, stage):
    from memprof.analysis.series import export_timeline
    from memprof.cli import console
    stage("building the curves and instants of the timeline")
    at_ns = None
    if a.fold is not None:
        from memprof.api import folded_curves_note
        at_ns = a.fold.instants_ns
        console.warning(f"{a.rec.path} is folded to fit --max-memory. {folded_curves_note(a.fold)}")
    return export_timeline(a.lifetimes, a.events, a.rec.samples, start_ns=a.rec.meta.start_ns,
                           end_ns=a.span.recording_end_ns, max_points=options.max_points, at_ns=at_ns,
                           extremes=None if a.fold is None else a.fold.curve_extremes)


def _perfetto(a: Analysed, options: _Options, stage) -> bytes:
    from memprof.report.exports.perfetto import perfetto_trace
    timeline = _timeline(a, options, stage)
    stage("encoding the Perfetto trace")
    return perfetto_trace(timeline, a.rec.meta.processes, root_pid=a.rec.meta.pid)


def _chrome_trace(a: Analysed, options: _Options, stage) -> bytes:
    from memprof.report.exports.chrome_trace import chrome_trace
    timeline = _timeline(a, options, stage)
    stage("encoding the Chrome trace")
    return json.dumps(chrome_trace(timeline, a.rec.meta.processes, root_pid=a.rec.meta.pid)).encode()


def _live(a: Analysed, options: _Options, at: str):
    """Every live chain of each layer at `at` ("end" or "peak"), with their frames."""
    return a.attribution(by="chain", at=at, top=None, native_frames=options.native_frames)


def _speedscope(a: Analysed, options: _Options, stage) -> bytes:
    from memprof import __version__
    from memprof.report.exports.speedscope import speedscope_file
    stage("finding who held the live bytes at the end and at each layer's peak, and their frames")
    views = [("live bytes at the end", _live(a, options, "end")),
             ("live bytes at each layer's peak", _live(a, options, "peak"))]
    chains = {stack_id: frames for _, view in views for stack_id, frames in view.chains.items()}
    document = speedscope_file([(name, view.result) for name, view in views], chains,
                               name=Path(str(a.rec.path)).name, exporter=f"memprof@{__version__}")
    return json.dumps(document).encode()


def _pprof(a: Analysed, options: _Options, stage) -> bytes:
    from memprof.analysis.chains import chain_frame_ids
    from memprof.analysis.series import chain_totals
    from memprof.report.exports.pprof import pprof_profile
    stage("totalling the bytes each chain held at the end and allocated in all")
    totals = chain_totals(a.lifetimes, end_ns=a.span.end_ns, canonical_stack=a.canonical)
    stage(f"reading the frames of {totals['stack_id'].nunique():,} chains")
    chain_rows = chain_frame_ids(a.rec.stacks, a.rec.frames, totals["stack_id"], options.native_frames)
    stage(f"encoding {len(totals):,} pprof samples")
    return pprof_profile(totals, chain_rows, a.rec.frames, duration_ns=a.span.recording_end_ns - a.span.start_ns,
                         time_nanos=_epoch_ns(a.rec.meta))


def _folded(a: Analysed, options: _Options, stage) -> bytes:
    from memprof.report.attribution import folded_stacks
    stage("finding who held the live bytes at the end, and their frames")
    view = _live(a, options, "end")
    return "".join(line + "\n" for line in folded_stacks(view.result, view.chains)).encode()


def _epoch_ns(meta) -> int:
    """The recording's start in ns since the epoch (pprof's time_nanos); 0 when unknown."""
    if meta.clock == "CLOCK_REALTIME":
        return int(meta.start_ns)
    if not meta.clock_anchors:
        return 0
    anchor = meta.clock_anchors[0]
    return int(meta.start_ns + anchor.realtime_ns - anchor.monotonic_ns)


def _write_tables(a: Analysed, options: _Options, stage, directory: Path, *, fmt: str) -> list[Path]:
    """Write the events, marks and findings tables into `directory`; the files written. The
    findings are `report leaks`' with its defaults and no --top."""
    from memprof.analysis.series import instants, marks_table
    from memprof.errors import MemprofError
    from memprof.report.exports.tabular import findings_frame, write_tables
    stage("judging leaks for the findings table")
    leaks = a.leaks(top=None, native_frames=options.native_frames)
    tables = {"events": a.events, "marks": marks_table(instants(a.events)),
              "findings": findings_frame(leaks.result, leaks.chains)}
    stage(f"writing {len(a.events):,} events as {fmt}")
    try:
        return write_tables(tables, directory, fmt)
    except OSError as e:  # memprof.safe_output.UnsafeOutputError (a link there) passes as it is
        raise MemprofError(f"cannot write {directory}: {e.strerror or e}",
                           "choose a writable directory with -o") from None


# format -> (what builds it, how many progress stages that takes)
_RENDERERS = {"perfetto": (_perfetto, 2), "chrome-trace": (_chrome_trace, 2), "speedscope": (_speedscope, 1),
              "pprof": (_pprof, 3), "folded": (_folded, 1),
              "csv": (partial(_write_tables, fmt="csv"), 2),
              "parquet": (partial(_write_tables, fmt="parquet"), 2)}
