"""The merged timeline: one table, one clock, sorted. After this, nothing knows which
source a row came from (DESIGN.md §2)."""
from __future__ import annotations

import pandas as pd


def timeline(recording) -> pd.DataFrame:
    """The recording's events in time order (ties keep ingest order, `seq`).

    Every source of this version stamps CLOCK_MONOTONIC ns already; sources with epoch time
    are converted in their adapters through the clock anchors."""
    events = recording.events
    if len(events) == 0:
        return events
    return events.sort_values(["ts_ns", "seq"], kind="stable", ignore_index=True)
