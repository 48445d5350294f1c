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
    return with_tensor_roles(with_steps(events))


TENSOR_PREFIX = "tensor:"  # `category` of the agent's profiler-window tensor annotations
ROLE_TOLERANCE_NS = 1_000_000


def with_tensor_roles(events: pd.DataFrame) -> pd.DataFrame:
    """Hand each profiler-window tensor annotation's role to the allocation another source
    recorded at the same address of the same layer, nearest in time within 1 ms (the eBPF
    `torch_cpu` uprobe sees the allocation the profiler does): that row's `category` becomes
    the role (parameter, activation, gradient, …). `events` must be in time order."""
    category = events["category"].astype("object")
    is_note = (events["action"] == Action.MARK.value) & category.fillna("").str.startswith(TENSOR_PREFIX)
    if not is_note.any():
        return events
    notes = events.loc[is_note, ["ts_ns", "layer", "addr", "category"]].astype({"layer": "object", "category": "object"})
    allocs = events.loc[(events["action"] == Action.ALLOC.value) & category.isna(), ["ts_ns", "layer", "addr"]]
    allocs = allocs.astype({"layer": "object"}).reset_index()
    if allocs.empty:
        return events
    matched = pd.merge_asof(notes.sort_values("ts_ns"), allocs.sort_values("ts_ns"), on="ts_ns", by=["layer", "addr"],
                            direction="nearest", tolerance=ROLE_TOLERANCE_NS)
    matched = matched.dropna(subset=["index"])
    if matched.empty:
        return events
    events = events.copy()
    roles = matched["category"].str.slice(len(TENSOR_PREFIX))
    category.iloc[matched["index"].astype(int).to_numpy()] = roles.to_numpy()
    events["category"] = category.astype("category")
    return events


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
