"""Allocation chains as users see them: a chain is its frames, not the ids it was captured
under. Two raw stacks can read the same once symbolized (a tracing frame that comes and goes
when another tracer attaches, return addresses within one line), and must count as one."""
from __future__ import annotations

from typing import Mapping

import pandas as pd


def canonical_stacks(stacks: pd.DataFrame) -> dict[int, int]:
    """stack_id -> the smallest stack_id with exactly the same frame sequence; only ids that
    have a smaller twin appear (the rest are their own canonical id)."""
    if stacks.empty:
        return {}
    ordered = stacks.sort_values(["stack_id", "depth"], kind="stable")
    sequences = ordered.groupby("stack_id", sort=True)["frame_id"].agg(tuple)
    first = sequences.groupby(sequences).transform(lambda ids: ids.index.min())
    return {int(sid): int(canon) for sid, canon in first.items() if sid != canon}


def with_canonical_stacks(allocations: pd.DataFrame, canonical: Mapping[int, int] | None) -> pd.DataFrame:
    """`allocations` with each stack_id replaced by its canonical id."""
    if not canonical:
        return allocations
    ids = allocations["stack_id"]
    mapped = ids.map(canonical)  # NaN where the id has no alias (or is null)
    return allocations.assign(stack_id=mapped.fillna(ids).astype("Int64"))
