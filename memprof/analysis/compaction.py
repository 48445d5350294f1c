"""Folding old events into what the analyses need (`record --max-size`, issue 23 item 1).

Pure functions over an events frame (the EVENTS_SCHEMA columns, as reader.frame_of_tables
types them, in any order); the recorder's compactor (capture/compactor.py) reads the oldest
parts, calls `fold_events`, and writes what it returns in their place. Times are
CLOCK_MONOTONIC ns, sizes bytes.

Kept row for row:
- every row that is neither an allocation nor a free (exits, steps, module boundaries,
  model state, free requests);
- every allocation not freed within its own fold window (windows are `window_ns` wide,
  counted from `origin_ns`), and the free that ends it. So the bytes live at every window
  edge are exact, per chain, and the allocations still live at the end are all there, each
  with its chain;
- every allocation live at a protected instant (the earliest time each (layer, device), and
  each (layer, device, pid), reached its highest live bytes in the frame) and its free: the
  peaks, and what was live at them, are exact;
- allocations that a missed free or a free request ended, and the allocation that ends one by a missed free (the next
  allocation of its address: without it, the one before would look live to the end).

Dropped, and counted per layer: frees that follow no allocation of their address (an
allocation from before the recording, or one the probes do not see, as kernel objects
allocated in interrupt context and freed by the target): no analysis reads more of them than
their count, and they can be a third of a kernel-heavy job's events.

Folded: every other allocation with its free, i.e. those allocated and freed within one
window. Per (layer, device, pid, tid, chain, category, step, module, window) they become
allocations at the time of the group's first (or last) one, freed at that same instant, whose
`weight` says how many allocations they stand for: one such pair with sizes q, or two with q
and q + 1, so that the group's count and bytes stay exact (one pair with the mean size where
the group was sampled, whose weights are not whole). A folded pair adds nothing to any live
curve (it ends where it begins), so within a window live bytes miss what was allocated and
freed there, and never show more than the recording did.

Folded pairs take addresses FOLDED_ADDRESS_BASE + k, a tag no allocator hands out, so they
never meet a real allocation's free. Folding a folded frame again with the same windows gives
the same groups back (each folded pair is one allocation freed within its window), which is
how the compactor merges what it folded before with the next parts.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from memprof.analysis.lifetimes import (NEVER, _ALLOC, _FREE, _as_groups, _in_time_order, _pairing_key, _row_kinds,
                                        category_codes, next_of_key, previous_kinds, unmatched_frees)

FOLDED_ADDRESS_BASE = 0xF01D << 48  # above any user-space address (47 bits); see the module docstring
# The columns that tell folded groups apart (besides the window); category codes of each.
_GROUP_COLUMNS = ("layer", "device", "pid", "tid", "stack_id", "category", "step", "module")


def is_folded(addr: np.ndarray) -> np.ndarray:
    """Per address: one of a folded pair's (they stand for many allocations, exactly counted)."""
    return np.asarray(addr, dtype=np.uint64) >= np.uint64(FOLDED_ADDRESS_BASE)


@dataclass
class FoldResult:
    """`events`: the frame folded (same columns as given, plus none), sorted by (ts_ns, seq).
    `folded_pairs`: allocations (with their frees) that were folded; `groups`: the folded
    pairs they became (each one or two allocations); `protected`: allocations kept because
    they were live at a peak; `unmatched_frees_dropped`: per layer, the frees of allocations
    never seen that were dropped (see `settled_before_ns`). Of the allocations kept row for
    row: `still_live`, those no free in the frame ends (live at its end, or ended by a missed
    free: no window folds them), and `crossing`, those freed in a later window than their
    own (a wider window may fold them)."""

    events: pd.DataFrame
    folded_pairs: int
    groups: int
    protected: int
    unmatched_frees_dropped: dict[str, int] = field(default_factory=dict)
    still_live: int = 0
    crossing: int = 0


