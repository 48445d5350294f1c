"""Checkpoints: the same point of successive steps (or fixed time windows when the recording
has no step marks), and each chain's live bytes at every one of them.

Several processes that each mark their own steps (torchrun's ranks) step at their own pace:
each is then read at its own marks of the same step numbers (`Checkpoints.by_pid`), so a
rank's allocations are judged against that rank's steps, not the first rank's.

Pure functions; no I/O. Times are CLOCK_MONOTONIC ns, sizes bytes (weighted for sampled
allocations).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np
import pandas as pd

from memprof.model.schema import Action, Mark

DEFAULT_WINDOWS = 32
MAX_CHECKPOINTS = 128  # keeps the pairwise trend statistics at ≤ 8,128 pairs per chain


@dataclass(frozen=True)
class Checkpoints:
    """Where series are read: `times_ns` ascending.

    `by_step` True: each time is a step mark and `labels` its step number; False: the ends of
    fixed windows (`labels` 1..K) because the recording has too few step marks.
    `period_ns` is the time between checkpoints (ns per step, or the window; thinned step
    marks: the median time per mark times the marks per checkpoint).

    `by_pid` (None: one clock of steps for every allocation): pid -> that process's own mark
    of each step in `labels`, for the processes that marked every one of them; `times_ns` is
    then the earliest of their marks of each step (where the processes without step marks of
    their own, a launcher, are read) and `period_ns` the median of each one's step time."""

    times_ns: np.ndarray
    labels: np.ndarray
    by_step: bool
    period_ns: float
    by_pid: Mapping[int, np.ndarray] | None = None

    @property
    def unit(self) -> str:
        return "step" if self.by_step else "window"

    @property
    def units_per_point(self) -> float:
        """Steps (or windows) from one checkpoint to the next, on average: a slope per
        checkpoint (trend.theil_sen's) divided by this is per step. 1 for windows and for
        every step marked; more where find_checkpoints thinned the marks to MAX_CHECKPOINTS
        (143 steps read at 128 checkpoints: 1.118) or the program marked every k-th step."""
        if not self.by_step or len(self.labels) < 2 or self.labels[-1] <= self.labels[0]:
            return 1.0
        return float(self.labels[-1] - self.labels[0]) / (len(self.labels) - 1)


