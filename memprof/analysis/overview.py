"""The analyses every view of a recording starts from, computed one way: the leak findings
as `memprof report leaks` shows them, and the one-screen summary of `memprof report`.

Pure functions over the timeline tables and the recording's metadata (model); no I/O.
Times are CLOCK_MONOTONIC ns, sizes bytes.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Iterable, Mapping

import pandas as pd

from memprof.analysis.attribution import Span
from memprof.analysis.caches import known_chains
from memprof.analysis.checkpoints import find_checkpoints, first_step_end_ns
from memprof.analysis.layers import LayerSummary, layer_summary
from memprof.analysis.leaks import (
    DEFAULT_MIN_AGE_NS, LeakResult, cut, end_of_target, exit_times, find_leaks, find_leaks_by_rank,
)
from memprof.analysis.lifetimes import Lifetimes
from memprof.analysis.loss import recording_notes, skipped_frees_by_layer, unseen_tasks
from memprof.analysis.ranks import rank_of_pid
from memprof.analysis.trend import MIN_POINTS
from memprof.errors import UsageError
from memprof.model import RecordingMeta

LEAK_BY = ("chain", "rank")  # how `report leaks --by` splits the findings


def recording_end_ns(meta: RecordingMeta, events: pd.DataFrame) -> int:
    """When the recording stopped: meta's end, else its last event, else its start."""
    if meta.end_ns:
        return int(meta.end_ns)
    return int(events["ts_ns"].max()) if len(events) else int(meta.start_ns)


def recording_span(meta: RecordingMeta, events: pd.DataFrame) -> Span:
    """The recording's moments every view judges at: its start, when its target began to exit
    (the end of the recording when it did not), and when the recording stopped."""
    end = recording_end_ns(meta, events)
    return Span(start_ns=int(meta.start_ns), end_ns=end_of_target(events, meta.pid, end), recording_end_ns=end)


def leak_report(meta: RecordingMeta, events: pd.DataFrame, lifetimes: Lifetimes, stacks: pd.DataFrame,
                frames: pd.DataFrame, *, canonical_stack: Mapping[int, int] | None = None,
                min_age_ns: int = DEFAULT_MIN_AGE_NS, layers: Iterable[str] | None = None, top: int | None = 10,
                window_ns: int | None = None, confidence: float = 0.99, by: str = "chain") -> LeakResult:
    """find_leaks judged at the target's end (its root process began to exit, else the end of
    the recording), with the chains recognized from their frames (caches.known_chains), the
    kernel's skipped frees per layer in `unconfirmed_frees`, and whether Python frames were
    read in `python_frames`.

    Growth is judged at step marks; without them, at windows of `window_ns` only when the
    target did not exit while recorded (a job that runs on): a command that exits has an end,
    and what it held there is the answer (a kernel's deferred frees piling up during a short
    run would read as growth).

    In a distributed job each finding names the ranks and hosts its allocations came from;
    `by` "rank" judges each rank apart (leaks.find_leaks_by_rank; UsageError, exit 2, for a
    recording without ranks)."""
    if by not in LEAK_BY:
        raise UsageError(f"leaks cannot be split by {by!r}", f"use --by {' or --by '.join(LEAK_BY)}")
    ranks = rank_of_pid(meta)
    if by == "rank" and not ranks:
        raise UsageError("no process of this recording had a rank, so its leaks cannot be split by rank",
                         "record the job's launcher (torchrun, srun, mpirun) under memprof record, or drop --by rank")
    wanted = list(layers) if layers else None
    end = recording_end_ns(meta, events)
    target_end = end_of_target(events, meta.pid, end)
    checkpoints = find_checkpoints(events, start_ns=meta.start_ns, end_ns=target_end, min_points=MIN_POINTS,
                                   window_ns=window_ns)
    if checkpoints is not None and not checkpoints.by_step and target_end < end:
        checkpoints = None
    options = dict(end_ns=target_end, recording_end_ns=end, min_age_ns=min_age_ns, layers=wanted, top=top,
                   end_by_pid=exit_times(events), canonical_stack=canonical_stack, checkpoints=checkpoints,
                   known=known_chains(stacks, frames), confidence=confidence, rank_of_pid=ranks or None,
                   setup_end_ns=first_step_end_ns(events), attached_pids=attached_pids(meta))
    result = find_leaks_by_rank(lifetimes, **options) if by == "rank" else find_leaks(lifetimes, **options)
    skipped = skipped_frees_by_layer(meta)
    result.unconfirmed_frees = {k: v for k, v in skipped.items() if not wanted or k in wanted}
    result.python_frames = python_frames_read(meta)
    result.heap_recorded = heap_recorded(meta)
    result.unseen_tasks = unseen_tasks(meta)
    return result


