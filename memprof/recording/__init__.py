"""The on-disk recording format (DESIGN.md §2, §3): a `NAME.memprof/` directory of meta.json
and chunked Parquet tables, written while capturing and read back, versioned.

The names below are imported on first use (PEP 562): the recorder imports the writer
alone before the recorded command starts, and the reader brings pandas (issue 24: start-up)."""
from __future__ import annotations

import importlib

_WHERE = {
    "NOT_FINALIZED_NOTE": "reader", "Recording": "reader", "find_latest_recording": "reader",
    "open_recording": "reader", "read_meta": "reader", "TABLES": "writer", "RecordingWriter": "writer",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
    globals()[name] = value
    return value
