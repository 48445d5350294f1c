"""Leaks: memory still held when the target ended, grouped by the chain that allocated it.

Pure functions over the timeline and its lifetimes; no I/O. Times are CLOCK_MONOTONIC ns.

"Held at the end" is judged at `end_ns`, the moment the target began to exit (see
`end_of_target`), before its teardown frees everything: an allocation is held when it was
made at or before `end_ns`, had not ended by `end_ns`, and was at least `min_age_ns` old then
(younger ones are in flight, not leaked). Held allocations that were freed after `end_ns` were
released by the teardown (`released_at_exit`); those still live when the recording stopped
outlived the process (kernel caches, pipes kept by another process, driver memory).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

import numpy as np
import pandas as pd

from memprof.analysis.chains import with_canonical_stacks
from memprof.analysis.lifetimes import Lifetimes, label_of, labels
from memprof.errors import UsageError
from memprof.model.schema import EVAL_LOOP_FUNCTIONS, Action, FrameKind, Layer, Mark

_NEVER = np.iinfo(np.int64).max
_FRAME_KEYS = ("kind", "function", "module", "file", "line")


@dataclass(frozen=True)
class LeakFinding:
    """Allocations of one (layer, stack_id, released_at_exit) held at the end.

    `first_ns`/`last_ns` are the earliest/latest alloc `ts_ns` in the group;
    `growth_bytes_per_s` is live_bytes over the seconds from first_ns to the end (0 when none).
    `stack_id` is None for allocations recorded without a stack.
    """

    layer: str
    stack_id: int | None
    live_bytes: int
    live_count: int
    first_ns: int
    last_ns: int
    growth_bytes_per_s: float
    released_at_exit: bool
    # Allocations of this chain proven freed unseen (handed out again while live). Any
    # makes the finding unconfirmed: this chain's frees are not all visible to the probes
    # (on Linux 6.18, e.g., slab objects freed in bulk through RCU sheaves), so some of its
    # live allocations may already be free.
    chain_missed_frees: int = 0

    @property
    def confirmed(self) -> bool:
        return self.chain_missed_frees == 0


@dataclass
class LeakResult:
    """Findings, biggest first, and the loss that qualifies them.

    `missed_frees` (per layer) are frees never seen, inferred from an address handed out again;
    `unconfirmed_frees` (per layer) is for the caller to fill from the recording's kernel
    counters (frees the kernel skipped): up to that many findings' allocations may have been freed.
    """

    findings: list[LeakFinding]
    end_ns: int
    min_age_ns: int
    recording_end_ns: int
    missed_frees: dict[str, int] = field(default_factory=dict)
    unconfirmed_frees: dict[str, int] = field(default_factory=dict)


def find_leaks(lifetimes: Lifetimes, *, end_ns: int, recording_end_ns: int, min_age_ns: int = 500_000_000,
               layers: Iterable[str] | None = None, top: int | None = None,
               end_by_pid: Mapping[int, int] | None = None,
               canonical_stack: Mapping[int, int] | None = None) -> LeakResult:
    """Group the allocations held at the end (module docstring) by (layer, chain,
    released_at_exit); sorted by live_bytes, then live_count (both descending), then stack_id;
    at most `top` findings. `layers` keeps only those layers.

    Each allocation is judged at the end of the process that made it — `end_by_pid[pid]`,
    when that process began to exit while recorded — else at `end_ns`. A child that leaks
    and exits before the root is judged at its own exit, before its teardown frees.
    `canonical_stack` maps stack ids with identical frames to one id (see
    `chains.canonical_stacks`), so one chain is one finding."""
    if end_ns > recording_end_ns:
        raise UsageError(f"the end time {end_ns} ns is after the recording's end ({recording_end_ns} ns)",
                         "judge leaks at a time inside the recording")
    wanted = None if layers is None else {label_of(layer) for layer in layers}
    allocations = with_canonical_stacks(lifetimes.allocations, canonical_stack)
    ends = _end_per_allocation(allocations, end_ns, end_by_pid)
    exited = allocations["pid"].isin(list(end_by_pid or ())).to_numpy() | (end_ns < recording_end_ns)
    held = _held(allocations, ends, exited, min_age_ns, wanted)
    groups = _sorted_groups(held)
    if top is not None:
        groups = groups.head(top)
    missed = {layer: n for layer, n in lifetimes.missed_frees.items() if wanted is None or layer in wanted}
    missed_by_chain = _missed_by_chain(allocations)
    return LeakResult(findings=[_finding(row, missed_by_chain) for row in groups.itertuples(index=False)],
                      end_ns=int(end_ns), min_age_ns=int(min_age_ns), recording_end_ns=int(recording_end_ns),
                      missed_frees=missed)


def _end_per_allocation(allocations: pd.DataFrame, end_ns: int, end_by_pid: Mapping[int, int] | None) -> np.ndarray:
    """The time each allocation is judged at, ns."""
    if not end_by_pid:
        return np.full(len(allocations), end_ns, dtype=np.int64)
    own = allocations["pid"].map(end_by_pid)
    return own.fillna(end_ns).to_numpy(dtype=np.int64)


# Memory of the process itself: when the process exits the kernel takes it back whole,
# and no free is ever called. Live at an exit that was recorded = released at exit.
_PROCESS_LAYERS = [Layer.TORCH_CPU.value, Layer.NATIVE_HEAP.value, Layer.CUDA_DRIVER.value,
                   Layer.CUDA_SEGMENT.value, Layer.CUDA_BLOCK.value]


def _held(allocations: pd.DataFrame, ends: np.ndarray, exited: np.ndarray, min_age_ns: int,
          layers: set[str] | None) -> pd.DataFrame:
    """The allocations held at their end, as (layer, stack_id, released_at_exit, size_bytes,
    alloc_ts_ns, judged_ns)."""
    alloc_ts = allocations["alloc_ts_ns"].to_numpy(dtype=np.int64)
    end_ts = allocations["end_ts_ns"].to_numpy(dtype=np.int64, na_value=_NEVER)
    mask = (alloc_ts <= ends) & (end_ts > ends) & (ends - alloc_ts >= min_age_ns)
    layer = labels(allocations["layer"])
    if layers is not None:
        mask &= np.isin(layer, list(layers))
    held = allocations.loc[mask, ["stack_id", "size_bytes", "alloc_ts_ns", "weight"]]
    # A sampled allocation stands for `weight` of them: estimates of bytes and counts stay unbiased.
    held = held.assign(size_bytes=held["size_bytes"].astype(float) * held["weight"])
    released = (end_ts[mask] != _NEVER) | (exited[mask] & np.isin(layer[mask], _PROCESS_LAYERS))
    return held.assign(layer=layer[mask], released_at_exit=released, judged_ns=ends[mask])


def _sorted_groups(held: pd.DataFrame) -> pd.DataFrame:
    groups = held.groupby(["layer", "stack_id", "released_at_exit"], dropna=False, sort=False).agg(
        live_bytes=("size_bytes", "sum"), live_count=("weight", "sum"),
        first_ns=("alloc_ts_ns", "min"), last_ns=("alloc_ts_ns", "max"), judged_ns=("judged_ns", "max"),
    ).reset_index()
    return groups.sort_values(["live_bytes", "live_count", "stack_id", "layer", "released_at_exit"],
                              ascending=[False, False, True, True, True], na_position="last", kind="stable")


def _missed_by_chain(allocations: pd.DataFrame) -> dict[tuple[str, int | None], int]:
    """(layer, stack_id) -> allocations closed as missed frees."""
    missed = allocations[labels(allocations["end_kind"]) == "missed"]
    if missed.empty:
        return {}
    counts = missed.assign(layer=labels(missed["layer"])).groupby(["layer", "stack_id"], dropna=False).size()
    return {(layer, None if pd.isna(sid) else int(sid)): int(n) for (layer, sid), n in counts.items()}


def _finding(row, missed_by_chain: dict) -> LeakFinding:
    span_s = (int(row.judged_ns) - int(row.first_ns)) / 1e9
    live_bytes = int(round(row.live_bytes))
    stack_id = None if pd.isna(row.stack_id) else int(row.stack_id)
    return LeakFinding(
        chain_missed_frees=missed_by_chain.get((row.layer, stack_id), 0),
        layer=row.layer, stack_id=stack_id,
        live_bytes=live_bytes, live_count=int(round(row.live_count)), first_ns=int(row.first_ns),
        last_ns=int(row.last_ns), growth_bytes_per_s=live_bytes / span_s if span_s > 0 else 0.0,
        released_at_exit=bool(row.released_at_exit),
    )


def exit_times(events: pd.DataFrame) -> dict[int, int]:
    """pid -> when it began to exit: the earliest `mark`/"exit" event of each process."""
    marks = events.loc[(events["action"] == Action.MARK.value) & (events["category"] == Mark.EXIT.value), ["pid", "ts_ns"]]
    return {int(pid): int(ts) for pid, ts in marks.groupby("pid")["ts_ns"].min().items()}


def end_of_target(events: pd.DataFrame, root_pid: int | None, recording_end_ns: int) -> int:
    """When the root process began to exit: the earliest `mark`/"exit" event of `root_pid`,
    or `recording_end_ns` when it did not exit while recorded (attached, or still running)."""
    if root_pid is None:
        return int(recording_end_ns)
    return min(exit_times(events).get(int(root_pid), int(recording_end_ns)), int(recording_end_ns))


def chain_frames(stacks: pd.DataFrame, frames: pd.DataFrame, stack_ids: Iterable,
                 native_frames: str = "merged") -> dict[int, list[dict]]:
    """Frames of each stack, innermost (depth 0) first, as dicts with keys kind, function,
    module, file, line (None where unknown). Null ids are skipped; an id with no stack rows
    maps to []. `native_frames`: "merged" drops the interpreter's eval-loop frames from chains
    that hold the Python frames they ran (the chain reads as its author wrote it); "all"
    keeps every native frame."""
    if native_frames not in ("merged", "all"):
        raise ValueError(f"native_frames must be 'merged' or 'all', not {native_frames!r}")
    ids = sorted({int(i) for i in stack_ids if i is not None and not pd.isna(i)})
    chains: dict[int, list[dict]] = {i: [] for i in ids}
    rows = stacks[stacks["stack_id"].isin(ids)].merge(frames, on="frame_id", how="left")
    for row in rows.sort_values(["stack_id", "depth"]).itertuples(index=False):
        chains[int(row.stack_id)].append({key: _value(getattr(row, key)) for key in _FRAME_KEYS})
    if native_frames == "merged":
        chains = {i: _without_eval_loop(chain) for i, chain in chains.items()}
    return chains


def _without_eval_loop(chain: list[dict]) -> list[dict]:
    if not any(frame["kind"] == FrameKind.PYTHON.value for frame in chain):
        return chain
    return [f for f in chain if not (f["kind"] == FrameKind.NATIVE.value and f["function"] in EVAL_LOOP_FUNCTIONS)]


def _value(value):
    if value is None or value is pd.NA or (not isinstance(value, str) and pd.isna(value)):
        return None
    return int(value) if isinstance(value, (int, np.integer, float, np.floating)) else str(value)
