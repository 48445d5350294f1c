"""The merged timeline: one table, one clock, sorted. After this, nothing knows which
source a row came from (DESIGN.md §2).

Speed (bench/analysis_speed.py, 10^7 events): a recording arrives nearly in time order (the
ring buffer interleaves CPUs), so the order is found with one stable argsort of `ts_ns`
(timsort: linear on nearly sorted input), the frame is not copied when already in order, and
columns are only replaced (pandas copy-on-write), never the whole frame copied.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from memprof.model.frames import concat_frames
from memprof.model.schema import MODULE_NONE, MODULE_PREFIX, MODULE_RETURN_PREFIX, STATE_PREFIX, TENSOR_PREFIX, Action, Mark


def timeline(recording) -> pd.DataFrame:
    """The recording's events in time order (ties keep ingest order, `seq`), with `step`
    filled in from the step marks, and the allocations the agent named given their tensor
    role (profiler windows) and their model-state role and name.

    Every source of this version stamps CLOCK_MONOTONIC ns already; sources with epoch time
    are converted in their adapters through the clock anchors."""
    events = recording.events
    if len(events) == 0:
        return events
    # Model state last: its "state:ROLE:NAME" is the more precise, and wins over a profiler role.
    return with_modules(with_model_state(with_tensor_roles(with_steps(in_time_order(events)))))


def annotated_batch(batch: pd.DataFrame, others: pd.DataFrame) -> pd.DataFrame:
    """A time-ordered batch of allocation and free rows, of a recording read in batches
    (recording.stream), given what `timeline()` gives them from the rest of the recording:
    each allocation's tensor role (with_tensor_roles) and nn.Module (with_modules), from
    `others` (the recording's other rows, in time order). Model state is named later, on the
    paired allocations (analysis.fold.named_model_state): its notes come long after the
    allocation they name. The same rows, in the same order."""
    if len(batch) == 0 or len(others) == 0:
        return batch
    ts = others["ts_ns"].to_numpy()
    low, high = int(batch["ts_ns"].iloc[0]), int(batch["ts_ns"].iloc[-1])
    near = (ts >= low - ROLE_TOLERANCE_NS) & (ts <= high + ROLE_TOLERANCE_NS)
    read = _is_boundary(others) | (_is_mark(others) & _has_prefix(others["category"], TENSOR_PREFIX))
    context = others[(near & read) | _last_boundary_before(others, low)]
    if len(context) == 0:
        return batch
    merged = in_time_order(concat_frames([context.assign(_batch=False), batch.assign(_batch=True)]))
    mine = merged.pop("_batch").to_numpy(dtype=bool)
    annotated = with_modules(with_tensor_roles(merged))
    return annotated[mine].reset_index(drop=True)


def _last_boundary_before(events: pd.DataFrame, ts_ns: int) -> np.ndarray:
    """Rows that are each thread's last module boundary before `ts_ns` (what runs on it then)."""
    rows = np.flatnonzero(_is_boundary(events) & (events["ts_ns"].to_numpy() < ts_ns))
    out = np.zeros(len(events), dtype=bool)
    if len(rows):
        threads = events.iloc[rows][["pid", "tid"]].reset_index(drop=True)
        out[rows[~threads.duplicated(keep="last").to_numpy()]] = True
    return out


def _is_boundary(events: pd.DataFrame) -> np.ndarray:
    """Rows that are module boundaries (schema.MODULE_PREFIX, MODULE_RETURN_PREFIX, MODULE_NONE)."""
    return _is_mark(events) & (_has_prefix(events["category"], MODULE_PREFIX)
                               | _has_prefix(events["category"], MODULE_RETURN_PREFIX)
                               | (events["category"] == MODULE_NONE).to_numpy())


def with_modules(events: pd.DataFrame) -> pd.DataFrame:
    """Add the derived column `module`: on each `alloc` row, the nn.Module instance path
    (`transformer.h.3.attn`; "" the outermost module) that was running on the allocating
    thread (same pid and tid) at its ts_ns, from the latest module boundary of that thread at
    or before it (schema.MODULE_PREFIX, MODULE_RETURN_PREFIX); null on other rows, when none was running, and when
    the recording has no boundaries (the column is there either way). Vectorized: one
    pd.merge_asof by (pid, tid) of the alloc rows on the boundary rows. `events` must be in
    time order."""
    is_boundary = _is_boundary(events)
    empty = pd.Categorical.from_codes(np.full(len(events), -1, dtype=np.int8), categories=[])
    if not is_boundary.any():
        return _with_column(events, "module", empty)
    categories = events.loc[is_boundary, "category"].astype(str).astype("category")
    labels = categories.cat.categories
    named = [None if c == MODULE_NONE else module_path(c) for c in labels]
    paths = pd.Index(pd.unique(pd.Series([p for p in named if p is not None], dtype=object)), dtype=object)
    path_code = np.array([-1 if p is None else paths.get_loc(p) for p in named], dtype=np.int64)
    bounds = events.loc[is_boundary, ["ts_ns", "pid", "tid"]].assign(code=path_code[categories.cat.codes.to_numpy()])
    is_alloc = (events["action"] == Action.ALLOC.value).to_numpy()
    allocs = events.loc[is_alloc, ["ts_ns", "pid", "tid"]].assign(at=np.flatnonzero(is_alloc))
    matched = pd.merge_asof(allocs, bounds, on="ts_ns", by=["pid", "tid"], direction="backward")
    codes = np.full(len(events), -1, dtype=np.int32)
    codes[matched["at"].to_numpy()] = matched["code"].fillna(-1).to_numpy(dtype=np.int32)
    return _with_column(events, "module", pd.Categorical.from_codes(codes, categories=paths))


def module_path(category: str) -> str | None:
    """The module path a boundary's category names (module docstring of
    sources/agent_reader/modules.py); None for MODULE_NONE or another category."""
    for prefix in (MODULE_PREFIX, MODULE_RETURN_PREFIX):
        if category.startswith(prefix):
            return category[len(prefix):]
    return None


def _with_column(events: pd.DataFrame, name: str, values) -> pd.DataFrame:
    events = events.copy(deep=False)  # copy-on-write: only the new column is new
    events[name] = values
    return events


def in_time_order(events: pd.DataFrame) -> pd.DataFrame:
    """`events` sorted by (`ts_ns`, `seq`), stably, with a fresh RangeIndex; the same data
    (no copy) when already in that order."""
    order = time_order(events["ts_ns"].to_numpy(), events["seq"].to_numpy())
    if order is None:
        return events if isinstance(events.index, pd.RangeIndex) and events.index.start == 0 \
            and events.index.step == 1 else events.reset_index(drop=True)
    moved = np.flatnonzero(order != np.arange(len(order)))
    if len(moved) > len(order) // 16:
        return events.take(order).reset_index(drop=True)
    # Nearly in order (the ring buffer only interleaves CPUs): copy each column and move the
    # few rows that are out of place, instead of gathering every row through `order`.
    return pd.DataFrame({name: _patched(events[name], moved, order[moved]) for name in events.columns}, copy=False)


_MASKED = {"i": pd.arrays.IntegerArray, "u": pd.arrays.IntegerArray, "f": pd.arrays.FloatingArray,
           "b": pd.arrays.BooleanArray}


def _patched(column: pd.Series, rows: np.ndarray, sources: np.ndarray):
    """The column's values with values[rows] = old values[sources]: a plain copy but for them."""
    dtype = column.dtype
    if isinstance(dtype, pd.CategoricalDtype):
        return pd.Categorical.from_codes(_moved(column.cat.codes.to_numpy(), rows, sources), dtype=dtype)
    if isinstance(dtype, pd.api.extensions.ExtensionDtype):
        masked = _MASKED.get(getattr(dtype, "kind", ""))
        if masked is None:  # another extension type: gather it whole
            order = np.arange(len(column))
            order[rows] = sources
            return column.array.take(order)
        values = column.to_numpy(dtype=dtype.numpy_dtype, na_value=0)
        # to_numpy may hand out a read-only view of the column's data: copy, as for the rest.
        return masked(_moved(values, rows, sources), _moved(column.isna().to_numpy(), rows, sources))
    return _moved(column.to_numpy(), rows, sources)


def _moved(values: np.ndarray, rows: np.ndarray, sources: np.ndarray) -> np.ndarray:
    fixed = values.copy()
    fixed[rows] = values[sources]
    return fixed


def time_order(ts: np.ndarray, seq: np.ndarray) -> np.ndarray | None:
    """Positions that sort rows stably by (ts, seq); None when they are in that order already
    (the recorder writes each part in that order, so usually they are)."""
    if len(ts) < 2:
        return None
    rising, same = ts[1:] > ts[:-1], ts[1:] == ts[:-1]
    if (rising | (same & (seq[1:] > seq[:-1]))).all():  # comparisons: no int64 temporaries
        return None
    if (seq[1:] > seq[:-1]).all():  # rows in ingest order: a stable sort by ts keeps it within ties
        return np.argsort(ts, kind="stable")
    return np.lexsort((seq, ts))


_CHUNK = 1 << 20  # rows per pass of with_steps

ROLE_TOLERANCE_NS = 1_000_000


def with_tensor_roles(events: pd.DataFrame) -> pd.DataFrame:
    """Hand each profiler-window tensor annotation's role to the allocation another source
    recorded at the same address of the same layer, nearest in time within 1 ms (the eBPF
    `torch_cpu` uprobe sees the allocation the profiler does): that row's `category` becomes
    the role (parameter, activation, gradient, …). `events` must be in time order."""
    is_note = _is_mark(events) & _has_prefix(events["category"], TENSOR_PREFIX)
    if not is_note.any():
        return events
    notes = events.loc[is_note, ["ts_ns", "layer", "pid", "addr", "category"]].astype(
        {"layer": "object", "category": "object", "pid": "int64"})
    is_alloc = (events["action"] == Action.ALLOC.value).to_numpy() & events["category"].isna().to_numpy()
    allocs = events.loc[is_alloc, ["ts_ns", "layer", "pid", "addr"]]
    allocs = allocs.astype({"layer": "object", "pid": "int64"}).reset_index()
    if allocs.empty:
        return events
    matched = pd.merge_asof(notes.sort_values("ts_ns"), allocs.sort_values("ts_ns"), on="ts_ns",
                            by=["layer", "pid", "addr"], direction="nearest", tolerance=ROLE_TOLERANCE_NS)
    matched = matched.dropna(subset=["index"])
    if matched.empty:
        return events
    roles = matched["category"].str.slice(len(TENSOR_PREFIX)).to_numpy(dtype=object)
    events = events.copy(deep=False)  # copy-on-write: only the replaced column is new
    events["category"] = _with_values(events["category"], matched["index"].astype(np.int64).to_numpy(), roles)
    return events


_ENDS = [Action.FREE.value, Action.FREE_REQUESTED.value]


def with_model_state(events: pd.DataFrame) -> pd.DataFrame:
    """Name the model's own tensors. Each model-state note (a `mark` row whose category is
    "state:ROLE:NAME", at a tensor's data pointer in `torch_cpu` or `cuda_block`) hands its
    category to the allocation of the same layer and address that was live at the note's
    time: the latest `alloc` there at or before the note (the agent looks at step marks and
    before exit, long after the allocation: no tolerance), unless a `free` or
    `free_requested` of that address lies between the two. An allocation named by several
    notes keeps the latest one's name (the agent names a tensor again only when it learns
    more: `Linear.weight` once a second outermost module shows `weight` is ambiguous); a note
    with no live allocation at its address changes nothing. `events` must be in time order."""
    is_note = _is_mark(events) & _has_prefix(events["category"], STATE_PREFIX)
    if not is_note.any():
        return events
    notes = _keyed(events, np.flatnonzero(is_note), "category")
    # Only rows at the notes' addresses can match: one hash pass over 10^7, then a few rows.
    here = events["addr"].isin(pd.unique(notes["addr"])).to_numpy()
    action = events["action"]
    allocs = _keyed(events, np.flatnonzero(here & (action == Action.ALLOC.value).to_numpy()))
    ends = _keyed(events, np.flatnonzero(here & action.isin(_ENDS).to_numpy()))
    # Rows are in time order, so a row's position orders it in time (ties broken by seq).
    # By pid too: a tensor's address is its process's (a DataLoader worker forked from the
    # trainer hands out the trainer's addresses, and its allocation there hid a tensor's name).
    matched = pd.merge_asof(notes, allocs.rename(columns={"at": "alloc_at"}), left_on="at", right_on="alloc_at",
                            by=["layer", "pid", "addr"], direction="backward")
    matched = pd.merge_asof(matched, ends.rename(columns={"at": "end_at"}), left_on="at", right_on="end_at",
                            by=["layer", "pid", "addr"], direction="backward")
    live = matched["alloc_at"].notna() & ~(matched["end_at"] > matched["alloc_at"])  # NaN end: never freed
    matched = matched[live].drop_duplicates("alloc_at", keep="last")
    if matched.empty:
        return events
    events = events.copy(deep=False)  # copy-on-write: only the replaced column is new
    events["category"] = _with_values(events["category"], matched["alloc_at"].astype(np.int64).to_numpy(),
                                      matched["category"].to_numpy(dtype=object))
    return events


def _keyed(events: pd.DataFrame, rows: np.ndarray, *extra: str) -> pd.DataFrame:
    """The rows at positions `rows` (ascending) as (at: the position, layer as text, pid,
    addr, *extra), for pd.merge_asof on `at`."""
    frame = events.iloc[rows][["layer", "pid", "addr", *extra]].astype({"layer": "object", "pid": "int64"})
    if extra:
        frame = frame.astype({name: "object" for name in extra})
    return frame.assign(at=rows.astype(np.int64)).reset_index(drop=True)


def _is_mark(events: pd.DataFrame) -> np.ndarray:
    return (events["action"] == Action.MARK.value).to_numpy()


def _has_prefix(column: pd.Series, prefix: str) -> np.ndarray:
    """Rows whose value starts with `prefix`; a categorical is judged on its categories (a few),
    not its rows (10^7)."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        labels = column.cat.categories.astype(str)
        hits = np.flatnonzero(labels.str.startswith(prefix))
        return np.isin(column.cat.codes.to_numpy(), hits) if len(hits) else np.zeros(len(column), dtype=bool)
    return column.astype(object).fillna("").str.startswith(prefix).to_numpy(dtype=bool)


def _with_values(column: pd.Series, rows: np.ndarray, values: np.ndarray) -> pd.Categorical:
    """`column` as a Categorical with `values` put at positions `rows` (categories added as needed)."""
    categorical = column.astype("category").array
    new = pd.Index(pd.unique(values)).difference(categorical.categories)
    categorical = categorical.add_categories(new) if len(new) else categorical
    codes = np.asarray(categorical.codes).copy()
    codes[rows] = categorical.categories.get_indexer(values)
    return pd.Categorical.from_codes(codes, dtype=categorical.dtype)


def with_steps(events: pd.DataFrame) -> pd.DataFrame:
    """Each event's training step: the number of the last step mark of its process at or
    before it (null before the first, and for processes that mark no steps). `events` must be
    in time order; rows that already carry a step keep it. The filled column is Int32 (the schema's)."""
    is_step = _is_mark(events) & (events["category"] == Mark.STEP.value).to_numpy()
    if not is_step.any():
        return events
    step = events["step"].astype("Int32")
    values = np.array(step.to_numpy(dtype=np.int32, na_value=0))  # own, writable copies: filled below
    missing = np.array(step.isna().to_numpy())
    marks = events[is_step & ~missing]
    pid, ts = events["pid"].to_numpy(), events["ts_ns"].to_numpy()
    for mark_pid, mine in marks.groupby("pid", sort=False):  # one pass per process that marks steps (a few)
        mark_ts, mark_step = mine["ts_ns"].to_numpy(), mine["step"].to_numpy(dtype=np.int32)
        for start in range(0, len(ts), _CHUNK):  # chunks: the temporaries stay small on 10^7 rows
            window = slice(start, start + _CHUNK)
            rows = np.flatnonzero((pid[window] == mark_pid) & missing[window]) + start
            at = np.searchsorted(mark_ts, ts[rows], side="right") - 1
            known = at >= 0
            values[rows[known]] = mark_step[at[known]]
            missing[rows[known]] = False
    events = events.copy(deep=False)  # copy-on-write: only the replaced column is new
    events["step"] = pd.arrays.IntegerArray(values, missing)
    return events
