"""Chrome trace-event JSON (the format of chrome://tracing and catapult, also read by
ui.perfetto.dev): `ph: "C"` counters per (layer, device) and per sampled metric, `ph: "i"`
instants for OOMs, step marks and the user's marks (named by their label), `ph: "M"` process
and thread names.

Render only: every number comes from analysis.series.ExportTimeline. The format counts time
in microseconds: `ts` is CLOCK_MONOTONIC ns / 1000 (fractions keep the ns).
"""
from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from memprof.analysis.series import CounterSeries, ExportTimeline
from memprof.report.exports import counters_pid, instant_title, process_names, track_name


def chrome_trace(timeline: ExportTimeline, processes: list[dict], *, root_pid: int | None) -> dict[str, Any]:
    """The trace as a JSON-ready dict {"traceEvents": […], "displayTimeUnit": "ns", …}.
    `processes` are meta.processes; counters hang under `root_pid` (see counters_pid)."""
    names = process_names(processes)
    owner = counters_pid(root_pid, processes)
    events = _metadata(names, owner, timeline.instants)
    for series in timeline.counters:
        events.extend(_counter_events(series, owner))
    events.extend(_instant_events(timeline.instants))
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"clock": "CLOCK_MONOTONIC", "start_ns": timeline.start_ns, "end_ns": timeline.end_ns}}


def _us(ns: int) -> float:
    return ns / 1000


def _metadata(names: dict[int, str], owner: int, instants: pd.DataFrame) -> list[dict]:
    """process_name for each process (and the counters' owner); thread_name for each thread
    with instants, named as its process (a Linux thread starts with its creator's comm)."""
    events = [{"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": names.get(pid, "memprof")}}
              for pid in sorted(set(names) | {owner})]
    threads = sorted(set(zip(instants["pid"].tolist(), instants["tid"].tolist())))
    events += [{"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                "args": {"name": names.get(pid, f"pid {pid}")}} for pid, tid in threads]
    return events


def _counter_events(series: CounterSeries, pid: int) -> list[dict]:
    name = track_name(series.kind, series.name, series.device)
    key = "live_bytes" if series.kind == "layer" else "value"
    as_int = np.issubdtype(series.values.dtype, np.integer)
    values = series.values.tolist() if as_int else [float(v) for v in series.values]
    return [{"ph": "C", "name": name, "pid": pid, "tid": 0, "ts": _us(ts), "args": {key: value}}
            for ts, value in zip(series.times_ns.tolist(), values)]


def _instant_events(rows: pd.DataFrame) -> list[dict]:
    """Thread-scoped instants: the OOM's layer, device and size in args; a user's mark is
    named by its label, with the step it fell in."""
    events = []
    for row in rows.itertuples(index=False):
        events.append({"ph": "i", "s": "t", "name": instant_title(row.kind, row.step, row.label), "cat": "memprof",
                       "pid": int(row.pid), "tid": int(row.tid), "ts": _us(int(row.ts_ns)), "args": _args(row)})
    return events


def _args(row) -> dict[str, Any]:
    if row.kind == "oom":
        return {"layer": row.layer, "device": row.device,
                "size_bytes": None if pd.isna(row.size_bytes) else int(row.size_bytes)}
    if row.kind == "mark" and not pd.isna(row.step):
        return {"step": int(row.step)}
    return {}
