"""Opening a recording too large to analyse whole, in bounded memory (issue 23, item 2).

`api.analyse` reads a recording whole when its analysis fits `max_memory`
(`estimated_bytes`), and folds it here when it does not: its allocation rows are read part
by part in time order (recording.stream), paired as they come (analysis.fold.PairingStream),
and only the allocations some moment of judgement needs are kept (analysis.fold.FoldPlan).
One pass over the parts (after one for the marks): each layer's peak is tracked as the
batches come (analysis.fold.PeakTracker); what only a superseded peak needed is dropped.

Memory: the rows other than allocations (marks, module boundaries), the stacks and frames,
the live set, the kept allocations, and one part at a time; not the number of events.
Times are CLOCK_MONOTONIC ns, sizes bytes.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import numpy as np

from memprof.analysis.fold import (
    Fold, FoldPlan, FoldTotals, PairingStream, PeakTracker, fold_instants, folded_lifetimes, leak_checkpoints,
    named_model_state, process_sample_ends,
)
from memprof.analysis.gpu import folded_times
from memprof.analysis.leaks import end_of_target
from memprof.analysis.lifetimes import Lifetimes, exec_times
from memprof.analysis.regions import marks_with_numbers
from memprof.analysis.ranks import process_ranks
from memprof.recording.reader import NOT_FINALIZED_NOTE, Recording, read_meta, read_table
from memprof.recording.stream import EventPart, other_events, paired_batches
from memprof.timeline import annotated_batch, in_time_order, with_steps

# What the whole analysis (api.analyse: the events frame, the timeline, the lifetimes and the
# views) takes per event at its peak: bench/RESULTS.md, "Analysis speed" (10^7 events, 1.6 GB).
BYTES_PER_EVENT = 170
# Of the memory available when no --max-memory is given: the rest is for the page cache and
# for what else runs.
AVAILABLE_SHARE = 0.75


def estimated_bytes(parts: list[EventPart]) -> int:
    """The memory the whole analysis of a recording with these events parts would take."""
    return BYTES_PER_EVENT * sum(part.rows for part in parts)


def default_limit() -> int:
    """AVAILABLE_SHARE of the memory available now (/proc/meminfo MemAvailable; without it,
    of the physical memory)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(AVAILABLE_SHARE * int(line.split()[1]) * 1024)
    except OSError:
        pass
    return int(AVAILABLE_SHARE * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def analyse_folded(path: Path, parts: list[EventPart], limit_bytes: int,
                   stage: Callable[[str], None], keep_at_ns: tuple[int, ...] = (),
                   window_ns: int | None = None, gpu_points: int | None = None,
                   regions: bool = False, advice: bool = False,
                   curves: bool = False) -> tuple[Recording, Lifetimes, Fold]:
    """The recording at `path` (events `parts`) folded: (the recording with `events` its rows
    other than allocations and frees, in time order, with steps; the kept lifetimes; how it
    was folded). `keep_at_ns`: more moments, ns after the start, whose live allocations it
    keeps; `window_ns`: the leak analysis's windows, as `report leaks --window` gives them;
    `gpu_points`: keep what is live at that many over-time points of `report gpu`
    (analysis.gpu.folded_times; each GPU's peak is always kept); `regions`: keep what is live
    at each region's start and at each (layer, device)'s peak inside it (`report regions`);
    `advice`: keep what the advice rules read too, beyond those (each sampled process's first
    and last sample: fold.process_sample_ends); the caller asks for the regions and the
    `report gpu` points the rules read with it (api.analyse); `curves`: track each (layer,
    device)'s highest and lowest point between two of the moments kept, and in each of
    CURVE_STRETCHES even stretches of the recording (Fold.curve_extremes), for the curves of
    the page and the trace exports.
    BadRecordingError (exit 5) for a damaged part, as open_recording."""
    meta = read_meta(path)
    if meta.status != "complete":
        meta.notes.append(NOT_FINALIZED_NOTE)
    events = sum(part.rows for part in parts)
    stage(f"reading the marks of {events:,} events (folding: the whole analysis would not fit)")
    others = with_steps(in_time_order(other_events(parts)))
    if not meta.end_ns:  # not finalized: the recording ends at its last event (overview.recording_end_ns),
        # and its events here lack the allocations
        meta.end_ns = max([p.last_ts_ns for p in parts if p.rows] + [int(meta.start_ns)])
    end_ns = int(meta.end_ns)
    target_end_ns = end_of_target(others, meta.pid, end_ns)
    stage("pairing and keeping what the analyses judge, part by part")
    # A rank's peak is that of its processes together (ranks.rank_report): tracked too.
    ranks = {pid: f"{info['rank']}@{info.get('host')}" for pid, info in process_ranks(meta).items()}
    checkpoints = leak_checkpoints(others, start_ns=int(meta.start_ns), target_end_ns=target_end_ns,
                                   window_ns=window_ns)
    instants = fold_instants(others, end_ns=end_ns, target_end_ns=target_end_ns, checkpoints=checkpoints)
    instants = np.union1d(instants, np.asarray(keep_at_ns, dtype=np.int64) + int(meta.start_ns))
    gpu_times = folded_times(others, int(meta.start_ns), end_ns, gpu_points) if gpu_points else np.array([], np.int64)
    instants = np.union1d(instants, gpu_times)
    samples = read_table(path, "samples")
    bounds = _region_bounds(others, samples, target_end_ns) if regions else None
    if bounds is not None:
        instants = np.union1d(instants, bounds[:-1])
    if advice:
        instants = np.union1d(instants, process_sample_ends(samples))
    peaks = PeakTracker(ranks, bounds, stretch_edges=_curve_edges(instants, int(meta.start_ns), end_ns) if curves else None)
    stream, totals = PairingStream(exec_times(others)), FoldTotals()
    kept: list = []
    for batch in paired_batches(parts):
        batch = annotated_batch(batch, others)
        ended = stream.feed(batch)
        known = peaks.times()
        peaks.add(batch, ended)
        now = peaks.times()
        plan = FoldPlan(np.union1d(instants, now))
        if not np.array_equal(known, now):
            kept = _pruned(kept, plan, totals)
        keep = plan.keep(ended)
        kept.append(ended[keep])
        totals.add_dropped(ended[~keep])
    kept.append(stream.finish())
    lifetimes = folded_lifetimes(kept, stream, totals)
    lifetimes.allocations = named_model_state(lifetimes.allocations, others)
    fold = Fold(events=events, needed_bytes=estimated_bytes(parts), limit_bytes=int(limit_bytes),
                kept=len(lifetimes.allocations), dropped_count=dict(totals.dropped_count),
                dropped_bytes=dict(totals.dropped_bytes), kept_at_ns=tuple(sorted(set(keep_at_ns))),
                window_ns=window_ns, window_ends_ns=_window_ends(checkpoints), gpu_points=gpu_points,
                gpu_times_ns=tuple(int(t) for t in gpu_times), regions=regions,
                advice=advice, instants_ns=tuple(np.union1d(instants, peaks.times()).tolist()),
                curve_extremes=peaks.stretch_extremes())
    meta.notes.append(fold.note)
    tables = {name: read_table(path, name) for name in ("stacks", "frames")}
    return Recording(path=path, meta=meta, events=others, samples=samples, **tables), lifetimes, fold


CURVE_STRETCHES = 500  # evenly spaced stretches of a folded curve: its highest and lowest point in each are kept


def _curve_edges(instants: np.ndarray, start_ns: int, end_ns: int) -> np.ndarray:
    """Where a folded curve's stretches begin (PeakTracker's stretch_edges): the moments kept
    and CURVE_STRETCHES evenly spaced times over the recording, so that the curve drawn
    through each stretch's highest and lowest point has the resolution of a whole one's on
    the page (series.downsample_max keeps about as many points), however sparse the moments."""
    grid = np.linspace(start_ns, max(end_ns, start_ns + 1), CURVE_STRETCHES + 1).astype(np.int64)
    return np.union1d(instants, grid)


def _region_bounds(others, samples, target_end_ns: int) -> np.ndarray | None:
    """Where `report regions`' regions begin, and last where the last ends (analysis.regions:
    the target's end); None without regions."""
    starts = marks_with_numbers(others, samples)["ts_ns"].to_numpy(dtype=np.int64)
    if len(starts) == 0:
        return None
    return np.append(starts, max(int(target_end_ns), int(starts[-1])))


def _window_ends(checkpoints) -> tuple[int, ...]:
    """The window ends among the leak analysis's checkpoints (none when it judges at steps)."""
    if checkpoints is None or checkpoints.by_step:
        return ()
    return tuple(int(t) for t in checkpoints.times_ns)


def _pruned(kept: list, plan: FoldPlan, totals: FoldTotals) -> list:
    """`kept` (frames of allocations) without those only an earlier, lower peak needed: a
    layer's new peak supersedes its old one for good (PeakTracker keeps the highest), so what
    was live only then is dropped now (counted in `totals`), and memory stays that of the
    moments still judged."""
    out = []
    for frame in kept:
        keep = plan.keep(frame)
        totals.add_dropped(frame[~keep])
        out.append(frame[keep] if not keep.all() else frame)
    return out
