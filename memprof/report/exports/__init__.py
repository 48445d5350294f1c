"""Exports: the recording's analysis results in other tools' formats. Renderers only — each
module takes analysis results and returns bytes or a JSON-ready dict, or writes files.

FORMATS names each format, the suffix of its default output (next to the recording) and the
viewer that opens it; `memprof export --help` is built from it.
"""
from __future__ import annotations

from typing import NamedTuple

import pandas as pd


class ExportFormat(NamedTuple):
    suffix: str  # default output: <recording><suffix>; a directory for the tabular formats
    viewer: str
    binary: bool = False  # not for a terminal: `-o -` to one is refused


FORMATS = {
    "perfetto": ExportFormat(".pftrace", "ui.perfetto.dev (Open trace file)", binary=True),
    "chrome-trace": ExportFormat(".trace.json", "chrome://tracing, ui.perfetto.dev, older trace viewers"),
    "speedscope": ExportFormat(".speedscope.json", "www.speedscope.app"),
    "pprof": ExportFormat(".pb.gz", "go tool pprof -http=: FILE, pprof, Pyroscope, Grafana", binary=True),
    "folded": ExportFormat(".folded", "flamegraph.pl, inferno-flamegraph, speedscope"),
    "csv": ExportFormat(".export", "a spreadsheet, pandas, any CSV reader"),
    "parquet": ExportFormat(".export", "pandas, polars, DuckDB, Spark"),
}
TABULAR = ("csv", "parquet")


def track_name(kind: str, name: str, device: str) -> str:
    """A counter track's title: 'cuda_block live bytes (cuda:0)', 'rss_bytes'."""
    title = f"{name} live bytes" if kind == "layer" else name
    return f"{title} ({device})" if device else title


def process_names(processes: list[dict]) -> dict[int, str]:
    """pid -> the process's comm (its exe's base name where no comm was recorded); the first
    record of a pid wins (a pid reused later keeps its first name)."""
    names: dict[int, str] = {}
    for process in processes:
        pid = process.get("pid")
        if pid is None or int(pid) in names:
            continue
        exe = process.get("exe") or ""
        names[int(pid)] = str(process.get("comm") or exe.rsplit("/", 1)[-1] or f"pid {pid}")
    return names


def counters_pid(root_pid: int | None, processes: list[dict]) -> int:
    """The process the counter tracks hang under: the root process, else the first one
    recorded, else 0 (counters are of the whole process tree, which viewers cannot show)."""
    if root_pid is not None:
        return int(root_pid)
    return int(processes[0]["pid"]) if processes and processes[0].get("pid") is not None else 0


def instant_title(kind: str, step, label: str | None = None) -> str:
    """An instant's name on the timeline: 'OOM', 'step 12', or a user's mark by its label
    ('epoch 1'; 'mark' where it has none)."""
    if kind == "oom":
        return "OOM"
    if kind == "mark":
        return label or "mark"
    return "step" if step is None or pd.isna(step) else f"step {int(step)}"
