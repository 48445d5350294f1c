"""The merged timeline: one table, one clock, sorted. After this, nothing knows which
source a row came from (DESIGN.md §2)."""
from __future__ import annotations

import numpy as np
import pandas as pd

from memprof.model.schema import Action, Mark


def timeline(recording) -> pd.DataFrame:
    """The recording's events in time order (ties keep ingest order, `seq`), with `step`
    filled in from the step marks.

    Every source of this version stamps CLOCK_MONOTONIC ns already; sources with epoch time
    are converted in their adapters through the clock anchors."""
    events = recording.events
    if len(events) == 0:
        return events
    events = events.sort_values(["ts_ns", "seq"], kind="stable", ignore_index=True)
    return with_steps(events)


def with_steps(events: pd.DataFrame) -> pd.DataFrame:
    """Each event's training step: the number of the last step mark of its process at or
    before it (null before the first, and for processes that mark no steps). `events` must be
    in time order; rows that already carry a step keep it."""
    is_step = (events["action"] == Action.MARK.value) & (events["category"] == Mark.STEP.value)
    if not is_step.any():
        return events
    marks = events[is_step & events["step"].notna()]
    step = events["step"].astype("Int64").copy()
    for pid, mine in marks.groupby("pid", sort=False):
        rows = np.flatnonzero((events["pid"] == pid).to_numpy() & step.isna().to_numpy())
        at = np.searchsorted(mine["ts_ns"].to_numpy(), events["ts_ns"].to_numpy()[rows], side="right") - 1
        known = at >= 0
        step.iloc[rows[known]] = mine["step"].to_numpy()[at[known]]
    events = events.copy()
    events["step"] = step
    return events
