"""Robust trend statistics for live-bytes series: Theil–Sen slope, Mann–Kendall test, and the
shapes that are not leaks (a cache that fills then plateaus, a sawtooth buffer).

Pure numpy; no I/O. A series is live bytes at K successive checkpoints (the same point of
successive steps, or fixed time windows), x = 0..K-1. All functions take many series at
once as a 2-D array (one row per series) so a recording's chains are judged together.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

# Fewer checkpoints than this and no trend is claimed: Mann–Kendall cannot reach 99 % on
# fewer than 7 points even when every pair rises.
MIN_POINTS = 8
PLATEAU_MIN_RISES = 3
# A release: a fall from one checkpoint to the next by at least this fraction of the series'
# range. A quarter, not a half: an inference loop whose `out` keeps the last request's KV
# cache until the next request returns falls by one cache from two (49 % of its range).
RELEASE_FRACTION = 0.25
# Troughs (the level right after each release) that rise by at least this fraction of the
# range over the cycles: something is kept from every cycle, and the chain grows.
TROUGH_RISE_FRACTION = 0.10


@dataclass(frozen=True)
class Trend:
    """One series' verdict.

    `slope` is the Theil–Sen slope in bytes per checkpoint; `confidence` is 1 − the one-sided
    Mann–Kendall p-value that the series rises; `rises` counts checkpoints above the one
    before; `shape` is "grows", "plateau", "sawtooth" or "flat"; `resets` counts releases
    (RELEASE_FRACTION); `within_slope`, for a sawtooth, is the median of its cycles' Theil–Sen
    slopes (bytes per checkpoint while it fills: per token, for a KV cache that each request
    fills and frees), None when its cycles are too short (under 3 checkpoints)."""

    slope: float
    confidence: float
    rises: int
    shape: str
    resets: int = 0
    plateau_from: int | None = None
    within_slope: float | None = None


def theil_sen(series: np.ndarray) -> np.ndarray:
    """Median of the pairwise slopes (y_j − y_i)/(j − i), i < j, per row; units of y per
    checkpoint. Robust: up to ~29 % of points can be arbitrary outliers."""
    k = series.shape[1]
    i, j = np.triu_indices(k, 1)
    slopes = (series[:, j] - series[:, i]) / (j - i)
    return np.median(slopes, axis=1)


def mann_kendall_confidence(series: np.ndarray) -> np.ndarray:
    """Per row, 1 − the one-sided p-value of Mann–Kendall's test for an upward trend
    (normal approximation with continuity and tie corrections). Ties (equal live bytes at
    two checkpoints, common for a chain that is idle) shrink the variance as they should."""
    k = series.shape[1]
    i, j = np.triu_indices(k, 1)
    s = np.sign(series[:, j] - series[:, i]).sum(axis=1)
    variance = _mk_variance(series)
    z = np.where(s > 0, (s - 1) / np.sqrt(np.maximum(variance, 1e-12)), 0.0)
    p = 0.5 * np.array([math.erfc(value / math.sqrt(2)) for value in z.tolist()])
    return np.where(variance > 0, 1.0 - p, 0.0)


def _mk_variance(series: np.ndarray) -> np.ndarray:
    """Per row, Var(S) = [n(n−1)(2n+5) − Σ t(t−1)(2t+5)] / 18 over the row's groups of t
    equal values; all rows at once (sorted rows, then the lengths of runs of equal values)."""
    rows, n = series.shape
    ordered = np.sort(series, axis=1)
    starts = np.ones_like(ordered, dtype=bool)
    starts[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    run_id = np.cumsum(starts.ravel()) - 1  # runs never cross rows: each row starts one
    t = np.bincount(run_id).astype(float)
    row_of_run = np.repeat(np.arange(rows), starts.sum(axis=1))
    ties = np.bincount(row_of_run, weights=t * (t - 1) * (2 * t + 5), minlength=rows)
    return (n * (n - 1) * (2 * n + 5) - ties) / 18.0


def classify(series: np.ndarray, *, confidence: float = 0.99, min_growth: float = 1024.0) -> list[Trend]:
    """A Trend per row of `series` (live bytes at K ≥ MIN_POINTS checkpoints).

    - "grows": the whole series rises (Mann–Kendall ≥ `confidence`), its later half still
      rises (≥ 0.95 and a positive Theil–Sen slope there: a cache that filled early and then
      held steady fails this), it never fell back by half its range, and the fitted growth
      over the series is at least `min_growth` bytes;
    - "sawtooth": it fell back by at least RELEASE_FRACTION of its range two or more times
      (a buffer filled and released every few steps; a KV cache each request fills and frees),
      with troughs that do not rise; troughs that rise by TROUGH_RISE_FRACTION of the range
      or more (something kept from every cycle) make it "grows", whatever the rest does;
    - "plateau": it rose over PLATEAU_MIN_RISES checkpoints or more, then its later half did
      not (a cache or pool that filled);
    - "flat": none of these."""
    if series.shape[1] < MIN_POINTS:
        raise ValueError(f"a trend needs at least {MIN_POINTS} checkpoints, got {series.shape[1]}")
    series = np.asarray(series, dtype=float)
    later = series[:, series.shape[1] // 2:]
    slope, conf = _batched(theil_sen, series), _batched(mann_kendall_confidence, series)
    later_slope, later_conf = _batched(theil_sen, later), _batched(mann_kendall_confidence, later)
    resets = _resets(series)
    rises = (np.diff(series, axis=1) > 0).sum(axis=1)
    shapes = [_shape(slope[row], conf[row], later_slope[row], later_conf[row], resets[row], rises[row],
                     series.shape[1], confidence, min_growth) for row in range(series.shape[0])]
    # The sawtooth rows' cycles, judged together: one chain in three is a sawtooth on a
    # churning workload (11,289 of 34,530 on bench/analysis_speed.py's), and a Python
    # loop over them took 3.0 s of the leak report's 4.7 s.
    sawtooth = resets >= 2
    troughs_rise, within = np.zeros(len(shapes), dtype=bool), np.full(len(shapes), np.nan)
    troughs_rise[sawtooth] = _troughs_rise(series[sawtooth], min_growth)
    within[sawtooth] = _batched(_within_slopes, series[sawtooth])
    out = []
    for row, shape in enumerate(shapes):
        if shape == "sawtooth" and troughs_rise[row]:
            shape = "grows"
        within_slope = float(within[row]) if shape == "sawtooth" and not math.isnan(within[row]) else None
        out.append(Trend(slope=float(slope[row]), confidence=float(conf[row]), rises=int(rises[row]), shape=shape,
                         resets=int(resets[row]),
                         plateau_from=_plateau_start(series[row]) if shape == "plateau" else None,
                         within_slope=within_slope))
    return out


def _batched(statistic, series: np.ndarray, pairs_per_batch: int = 2_000_000) -> np.ndarray:
    """`statistic` over row batches: the pairwise matrices stay small (K² / 2 per row)."""
    k = series.shape[1]
    rows = max(1, pairs_per_batch // max(1, k * (k - 1) // 2))
    if series.shape[0] == 0:
        return np.zeros(0)
    return np.concatenate([statistic(series[at:at + rows]) for at in range(0, series.shape[0], rows)])


def _shape(slope, conf, later_slope, later_conf, resets, rises, k, confidence, min_growth) -> str:
    if resets >= 2:
        return "sawtooth"
    rising = conf >= confidence and slope > 0 and slope * (k - 1) >= min_growth
    if rising and resets == 0 and later_conf >= 0.95 and later_slope > 0:
        return "grows"
    filled = rises >= PLATEAU_MIN_RISES  # one jump held ever after is held memory, not a cache filling
    if filled and conf >= 0.95 and slope >= 0 and (later_slope <= 0 or later_conf < 0.95):
        return "plateau"
    return "flat"


def _resets(series: np.ndarray) -> np.ndarray:
    """Per row, how many times the series fell from one checkpoint to the next by at least
    RELEASE_FRACTION of its range (max − min); 0 for a constant series."""
    return _release_mask(series).sum(axis=1)


def _release_mask(series: np.ndarray) -> np.ndarray:
    """(rows, K − 1): True where the series fell from checkpoint i to i + 1 by a release."""
    span = series.max(axis=1) - series.min(axis=1)
    drops = -np.diff(series, axis=1)
    return (drops >= RELEASE_FRACTION * span[:, None]) & (span[:, None] > 0)


def _troughs_rise(series: np.ndarray, min_growth: float) -> np.ndarray:
    """Per row: whether the levels right after each release rise, each above the one before,
    by TROUGH_RISE_FRACTION of the range (and `min_growth` bytes) in all: what every cycle
    leaves behind accumulates. Needs two troughs or more."""
    rows = series.shape[0]
    after = np.zeros(series.shape, dtype=bool)
    after[:, 1:] = _release_mask(series)
    row_of, at = np.nonzero(after)  # row-major: each row's troughs in order
    troughs = series[row_of, at]
    count = np.bincount(row_of, minlength=rows)
    same_row = row_of[1:] == row_of[:-1]
    falls = np.bincount(row_of[1:][same_row & (np.diff(troughs) <= 0)], minlength=rows)
    ends = np.cumsum(count)
    has_two = count >= 2
    rise = np.zeros(rows)
    rise[has_two] = troughs[ends[has_two] - 1] - troughs[ends[has_two] - count[has_two]]
    return has_two & (falls == 0) & (rise >= np.maximum(min_growth, TROUGH_RISE_FRACTION * np.ptp(series, axis=1)))


def _within_slopes(series: np.ndarray) -> np.ndarray:
    """Per row: the median of the Theil–Sen slopes of its cycles between releases (those of
    3 checkpoints or more), NaN where it has none. All rows at once: each pair of
    checkpoints in one cycle gives a slope, and the medians come from one sort of them."""
    rows, k = series.shape
    cycle = np.zeros((rows, k), dtype=np.int64)
    cycle[:, 1:] = np.cumsum(_release_mask(series), axis=1)
    # Per row, per cycle id: how many checkpoints the cycle has.
    lengths = np.bincount((cycle + np.arange(rows)[:, None] * k).ravel(), minlength=rows * k).reshape(rows, k)
    i, j = np.triu_indices(k, 1)
    in_cycle = (cycle[:, i] == cycle[:, j]) & (np.take_along_axis(lengths, cycle[:, i], axis=1) >= 3)
    row_of, pair = np.nonzero(in_cycle)
    slopes = (series[row_of, j[pair]] - series[row_of, i[pair]]) / (j[pair] - i[pair])
    cycle_key, cycle_median = _group_medians(row_of * k + cycle[row_of, i[pair]], slopes)
    row_key, row_median = _group_medians(cycle_key // k, cycle_median)
    out = np.full(rows, np.nan)
    out[row_key] = row_median
    return out


def _group_medians(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(each distinct key ascending, the median of its values), as np.median takes it (the
    mean of the two middle values of an even count)."""
    order = np.lexsort((values, keys))
    keys, values = keys[order], values[order]
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]]) if keys.size else np.zeros(0, dtype=np.int64)
    counts = np.diff(np.r_[starts, keys.size])
    low, high = values[starts + (counts - 1) // 2], values[starts + counts // 2]
    return keys[starts], (low + high) / 2


def _plateau_start(row: np.ndarray) -> int:
    """The first checkpoint at which the series reached 90 % of its final level."""
    final = row[-1]
    reached = np.flatnonzero(row >= 0.9 * final) if final > 0 else np.array([0])
    return int(reached[0]) if len(reached) else len(row) - 1
