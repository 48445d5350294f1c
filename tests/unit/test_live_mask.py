"""lifetimes.end_times and live_mask: the one spelling of "live at t" every analysis uses."""
from __future__ import annotations

import numpy as np
import pandas as pd

from memprof.analysis.lifetimes import NEVER, end_times, live_mask


def test_end_times_gives_never_for_allocations_that_did_not_end():
    allocations = pd.DataFrame({"end_ts_ns": pd.array([5, None, 7], dtype="Int64")})
    assert end_times(allocations).tolist() == [5, NEVER, 7]


def test_live_from_its_alloc_up_to_but_not_at_its_end():
    alloc, end = np.array([10, 10, 20]), np.array([20, NEVER, 30])
    assert live_mask(alloc, end, 9).tolist() == [False, False, False]
    assert live_mask(alloc, end, 10).tolist() == [True, True, False]
    assert live_mask(alloc, end, 20).tolist() == [False, True, True]
    assert live_mask(alloc, end, np.iinfo(np.int64).max - 1).tolist() == [False, True, False]


def test_a_time_per_allocation():
    alloc, end = np.array([10, 10]), np.array([20, 20])
    assert live_mask(alloc, end, np.array([15, 25])).tolist() == [True, False]
