"""Checkpoints: the same point of successive steps (or fixed time windows when the recording
has no step marks), and each chain's live bytes at every one of them.

Pure functions; no I/O. Times are CLOCK_MONOTONIC ns, sizes bytes (weighted for sampled
allocations).
"""
from __future__ import annotations

from dataclasses import dataclass

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
    `period_ns` is the median time between checkpoints (ns per step, or the window)."""

    times_ns: np.ndarray
    labels: np.ndarray
    by_step: bool
    period_ns: float

    @property
    def unit(self) -> str:
        return "step" if self.by_step else "window"


def find_checkpoints(events: pd.DataFrame, *, start_ns: int, end_ns: int, min_points: int,
                     window_ns: int | None = None, max_points: int = MAX_CHECKPOINTS) -> Checkpoints | None:
    """Step marks at or before `end_ns` when there are at least `min_points` of them (one per
    step number, its first mark; evenly thinned to `max_points`, keeping the last); else
    windows of `window_ns` (default: [start_ns, end_ns] cut in DEFAULT_WINDOWS) ending in
    (start_ns, end_ns]. None when even windows give fewer than `min_points`."""
    steps = step_marks(events)
    steps = steps[steps["ts_ns"] <= end_ns].sort_values("ts_ns", kind="stable")
    if len(steps) >= min_points:
        keep = _thinned(len(steps), max_points)
        times, labels = steps["ts_ns"].to_numpy()[keep], steps["step"].to_numpy()[keep]
        return Checkpoints(times, labels, True, _median_gap(times))
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
    if events is None or len(events) == 0 or "category" not in events:
        return pd.DataFrame({"step": pd.Series([], dtype="int64"), "ts_ns": pd.Series([], dtype="int64")})
    is_step = ((events["action"] == Action.MARK.value) & (events["category"] == Mark.STEP.value)
               & events["step"].notna()).to_numpy()
    marks = pd.DataFrame({"step": events["step"].to_numpy()[is_step].astype(np.int64),
                          "ts_ns": events["ts_ns"].to_numpy()[is_step].astype(np.int64)})
    return marks.groupby("step", sort=True, as_index=False)["ts_ns"].min()


def _thinned(n: int, at_most: int) -> np.ndarray:
    if n <= at_most:
        return np.arange(n)
    return np.unique(np.linspace(0, n - 1, at_most).round().astype(np.int64))


def _median_gap(times: np.ndarray) -> float:
    return float(np.median(np.diff(times))) if len(times) > 1 else 0.0


def live_by_group(group: np.ndarray, n_groups: int, alloc_ts: np.ndarray, end_ts: np.ndarray,
                  size: np.ndarray, times_ns: np.ndarray) -> np.ndarray:
    """(n_groups, len(times_ns)) live bytes: allocation i counts in row group[i] at every time
    t with alloc_ts[i] ≤ t < end_ts[i] (end_ts int64 max: never ended). `size` may be float
    (weighted). One pass: a difference array filled with bincount, then a cumulative sum."""
    k = len(times_ns)
    first = np.searchsorted(times_ns, alloc_ts, side="left")
    stop = np.searchsorted(times_ns, end_ts, side="left")
    spans = first < stop
    width = k + 1
    weights = np.asarray(size, dtype=float)[spans]
    deltas = np.bincount(group[spans] * width + first[spans], weights=weights, minlength=n_groups * width)
    deltas -= np.bincount(group[spans] * width + stop[spans], weights=weights, minlength=n_groups * width)
    return np.cumsum(deltas.reshape(n_groups, width), axis=1)[:, :k]
