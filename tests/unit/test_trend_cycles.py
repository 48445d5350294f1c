"""Growth within cycles against growth across them (issue 21, item 6): a KV cache that each
request fills and frees is a sawtooth that "grows within each request"; a loop that keeps
something from every request grows, even where each request also frees most of what it
made. The series are those of examples/serve_kv.py's cache chain, in KiB per checkpoint
(one checkpoint a token; 24 KiB a token)."""
from __future__ import annotations

import numpy as np
import pytest

from memprof.analysis.trend import classify

KIB = 1024
FIRST_REQUEST = [0, 0, 0] + [216 + 24 * i for i in range(23)]


def serve(requests: int = 4, kept_per_request: int = 0) -> np.ndarray:
    """`out` holds the last request's cache (744 KiB) until the next request returns; a
    loop that keeps caches adds `kept_per_request` KiB more at every request's end."""
    series, kept = list(FIRST_REQUEST), 0
    for _ in range(requests - 1):
        kept += kept_per_request
        series += [kept + 744] + [kept + 960 + 24 * i for i in range(22)]
    return np.array(series, dtype=float) * KIB


def test_a_cache_each_request_fills_and_frees_grows_within_the_request_only():
    (trend,) = classify(serve()[None, :])
    # Four requests, two releases: the first request's cache is freed only when the second
    # returns (`out` holds it until then).
    assert (trend.shape, trend.resets) == ("sawtooth", 2)
    assert trend.within_slope == pytest.approx(24 * KIB)


def test_keeping_something_from_every_request_grows():
    (trend,) = classify(serve(kept_per_request=300)[None, :])
    assert trend.shape == "grows"


def test_a_loop_that_keeps_every_cache_grows_without_releases():
    kept = np.concatenate([np.array(FIRST_REQUEST[3:]) + 744 * r for r in range(4)]) * KIB
    (trend,) = classify(kept[None, :].astype(float))
    assert (trend.shape, trend.resets, trend.within_slope) == ("grows", 0, None)


def test_troughs_that_only_jitter_stay_a_sawtooth():
    rng = np.random.default_rng(7)
    series = serve()
    series[np.flatnonzero(series == 744 * KIB)] += rng.integers(1, 4 * KIB, size=(series == 744 * KIB).sum())
    (trend,) = classify(series[None, :])
    assert trend.shape == "sawtooth"


def test_a_buffer_refilled_every_few_steps_is_still_a_sawtooth():
    (trend,) = classify(np.tile([0, 64, 128, 192], 6)[None, :].astype(float) * KIB)
    assert (trend.shape, trend.resets) == ("sawtooth", 5)
    assert trend.within_slope == pytest.approx(64 * KIB)


def _reference_within_slope(row: np.ndarray) -> float | None:
    """The median of the cycles' Theil–Sen slopes, one cycle at a time (as trend.py did before
    it judged every row at once)."""
    from memprof.analysis.trend import _release_mask, theil_sen
    bounds = [0, *(np.flatnonzero(_release_mask(row[None, :])[0]) + 1).tolist(), len(row)]
    cycles = [row[a:b] for a, b in zip(bounds, bounds[1:]) if b - a >= 3]
    return float(np.median([theil_sen(c[None, :])[0] for c in cycles])) if cycles else None


def _reference_troughs_rise(row: np.ndarray, min_growth: float) -> bool:
    from memprof.analysis.trend import TROUGH_RISE_FRACTION, _release_mask
    troughs = row[np.flatnonzero(_release_mask(row[None, :])[0]) + 1]
    if len(troughs) < 2:
        return False
    rise = troughs[-1] - troughs[0]
    return bool((np.diff(troughs) > 0).all() and rise >= max(min_growth, TROUGH_RISE_FRACTION * np.ptp(row)))


@pytest.mark.parametrize("checkpoints", [8, 13, 40])
def test_every_row_at_once_matches_one_row_at_a_time(checkpoints):
    """Random sawtooths (fills of random length and slope, partial or full releases, with and
    without a kept remainder) and random walks: the batched verdicts are the per-row ones."""
    from memprof.analysis.trend import _troughs_rise, _within_slopes
    rng = np.random.default_rng(checkpoints)
    rows = []
    for index in range(600):
        keeps_every_cycle = index % 3 == 0  # troughs that rise: 128 KiB kept from each cycle
        level, kept, row = 0.0, 0.0, []
        while len(row) < checkpoints:
            for _ in range(int(rng.integers(2, 7))):
                level += float(rng.integers(0, 5)) * 64 * KIB
                row.append(kept + level)
            kept += 128 * KIB if keeps_every_cycle else float(rng.choice([0, 0, 300])) * KIB
            level = 0.0 if keeps_every_cycle else float(rng.choice([0.0, level * 0.5]))
        rows.append(row[:checkpoints])
    rows += [np.cumsum(rng.integers(-3, 4, checkpoints) * KIB).tolist() for _ in range(200)]
    series = np.array(rows, dtype=float)
    within = _within_slopes(series)
    expected = [_reference_within_slope(row) for row in series]
    assert [None if np.isnan(w) else pytest.approx(w) for w in within] == expected
    assert _troughs_rise(series, 1024.0).tolist() == [_reference_troughs_rise(row, 1024.0) for row in series]
    assert sum(e is not None for e in expected) > 100  # the random rows do have cycles
    assert 20 < _troughs_rise(series, 1024.0).sum() < 580  # and troughs that rise, and that do not
