"""Recordings on disk for the `diff` and `check` tests: synthetic timelines (tests/factories.py)
written with memprof.recording's writer, so the commands read them as they read a real one."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from memprof.model.meta import RecordingMeta, SourceStats
from memprof.recording import RecordingWriter
from tests.factories import stacks_frames

S = 1_000_000_000  # one second in ns
KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30


def write_recording(path: Path, events: pd.DataFrame, chains: dict[int, list[tuple]] | None = None, *,
                    pid: int = 100, start_ns: int = 0, end_ns: int = 10 * S, lost: int = 0) -> Path:
    """A finalized recording of `events` (an events_frame) with the stacks of `chains`
    ({stack_id: [(kind, function, module, file, line), …innermost first]}); `lost` events
    counted as dropped by the ring buffer."""
    meta = RecordingMeta(memprof_version="0.1.0", command=["python", "train.py"], pid=pid, start_ns=start_ns)
    if lost:
        meta.sources["ebpf"] = SourceStats(events=len(events), lost=lost)
    writer = RecordingWriter(path, meta)
    writer.append("events", {name: events[name] for name in events.columns})
    if chains:
        stacks, frames = stacks_frames(chains)
        writer.append("stacks", {name: stacks[name] for name in stacks.columns})
        writer.append("frames", {name: frames[name] for name in frames.columns})
    writer.finalize(end_ns=end_ns)
    return path


def moved(chain: list[tuple], by: int) -> list[tuple]:
    """The same chain after a commit moved its lines by `by` (and its code, by an offset)."""
    return [(kind, _shifted(function, by), module, file, None if line is None else line + by)
            for kind, function, module, file, line in chain]


def _shifted(function: str, by: int) -> str:
    """A kernel symbol's '+0x…' offset changes when the code around it changes."""
    name, plus, offset = function.partition("+0x")
    return f"{name}+0x{int(offset, 16) + by:x}" if plus else function
