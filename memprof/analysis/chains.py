"""Allocation chains as users see them: a chain is its frames, not the ids it was captured
under. Two raw stacks can read the same once symbolized (a tracing frame that comes and goes
when another tracer attaches, return addresses within one line), and must count as one."""
from __future__ import annotations

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
