"""Synthetic timelines for unit tests, typed like a recording's tables (EVENTS_SCHEMA etc.).

    events_frame([(100, "alloc", 0x10, 64, 7), (200, "free", 0x10)], layer="native_heap")

A row is a tuple (ts_ns, action, addr[, size_bytes[, stack_id]]) or a dict of any event
columns; keyword arguments give defaults for the columns a row leaves out. `seq` is the row's
position unless a row sets it.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from memprof.model.schema import ACTIONS, EVENT_COLUMNS, LAYERS

_DEFAULTS = {"layer": "native_heap", "device": "cpu", "pid": 100, "tid": 100}
_INT64 = ["size_bytes", "requested_bytes", "stack_id", "alloc_id"]
_TUPLE_FIELDS = ("ts_ns", "action", "addr", "size_bytes", "stack_id")


def ev(ts_ns: int, action: str, addr: int = 0, size_bytes=None, stack_id=None, **columns) -> dict:
    """One event as a dict; any other column by keyword (alloc_id=…, layer=…)."""
    return dict(ts_ns=ts_ns, action=action, addr=addr, size_bytes=size_bytes, stack_id=stack_id, **columns)


def mark(ts_ns: int, pid: int, category: str = "exit") -> dict:
    """A marker event, e.g. the root process beginning to exit."""
    return dict(ts_ns=ts_ns, action="mark", category=category, pid=pid, tid=pid)


def events_frame(rows, **defaults) -> pd.DataFrame:
    """Events DataFrame from compact rows (see module docstring)."""
    records = [dict(zip(_TUPLE_FIELDS, row)) if isinstance(row, tuple) else dict(row) for row in rows]
    base = {**_DEFAULTS, **defaults}
    columns = {}
    for name in EVENT_COLUMNS:
        values = [r.get(name, base.get(name)) for r in records]
        columns[name] = values
    columns["seq"] = [i if s is None else s for i, s in enumerate(columns["seq"])]
    columns["tid"] = [p if t is None else t for p, t in zip(columns["pid"], columns["tid"])]
    return typed_events(columns)


def typed_events(columns: dict) -> pd.DataFrame:
    """Cast column sequences to the pandas dtypes a recording reader produces."""
    n = len(columns["ts_ns"])
    get = lambda name, fill=None: columns.get(name, [fill] * n)  # noqa: E731
    return pd.DataFrame({
        "ts_ns": np.asarray(get("ts_ns"), dtype=np.int64),
        "seq": np.asarray(get("seq"), dtype=np.int64) if "seq" in columns else np.arange(n, dtype=np.int64),
        "layer": pd.Categorical(get("layer", "native_heap"), categories=LAYERS),
        "action": pd.Categorical(get("action"), categories=ACTIONS),
        "addr": np.asarray([0 if a is None else a for a in get("addr", 0)], dtype=np.uint64),
        "size_bytes": pd.array(get("size_bytes"), dtype="Int64"),
        "requested_bytes": pd.array(get("requested_bytes"), dtype="Int64"),
        "device": pd.Categorical(get("device", "cpu")),
        "pid": np.asarray(get("pid", 100), dtype=np.int32),
        "tid": np.asarray(get("tid", 100), dtype=np.int32),
        "stack_id": pd.array(get("stack_id"), dtype="Int64"),
        "alloc_id": pd.array(get("alloc_id"), dtype="Int64"),
        "step": pd.array(get("step"), dtype="Int32"),
        "category": pd.Categorical(get("category")),
        "weight": np.asarray([np.nan if w is None else w for w in get("weight")], dtype=float),
    })


def churn(n_pairs: int, *, start_ns: int = 0, every_ns: int = 1_000, size: int = 64, stack_id: int = 1,
          pool: int = 64, base_addr: int = 0x7F00_0000_0000, layer: str = "native_heap") -> pd.DataFrame:
    """n_pairs alloc/free pairs that reuse `pool` addresses round-robin: churn, no leak."""
    i = np.arange(n_pairs, dtype=np.int64)
    addr = (base_addr + (i % pool) * 4096).astype(np.uint64)
    ts = start_ns + i * every_ns
    return _pairs(np.stack([ts, ts + every_ns // 2], 1).ravel(), np.repeat(addr, 2),
                  np.tile(["alloc", "free"], n_pairs), size, stack_id, layer)


def leak(count: int, *, start_ns: int = 0, every_ns: int = 1_000, size: int = 4096, stack_id: int = 2,
         base_addr: int = 0x5500_0000_0000, layer: str = "native_heap") -> pd.DataFrame:
    """`count` allocations at distinct addresses that are never freed."""
    i = np.arange(count, dtype=np.int64)
    return _pairs(start_ns + i * every_ns, (base_addr + i * 65536).astype(np.uint64),
                  np.array(["alloc"] * count), size, stack_id, layer)


def random_lifetimes(n_allocs: int, *, seed: int = 0, live_fraction: float = 0.01) -> pd.DataFrame:
    """~2·n_allocs events: allocations at random addresses with exponential lifetimes, a
    fraction never freed, several layers; in timeline order. For speed checks."""
    rng = np.random.default_rng(seed)
    alloc_ts = np.sort(rng.integers(0, 60 * 10**9, n_allocs))
    free_ts = alloc_ts + rng.exponential(5e7, n_allocs).astype(np.int64) + 1
    freed = rng.random(n_allocs) >= live_fraction
    addr = rng.integers(1, 2**36, n_allocs, dtype=np.uint64) * 16
    layer = np.array(["native_heap", "kernel_slab", "torch_cpu"])[rng.integers(0, 3, n_allocs)]
    ts = np.concatenate([alloc_ts, free_ts[freed]])
    order = np.argsort(ts, kind="stable")
    action = np.array(["alloc"] * n_allocs + ["free"] * int(freed.sum()))
    return _pairs(ts[order], np.concatenate([addr, addr[freed]])[order], action[order],
                  np.concatenate([rng.integers(1, 1 << 20, n_allocs), np.zeros(freed.sum(), np.int64)])[order],
                  rng.integers(1, 1000, len(ts))[order], np.concatenate([layer, layer[freed]])[order])


def concat_events(*frames: pd.DataFrame) -> pd.DataFrame:
    """Merge event frames into one timeline: sorted by ts_ns, `seq` renumbered."""
    merged = pd.concat(frames, ignore_index=True)
    for name in ("layer", "action", "device", "category"):
        merged[name] = merged[name].astype("category")
    merged = merged.sort_values("ts_ns", kind="stable", ignore_index=True)
    merged["seq"] = np.arange(len(merged), dtype=np.int64)
    return merged


def stacks_frames(chains: dict[int, list[tuple]]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(stacks, frames) from {stack_id: [(kind, function, module, file, line), …innermost first]}."""
    stack_rows, frame_rows = [], []
    for stack_id, chain in chains.items():
        for depth, (kind, function, module, file, line) in enumerate(chain):
            frame_id = len(frame_rows)
            frame_rows.append((frame_id, kind, function, module, file, line))
            stack_rows.append((stack_id, depth, frame_id))
    stacks = pd.DataFrame(stack_rows, columns=["stack_id", "depth", "frame_id"]).astype(
        {"stack_id": "int64", "depth": "int32", "frame_id": "int64"})
    frames = pd.DataFrame(frame_rows, columns=["frame_id", "kind", "function", "module", "file", "line"])
    return stacks, frames.astype({"frame_id": "int64", "line": "Int32"})


def _pairs(ts, addr, action, size, stack_id, layer) -> pd.DataFrame:
    n = len(ts)
    is_free = np.asarray(action) != "alloc"
    size = np.resize(np.asarray(size, dtype=np.int64), n)
    return typed_events({
        "ts_ns": ts, "action": action, "addr": addr,
        "size_bytes": pd.arrays.IntegerArray(np.where(is_free, 0, size), is_free),
        "stack_id": np.resize(np.asarray(stack_id, dtype=np.int64), n),
        "layer": np.resize(np.asarray(layer), n),
        "device": np.full(n, "cpu"), "pid": np.full(n, 100), "tid": np.full(n, 100),
    })