def find_checkpoints(events: pd.DataFrame, *, start_ns: int, end_ns: int, min_points: int,
                     window_ns: int | None = None, max_points: int = MAX_CHECKPOINTS) -> Checkpoints | None:
    """Step marks at or before `end_ns` when there are at least `min_points` of them (one per
    step number, its first mark; evenly thinned to `max_points`, keeping the last); else
    windows of `window_ns` (default: [start_ns, end_ns] cut in DEFAULT_WINDOWS) ending in
    (start_ns, end_ns]. None when even windows give fewer than `min_points`.

    Where two processes or more each marked `min_points` steps or more (ranks of a job), the
    steps they all marked, each process at its own marks (_per_process)."""
    marks = process_step_marks(events)
    marks = marks[marks["ts_ns"] <= end_ns]
    own = _per_process(marks, min_points, max_points)
    if own is not None:
        return own
    steps = marks.groupby("step", sort=True, as_index=False)["ts_ns"].min()
    steps = steps.sort_values("ts_ns", kind="stable")
    if len(steps) >= min_points:
        keep = _thinned(len(steps), max_points)
        times, labels = steps["ts_ns"].to_numpy()[keep], steps["step"].to_numpy()[keep]
        return Checkpoints(times, labels, True, _period(steps["ts_ns"].to_numpy(), len(keep)))
    span = end_ns - start_ns
    window = int(window_ns) if window_ns else span // DEFAULT_WINDOWS
    if window <= 0 or span // window < min_points:
        return None
    count = min(int(span // window), max_points)
    times = start_ns + window * np.arange(1, count + 1, dtype=np.int64) * (span // window) // count
    return Checkpoints(times, np.arange(1, count + 1), False, _median_gap(times))


def step_marks(events: pd.DataFrame) -> pd.DataFrame:
    """Step marks as (step, ts_ns), sorted by step: each step number once, at its earliest
    mark (several processes, e.g. torchrun's ranks, mark the same steps)."""
    marks = process_step_marks(events)
    return marks.groupby("step", sort=True, as_index=False)["ts_ns"].min()[["step", "ts_ns"]]


def first_step_end_ns(events: pd.DataFrame) -> int | None:
    """When the job's first step ended: the earliest mark of a step past step 0, of any
    process (the agent marks step 0 when torch is imported, step 1 when the first step
    ends); None without such a mark. However few steps there are: a job of five steps has a
    set-up as much as one of five hundred."""
    marks = process_step_marks(events)
    later = marks["ts_ns"].to_numpy(dtype=np.int64)[marks["step"].to_numpy() >= 1]
    return int(later.min()) if len(later) else None


def process_step_marks(events: pd.DataFrame) -> pd.DataFrame:
    """Step marks as (pid, step, ts_ns), sorted by pid then step: each process's mark of each
    step number once, its earliest."""
    if events is None or len(events) == 0 or "category" not in events:
        return pd.DataFrame({name: pd.Series([], dtype="int64") for name in ("pid", "step", "ts_ns")})
    is_step = ((events["action"] == Action.MARK.value) & (events["category"] == Mark.STEP.value)
               & events["step"].notna()).to_numpy()
    marks = pd.DataFrame({"pid": events["pid"].to_numpy(dtype=np.int64, na_value=-1)[is_step],
                          "step": events["step"].to_numpy()[is_step].astype(np.int64),
                          "ts_ns": events["ts_ns"].to_numpy()[is_step].astype(np.int64)})
    return marks.groupby(["pid", "step"], sort=True, as_index=False)["ts_ns"].min()


def _per_process(marks: pd.DataFrame, min_points: int, max_points: int) -> Checkpoints | None:
    """Checkpoints read per process (Checkpoints.by_pid) from `marks` (process_step_marks),
    when two processes or more marked `min_points` steps or more: the step numbers all of them
    marked (thinned to `max_points`). None when fewer than two processes did, when they share
    fewer than `min_points` step numbers, or when a process's marks are not in the order of
    their numbers (its steps cannot be lined up with the others')."""
    counts = marks.groupby("pid")["step"].size()
    stepping = counts.index[counts >= min_points]
    if len(stepping) < 2:
        return None
    table = marks[marks["pid"].isin(stepping)].pivot(index="step", columns="pid", values="ts_ns").dropna()
    if len(table) < min_points:
        return None
    times = table.to_numpy(dtype=np.int64)  # (steps, processes), steps ascending
    if (np.diff(times, axis=0) < 0).any():
        return None
    keep = _thinned(len(times), max_points)
    period = float(np.median([_period(times[:, j], len(keep)) for j in range(times.shape[1])]))
    times, labels = times[keep], table.index.to_numpy(dtype=np.int64)[keep]
    by_pid = {int(pid): np.ascontiguousarray(times[:, j]) for j, pid in enumerate(table.columns)}
    return Checkpoints(times.min(axis=1), labels, True, period, by_pid)


def _thinned(n: int, at_most: int) -> np.ndarray:
    if n <= at_most:
        return np.arange(n)
    return np.unique(np.linspace(0, n - 1, at_most).round().astype(np.int64))


def _median_gap(times: np.ndarray) -> float:
    return float(np.median(np.diff(times))) if len(times) > 1 else 0.0


def _period(marks: np.ndarray, kept: int) -> float:
    """The time from one checkpoint to the next, when `kept` of the step `marks` (ascending ns)
    are kept evenly: the median time between two marks, times the marks per checkpoint (the
    kept ones are 1 or 2 marks apart when thinned; their own median gap would say 2)."""
    if kept < 2:
        return _median_gap(marks)
    return _median_gap(marks) * (len(marks) - 1) / (kept - 1)


def live_by_group(group: np.ndarray, n_groups: int, alloc_ts: np.ndarray, end_ts: np.ndarray,
                  size: np.ndarray, times_ns: np.ndarray) -> np.ndarray:
    """(n_groups, len(times_ns)) live bytes: allocation i counts in row group[i] at every time
    t with alloc_ts[i] ≤ t < end_ts[i] (end_ts int64 max: never ended). `size` may be float
    (weighted). One pass: a difference array filled with bincount, then a cumulative sum."""
    first = np.searchsorted(times_ns, alloc_ts, side="left")
    stop = np.searchsorted(times_ns, end_ts, side="left")
    spans = first < stop
    return live_by_span(group[spans], n_groups, first[spans], stop[spans], np.asarray(size, dtype=float)[spans],
                        len(times_ns))


def live_by_span(group: np.ndarray, n_groups: int, first: np.ndarray, stop: np.ndarray, size: np.ndarray,
                 k: int) -> np.ndarray:
    """(n_groups, k) sums: allocation i adds size[i] to row group[i] at checkpoints first[i]
    to stop[i] − 1 (as checkpoint_spans gives them)."""
    width = k + 1
    weights = np.asarray(size, dtype=float)
    deltas = np.bincount(group * width + first, weights=weights, minlength=n_groups * width)
    deltas -= np.bincount(group * width + stop, weights=weights, minlength=n_groups * width)
    return np.cumsum(deltas.reshape(n_groups, width), axis=1)[:, :k]


def checkpoint_spans(checkpoints: Checkpoints, alloc_ts: np.ndarray, end_ts: np.ndarray,
                     pid: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows, first, stop) of the allocations live at one checkpoint or more: their positions
    (ascending), and for each the first checkpoint it is live at and the first after it (its
    span is [first, stop)); live at t means alloc_ts ≤ t < end_ts. An allocation of a process
    in `checkpoints.by_pid` is read at that process's own times (`pid`: each allocation's
    process, needed only then), any other at `times_ns`."""
    if not checkpoints.by_pid:
        return _spans(checkpoints.times_ns, alloc_ts, end_ts, None)
    own = np.zeros(len(alloc_ts), dtype=bool)
    parts = []
    for process, times in checkpoints.by_pid.items():  # a few ranks: one pass each
        rows = np.flatnonzero(pid == process)
        own[rows] = True
        parts.append(_spans(times, alloc_ts, end_ts, rows))
    parts.append(_spans(checkpoints.times_ns, alloc_ts, end_ts, np.flatnonzero(~own)))
    rows, first, stop = (np.concatenate(column) for column in zip(*parts))
    order = np.argsort(rows, kind="stable")
    return rows[order], first[order], stop[order]


def _spans(times: np.ndarray, alloc_ts: np.ndarray, end_ts: np.ndarray, rows: np.ndarray | None,
           chunk: int = 1 << 20) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """checkpoint_spans against one array of `times`, over `rows` (None: every allocation). In
    chunks: two int64 positions per allocation would be 80 MB of temporaries on 5·10^6
    allocations, where the few live at a checkpoint are all that is kept."""
    n = len(alloc_ts) if rows is None else len(rows)
    kept = []
    for start in range(0, n, chunk):
        at = slice(start, start + chunk) if rows is None else rows[start:start + chunk]
        first = np.searchsorted(times, alloc_ts[at], "left")
        stop = np.searchsorted(times, end_ts[at], "left")
        live = np.flatnonzero(first < stop)
        kept.append((live + start if rows is None else at[live], first[live], stop[live]))
    if not kept:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return tuple(np.concatenate(column) for column in zip(*kept))