def attached_pids(meta: RecordingMeta) -> frozenset[int]:
    """The processes already running when the recording began: with `record --pid`, the one
    attached to and its descendants then (the process table's rows with no start time; the
    root of `record -- CMD` has none either, but it began under the recording)."""
    if meta.command:
        return frozenset()
    return frozenset(row["pid"] for row in meta.processes
                     if isinstance(row.get("pid"), int) and row.get("start_ns") is None)


def heap_recorded(meta: RecordingMeta) -> bool | None:
    """Whether the recording has the C library's heap (the eBPF source's native family);
    None when it says nothing of its families (not recorded with eBPF, or too old)."""
    ebpf = meta.sources.get("ebpf")
    families = ebpf.detail.get("families") if ebpf is not None else None
    return None if families is None else "native" in families


def python_frames_read(meta: RecordingMeta) -> bool | None:
    """True when the recording read Python frames for every interpreter it saw (as `memprof
    doctor` would say: supported), False when not for some, None when it says nothing of
    Python frames (no interpreter seen, or a recording from before they were recorded)."""
    seen = []
    for stats in meta.sources.values():
        python = stats.detail.get("python") or {}
        interpreters = python.get("interpreters") or {}
        seen += [python.get("enabled", True) and bool(note.get("frames")) for note in interpreters.values()]
    return all(seen) if seen else None


@dataclass
class Summary:
    """One screen about a recording: each layer's peak and end, the biggest findings, what
    was lost, and the notes every report carries. `duration_ns` runs from the recording's
    start to its end; `events` counts timeline rows."""

    duration_ns: int
    events: int
    layers: LayerSummary
    leaks: LeakResult
    lost_events: int
    notes: list[str] = field(default_factory=list)
    steps: int = 0
    advice: list = field(default_factory=list)  # advice.Advice, biggest saving first (memprof.api fills it)
    ranks: object = None  # ranks.RankReport of a distributed job (memprof.api fills it)


def summarize(meta: RecordingMeta, events: pd.DataFrame, lifetimes: Lifetimes, stacks: pd.DataFrame,
              frames: pd.DataFrame, samples: pd.DataFrame | None, *, canonical_stack: Mapping[int, int] | None = None,
              top: int = 3, leaks: LeakResult | None = None, layers: LayerSummary | None = None) -> Summary:
    """The summary, with at most `top` leak findings and one chain per layer; `leaks` (the
    leak_report with its default options and no cut) and `layers` (a layer_summary with one
    chain per layer or more), where the caller has them already."""
    leaks = (leak_report(meta, events, lifetimes, stacks, frames, canonical_stack=canonical_stack, top=top)
             if leaks is None else cut(leaks, top))
    if layers is None:
        layers = layer_summary(lifetimes, samples, canonical_stack=canonical_stack, top=1)
    else:  # its chains are biggest first: the first is the one top=1 would give
        layers = replace(layers, layers=[replace(stats, top_chains=stats.top_chains[:1]) for stats in layers.layers])
    steps = int(events["step"].dropna().nunique()) if "step" in events and len(events) else 0
    return Summary(duration_ns=recording_end_ns(meta, events) - int(meta.start_ns), events=len(events), layers=layers,
                   leaks=leaks, lost_events=meta.lost_events, notes=recording_notes(meta), steps=steps)