def fold_events(events: pd.DataFrame, *, origin_ns: int, window_ns: int, module: np.ndarray | None = None,
                settled_before_ns: int | None = None) -> FoldResult:
    """Fold `events` (module docstring). `module`: per row, a code of the nn.Module running on
    the allocating thread (timeline.with_modules' column, as codes; -1 none), so that folding
    keeps what each module allocated apart; None when the frame has no module boundaries.
    `settled_before_ns`: frees before it that follow no allocation of their address in the
    frame are dropped, and counted per layer (an allocation from before the recording, or
    made where the probes do not see it: kernel objects allocated in interrupt context and
    freed by the target). Only the frame's own pairing says a free is unmatched, so the
    caller sets it where no allocation can still arrive for such a free (the ring buffer
    reorders by milliseconds); None keeps them all.
    Raises ValueError for a window under 1 ns."""
    if window_ns < 1:
        raise ValueError(f"fold window {window_ns} ns: must be at least 1")
    events = _time_ordered(events, module)
    module = events.pop("__module").to_numpy() if "__module" in events else np.full(len(events), -1, np.int64)
    ts = events["ts_ns"].to_numpy(dtype=np.int64)
    kind = _row_kinds(events["action"])
    following = _next_of_key(events, kind)
    alloc_rows = np.flatnonzero(kind == _ALLOC)
    ends = following[alloc_rows]
    ended = ends >= 0
    end_ts = np.full(alloc_rows.size, NEVER, dtype=np.int64)
    end_ts[ended] = ts[ends[ended]]
    alloc_ts = ts[alloc_rows]
    freed = np.zeros(alloc_rows.size, dtype=bool)
    freed[ended] = kind[ends[ended]] == _FREE
    # An allocation right after another of its address ends that one (a missed free, as
    # lifetimes.py judges it): it stays, or the one before would look live to the end.
    previous = previous_kinds(kind, following)
    freed &= (previous != _ALLOC)[alloc_rows]
    window = (alloc_ts - origin_ns) // window_ns
    same_window = freed & (window == (end_ts - origin_ns) // window_ns)
    weight = _weights(events, alloc_rows)
    nbytes = np.rint(events["size_bytes"].to_numpy(dtype=float, na_value=0.0)[alloc_rows] * weight)
    live_at_peak = _live_at_peaks(events, alloc_rows, alloc_ts, end_ts, nbytes)
    foldable = same_window & ~live_at_peak
    protected = int((same_window & live_at_peak).sum())
    unmatched = unmatched_frees(kind, previous) & (kind == _FREE)  # free requests stay: their completion follows
    if settled_before_ns is None:
        unmatched[:] = False
    else:
        unmatched &= ts < settled_before_ns
    dropped = _count_by_layer(events, unmatched)
    still_live, crossing = int((~freed).sum()), int((freed & ~same_window).sum())
    if not foldable.any() and not unmatched.any():
        return FoldResult(events.reset_index(drop=True), 0, 0, protected, dropped, still_live, crossing)
    folded_allocs, folded_frees = alloc_rows[foldable], ends[foldable]
    synthetic, groups = _folded_pairs(events, module, folded_allocs, folded_frees, window[foldable],
                                      weight[foldable])
    keep = ~unmatched
    keep[folded_allocs] = False
    keep[folded_frees] = False
    out = pd.concat([events[keep], synthetic], ignore_index=True)
    out = out.iloc[np.lexsort((out["seq"].to_numpy(), out["ts_ns"].to_numpy()))].reset_index(drop=True)
    return FoldResult(out, int(foldable.sum()), groups, protected, dropped, still_live, crossing)


def _count_by_layer(events: pd.DataFrame, rows: np.ndarray) -> dict[str, int]:
    """How many of the rows `rows` selects, per layer (layers with none left out)."""
    if not rows.any():
        return {}
    counts = events.loc[rows, "layer"].astype(str).value_counts()
    return {str(layer): int(n) for layer, n in counts.items()}


def _time_ordered(events: pd.DataFrame, module: np.ndarray | None) -> pd.DataFrame:
    """`events` in (ts_ns, seq) order (sorted only if it is not: the compactor sorts it
    first), the module codes carried as `__module`."""
    events = events.copy(deep=False)
    if module is not None:
        events["__module"] = np.asarray(module, dtype=np.int64)
    ts, seq = events["ts_ns"].to_numpy(), events["seq"].to_numpy()
    if _in_time_order(ts, seq):
        return events.reset_index(drop=True)
    return events.iloc[np.lexsort((seq, ts))].reset_index(drop=True)


def _next_of_key(events: pd.DataFrame, kind: np.ndarray) -> np.ndarray:
    """Per row (in time order), the position of the next row of its pairing key (layer,
    device, alloc id or address: lifetimes.py's), -1 where none."""
    layer_codes, _ = category_codes(events["layer"])
    following = next_of_key(_as_groups(_pairing_key(events, kind, layer_codes))).astype(np.int64)
    following[kind == 0] = -1  # rows pairing ignores share one group: they have no next
    return following


def _weights(events: pd.DataFrame, rows: np.ndarray) -> np.ndarray:
    """How many allocations each of `rows` stands for (null weight: 1)."""
    weight = events["weight"].to_numpy(dtype=float, na_value=np.nan)[rows]
    return np.where(np.isnan(weight), 1.0, weight)


def _live_at_peaks(events: pd.DataFrame, alloc_rows: np.ndarray, alloc_ts: np.ndarray, end_ts: np.ndarray,
                   nbytes: np.ndarray) -> np.ndarray:
    """Per allocation: live at the earliest instant its (layer, device), or its (layer,
    device, pid), reached its highest live bytes in the frame."""
    layer, _ = category_codes(events["layer"])
    device, _ = category_codes(events["device"])
    layer = layer[alloc_rows].astype(np.int64) * 4096 + device[alloc_rows]
    pid = events["pid"].to_numpy(dtype=np.int64)[alloc_rows]
    protected = np.zeros(alloc_rows.size, dtype=bool)
    for group in (layer, layer * (1 << 32) + pid):
        codes, _ = pd.factorize(group)
        peak_at = _peak_instants(codes, alloc_ts, end_ts, nbytes)
        at = peak_at[codes]
        protected |= (alloc_ts <= at) & (at < end_ts)
    return protected


def _peak_instants(group: np.ndarray, alloc_ts: np.ndarray, end_ts: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
    """Per group code (0..G-1): the earliest time its live bytes, taken after all of its
    events at each time, were highest (as layers.live_curve takes them). In numpy alone, each
    temporary let go as soon as it is used: a fold's memory peaked here (a pandas groupby of
    every allocation and free took ~110 B a row of the frame folded, bench/RESULTS.md)."""
    if not group.size:
        return np.zeros(0, dtype=np.int64)
    ended = end_ts != NEVER
    g = np.concatenate([group, group[ended]])
    t = np.concatenate([alloc_ts, end_ts[ended]])
    d = np.concatenate([nbytes, -nbytes[ended]])
    del ended
    order = np.lexsort((t, g))
    g, t, d = g[order], t[order], d[order]
    del order
    live = np.cumsum(d)
    starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    live -= np.repeat(live[starts] - d[starts], np.diff(np.r_[starts, g.size]))
    del d
    last_of_time = np.r_[(g[1:] != g[:-1]) | (t[1:] != t[:-1]), True]
    g, t, live = g[last_of_time], t[last_of_time], live[last_of_time]
    del last_of_time
    # Each group's highest live bytes, and the first (earliest) instant that reaches them.
    starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    highest = np.repeat(np.maximum.reduceat(live, starts), np.diff(np.r_[starts, g.size]))
    at_highest = np.flatnonzero(live == highest)
    del highest, live
    first = at_highest[np.r_[True, g[at_highest[1:]] != g[at_highest[:-1]]]]
    peak_at = np.full(int(group.max()) + 1, NEVER, dtype=np.int64)
    peak_at[g[first]] = t[first]
    return peak_at


def _folded_pairs(events: pd.DataFrame, module: np.ndarray, allocs: np.ndarray, frees: np.ndarray,
                  window: np.ndarray, weight: np.ndarray) -> tuple[pd.DataFrame, int]:
    """The rows that stand for the folded (alloc, free) pairs at `allocs`/`frees`, grouped
    (module docstring); and how many groups."""
    columns = {name: _codes(events, name, allocs, module) for name in _GROUP_COLUMNS}
    size = events["size_bytes"].to_numpy(dtype=float, na_value=0.0)[allocs]
    requested = events["requested_bytes"].to_numpy(dtype=float, na_value=np.nan)[allocs]
    columns.update({"window": window, "n": weight, "bytes": np.rint(size * weight), "requested": requested * weight,
                    "has_requested": ~np.isnan(requested), "whole": weight == np.round(weight), "first": allocs,
                    "last": allocs})
    del size, requested
    # copy=False: the frame takes the arrays as they are, not consolidated into copies of them
    # beside the originals (~70 B a row of the frame folded, at this point of a fold's peak).
    frame = pd.DataFrame(columns, copy=False)
    del columns
    groups = frame.groupby([*_GROUP_COLUMNS, "window"], sort=False, dropna=False).agg(
        n=("n", "sum"), bytes=("bytes", "sum"), requested=("requested", "sum"),
        has_requested=("has_requested", "all"), whole=("whole", "all"), first=("first", "min"),
        last=("last", "max"))
    del frame
    # Each folded allocation's own free: `allocs` ascend (rows in time order), so a search
    # finds them, where a Series indexed by them built a hash table of every one.
    groups["first_free"] = frees[np.searchsorted(allocs, groups["first"].to_numpy())]
    groups["last_free"] = frees[np.searchsorted(allocs, groups["last"].to_numpy())]
    return _pair_rows(events, groups.reset_index(drop=True)), len(groups)


def _codes(events: pd.DataFrame, name: str, rows: np.ndarray, module: np.ndarray) -> np.ndarray:
    """Integer codes of column `name` at `rows` (-1: null), for grouping."""
    if name == "module":
        return module[rows]
    column = events[name]
    if isinstance(column.dtype, pd.CategoricalDtype):
        return column.cat.codes.to_numpy()[rows].astype(np.int64)
    return column.to_numpy(dtype=float, na_value=np.nan)[rows]  # nulls group together as NaN


def _pair_rows(events: pd.DataFrame, groups: pd.DataFrame) -> pd.DataFrame:
    """Per group, one alloc and free pair (two where sizes q and q + 1 are needed for exact
    bytes) at the instant of the group's first allocation (the second pair: of its last), as
    event rows, each taking the columns of the allocation and free it stands in for."""
    n, total = groups["n"].to_numpy(), groups["bytes"].to_numpy()
    whole = groups["whole"].to_numpy() & (n == np.round(n))
    count = np.round(n).astype(np.int64)
    q = np.where(whole, total // np.maximum(count, 1), np.rint(total / n)).astype(np.int64)
    extra = np.where(whole, total - q * count, 0).astype(np.int64)  # how many pairs take q + 1
    two = extra > 0
    requested = np.where(groups["has_requested"].to_numpy(), np.rint(groups["requested"].to_numpy() / n), np.nan)
    first = _pair_part(events, groups["first"].to_numpy(), groups["first_free"].to_numpy(), q,
                       np.where(two, count - extra, n).astype(float), requested)
    second = _pair_part(events, groups["last"].to_numpy()[two], groups["last_free"].to_numpy()[two], q[two] + 1,
                        extra[two].astype(float), requested[two])
    allocs = pd.concat([first[0], second[0]], ignore_index=True)
    frees = pd.concat([first[1], second[1]], ignore_index=True)
    tags = np.uint64(FOLDED_ADDRESS_BASE) + np.arange(len(allocs), dtype=np.uint64)
    allocs["addr"] = tags
    frees["addr"] = tags
    return pd.concat([allocs, frees], ignore_index=True)


def _pair_part(events: pd.DataFrame, alloc_at: np.ndarray, free_at: np.ndarray, size: np.ndarray,
               count: np.ndarray, requested: np.ndarray) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(alloc rows, free rows): copies of the rows at `alloc_at` and `free_at`, the frees
    moved to their allocation's instant, each alloc standing for `count` allocations of
    `size` bytes (`requested`: bytes asked for, NaN: null)."""
    allocs = events.iloc[alloc_at].reset_index(drop=True)
    frees = events.iloc[free_at].reset_index(drop=True)
    alloc_seq, free_seq = allocs["seq"].to_numpy(), frees["seq"].to_numpy()
    # Same instant: (ts_ns, seq) order must still put the allocation first.
    allocs["seq"], frees["seq"] = np.minimum(alloc_seq, free_seq), np.maximum(alloc_seq, free_seq)
    frees["ts_ns"] = allocs["ts_ns"].to_numpy()
    allocs["size_bytes"] = pd.arrays.IntegerArray(size.astype(np.int64), np.zeros(len(size), dtype=bool))
    unknown = np.isnan(requested)
    allocs["requested_bytes"] = pd.arrays.IntegerArray(np.where(unknown, 0, requested).astype(np.int64), unknown)
    allocs["weight"] = np.where(count == 1.0, np.nan, count)  # null: stands for itself, as recorded
    for rows in (allocs, frees):
        rows["alloc_id"] = pd.arrays.IntegerArray(np.zeros(len(rows), dtype=np.int64), np.ones(len(rows), dtype=bool))
    return allocs, frees
