"""Allocation lifetimes: each alloc paired with the free that ended it (DESIGN.md §3).

Pure functions over the timeline; no I/O. Times are CLOCK_MONOTONIC ns (`ts_ns`), sizes bytes.

Pairing key is (`layer`, `device`, `alloc_id` where the source gives one, else `addr`).
Within a key, rows are ordered by (`ts_ns`, `seq`) and each row is judged by its neighbour:

- alloc, then a free of the same key: freed at that free's `ts_ns` (`end_kind` "freed");
- alloc, then another alloc of the same key: the free was missed (the address was handed
  out again, so the old allocation was freed unseen); closed at the new alloc's `ts_ns`
  (`end_kind` "missed") and counted in `missed_frees`;
- alloc with nothing after it: live at the end of the recording (`end_kind` "live",
  `end_ts_ns` NA);
- a free whose previous row of the key is not an alloc: an unmatched free (the allocation
  predates the recording, or the free is a duplicate), counted in `unmatched_frees`.

An exec ends the user-space allocations its process still held (`end_kind` "freed", at the
exec's `mark` row): the old image's address space is gone (_end_at_exec).

`free_requested` ends an allocation like `free`; a `free` that directly follows a
`free_requested` of the same key is that request's completion (PyTorch's caching allocator
reports both), not an unmatched free.
"""
from __future__ import annotations

import enum
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np
import pandas as pd

from memprof.model.schema import Action, Layer, Mark

END_KINDS = ("freed", "missed", "live")
_FREED, _MISSED, _LIVE = range(3)

# Row kinds used internally (0: not part of pairing).
_ALLOC, _FREE, _FREE_REQUESTED = 1, 2, 3
_KIND_OF_ACTION = {Action.ALLOC.value: _ALLOC, Action.FREE.value: _FREE,
                   Action.FREE_REQUESTED.value: _FREE_REQUESTED}

_CARRIED = ["layer", "device", "addr", "alloc_id", "pid", "tid", "stack_id", "size_bytes",
            "requested_bytes", "ts_ns", "category"]
ALLOCATION_COLUMNS = ["layer", "device", "addr", "alloc_id", "pid", "tid", "stack_id", "size_bytes",
                      "requested_bytes", "alloc_ts_ns", "end_ts_ns", "end_kind", "weight", "category",
                      "module"]
# `end_ts_ns` of an allocation that never ended (NA in the column), as int64: later than any time.
NEVER = np.iinfo(np.int64).max


def end_times(allocations: pd.DataFrame) -> np.ndarray:
    """`end_ts_ns` as int64, NEVER where the allocation never ended."""
    return allocations["end_ts_ns"].to_numpy(dtype=np.int64, na_value=NEVER)


def live_mask(alloc_ts: np.ndarray, end_ts: np.ndarray, t) -> np.ndarray:
    """Per allocation: live at `t` (a time, or one per allocation), alloc_ts <= t < end_ts.
    `end_ts` as end_times gives it (NEVER: still live)."""
    return (alloc_ts <= t) & (t < end_ts)


@dataclass
class Lifetimes:
    """Every allocation seen, with how and when it ended.

    `allocations` has ALLOCATION_COLUMNS, one row per alloc event, in timeline order:
    `alloc_ts_ns` is the alloc's `ts_ns`; `end_ts_ns` (nullable Int64) is when it ended, NA
    when live at the end of the recording; `end_kind` is "freed", "missed" or "live";
    `category` is what the timeline named the allocation (a tensor role, or model state
    "state:ROLE:NAME"), null where nothing did; `module` the nn.Module instance path running on
    the allocating thread (timeline.with_modules), null where none did. `unmatched_frees` and `missed_frees` count
    per layer (layers with none are absent).
    """

    allocations: pd.DataFrame
    unmatched_frees: dict[str, int] = field(default_factory=dict)
    missed_frees: dict[str, int] = field(default_factory=dict)
    # Of a folded recording (analysis.fold): the allocations it dropped by (layer, pid, stack_id,
    # module): rows (`count`), weighted allocations (`n`) and bytes, so a chain's module is judged
    # on all of its allocations and a module's totals count them. None: none dropped.
    folded_modules: pd.DataFrame | None = None

    def folded_modules_of(self, layers: set[str] | None) -> pd.DataFrame | None:
        """`folded_modules` of the `layers` only (None: every layer)."""
        if self.folded_modules is None or layers is None:
            return self.folded_modules
        return self.folded_modules[self.folded_modules["layer"].isin(list(layers)).to_numpy()]


def pair_lifetimes(events: pd.DataFrame, execs: Mapping[int, np.ndarray] | None = None) -> Lifetimes:
    """Pair allocs with frees over an events frame with the EVENTS_SCHEMA columns. `execs`:
    pid -> when it exec'd (exec_times), for a frame that holds only allocation rows (a
    folded analysis's batches); None reads them from the frame's own `mark` rows.

    Vectorized: each alloc/free row is judged by the next and the previous row of its pairing
    key in (ts_ns, seq) order, found by a group-wise shift over the dense key (no sort when the
    timeline is in time order, as `timeline()` makes it). bench/analysis_speed.py measures it.
    """
    kind = _row_kinds(events["action"])
    layer_codes, layer_names = category_codes(events["layer"])
    # Every row takes part, marks included (they get a group of their own, so they never
    # meet an allocation): no gather of 10^7-row columns down to the alloc/free rows.
    key = _as_groups(_pairing_key(events, kind, layer_codes))
    ts, seq = events["ts_ns"].to_numpy(), events["seq"].to_numpy()
    by_time = None if _in_time_order(ts, seq) else np.lexsort((seq, ts))
    if by_time is None:
        end_kind, end_ts, unmatched = _judge(key, kind, ts)
    else:  # judge in time order, then put the verdicts back in row order
        end_kind, end_ts, unmatched = _unpermuted(_judge(key[by_time], kind[by_time], ts[by_time]), by_time)
    del key
    _end_at_exec(events, kind, layer_codes, layer_names, end_kind, end_ts,
                 exec_times(events, kind) if execs is None else execs)

    is_alloc = kind == _ALLOC
    positions = np.flatnonzero(is_alloc)
    allocations = _allocations_frame(events, positions, end_ts[positions], end_kind[positions])
    return Lifetimes(
        allocations=allocations,
        unmatched_frees=_count_by_layer(layer_codes[unmatched], layer_names),
        missed_frees=_count_by_layer(layer_codes[is_alloc & (end_kind == _MISSED)], layer_names),
    )


# Layers whose allocations live in the kernel, not in a process's address space: an exec
# leaves them as they are (what the exec frees of them, the probes see being freed).
_KERNEL_LAYERS = frozenset({Layer.KERNEL_SLAB.value, Layer.KERNEL_PAGE.value})


def exec_times(events: pd.DataFrame, kind: np.ndarray | None = None) -> dict[int, np.ndarray]:
    """pid -> when it exec'd (int64 ns, ascending), from the `mark`/"exec" rows; `kind` as
    _row_kinds gives it (marks are among its 0 rows), computed when not given."""
    kind = _row_kinds(events["action"]) if kind is None else kind
    others = np.flatnonzero(kind == 0)
    if others.size == 0:
        return {}
    execs = others[_equals(events["category"], others, Mark.EXEC.value) & _equals(events["action"], others, Action.MARK.value)]
    if execs.size == 0:
        return {}
    frame = pd.DataFrame({"pid": events["pid"].to_numpy(dtype=np.int64)[execs],
                          "ts": events["ts_ns"].to_numpy(dtype=np.int64)[execs]})
    return {int(pid): np.sort(rows["ts"].to_numpy()) for pid, rows in frame.groupby("pid")}


def _equals(column: pd.Series, positions: np.ndarray, value: str) -> np.ndarray:
    """Per position of `column` (categorical, object or string): its value is `value` (False where missing)."""
    return column.iloc[positions].eq(value).to_numpy(dtype=bool, na_value=False)


def _end_at_exec(events: pd.DataFrame, kind: np.ndarray, layer_codes: np.ndarray, layer_names: np.ndarray,
                 end_kind: np.ndarray, end_ts: np.ndarray, execs: Mapping[int, np.ndarray]) -> None:
    """In place, per row: a user-space allocation (any layer but the kernel's) of a process
    that exec'd after making it and before it ended was freed by that exec (its image's
    address space went with it): `end_kind` _FREED at the first such exec's time. Without
    this, what a wrapper (env, a shell's exec, memprof's own gated child) allocated before
    exec'ing the real program would look held to the end. A later allocation of the same
    address, in the new image, no longer counts as a missed free of it. `execs` as
    exec_times gives them."""
    if not execs:
        return
    user_layer = np.array([label_of(name) not in _KERNEL_LAYERS for name in layer_names] + [False], dtype=bool)
    pid = events["pid"].to_numpy(dtype=np.int64, na_value=-1)
    # One pass over the rows, however many processes exec'd (a job that runs a tool each step
    # execs thousands): the candidates, then each process's among them.
    candidates = np.flatnonzero((kind == _ALLOC) & user_layer[layer_codes]  # code -1 (no layer): the trailing False
                                & np.isin(pid, np.fromiter(execs, dtype=np.int64), kind="table"))
    ts = events["ts_ns"].to_numpy(dtype=np.int64)
    for process, at in pd.Series(candidates).groupby(pid[candidates]).indices.items():
        rows, times = candidates[at], execs[process]
        after = np.searchsorted(times, ts[rows], side="right")  # the first exec after the allocation
        rows, exec_ts = rows[after < times.size], times[after[after < times.size]]
        ended_before = (end_kind[rows] != _LIVE) & (end_ts[rows] <= exec_ts)
        rows, exec_ts = rows[~ended_before], exec_ts[~ended_before]
        end_kind[rows] = _FREED
        end_ts[rows] = exec_ts


def _row_kinds(action: pd.Series) -> np.ndarray:
    """Per event: _ALLOC, _FREE, _FREE_REQUESTED, or 0 for rows pairing ignores."""
    codes, names = category_codes(action)
    kind_of_label = np.array([_KIND_OF_ACTION.get(label_of(x), 0) for x in names] + [0], dtype=np.int8)
    return kind_of_label[codes]  # code -1 (missing) picks the trailing 0


def user_space_pids(events: pd.DataFrame, layer_codes: np.ndarray, layer_names) -> np.ndarray:
    """Per row, the pid that scopes its address: the process's own for a user-space layer
    (native heap, PyTorch's allocators, the CUDA driver: each process has its own address
    space, and a fork's children hand out the very addresses their siblings do), -1 for the
    kernel's layers (one address space: an object may be freed on any task's time)."""
    column = events["pid"]
    pid = (column.to_numpy(dtype=np.int64, na_value=-1) if column.hasnans
           else column.to_numpy().astype(np.int64))
    kernel_codes = [code for code, name in enumerate(layer_names) if label_of(name) in _KERNEL_LAYERS]
    if kernel_codes:
        pid[np.isin(layer_codes, kernel_codes)] = -1
    return pid


def _one_process(events: pd.DataFrame) -> bool:
    """Every row of one process (most recordings): no address needs its pid to pair."""
    column = events["pid"]
    if not len(column):
        return True
    if column.hasnans:
        return False
    pid = column.to_numpy()
    return bool(pid.min() == pid.max())


def _pairing_key(events: pd.DataFrame, kind: np.ndarray, layer_codes: np.ndarray) -> np.ndarray:
    """One int64 per row, in [0, rows × groups), equal exactly when (layer, device, pid for a
    user-space layer (user_space_pids), alloc_id-or-addr) are equal; rows pairing ignores
    (`kind` 0) share a group of their own.

    `alloc_id` and `addr` are separate namespaces: a row keyed by id never meets one keyed by
    address. Values are densified by hashing (pd.factorize), so the key is dense enough to
    group by as categorical codes. Without the pid, two forked workers' allocations at one
    address closed each other as missed frees: half of what they leaked went uncounted. The
    pid goes into the value (_scoped_values), not the group: the key's span, which _as_groups
    tables, stays groups × distinct values, not that times the processes.
    """
    device_codes, device_names = category_codes(events["device"])
    has_id = events["alloc_id"].notna().to_numpy()
    values = events["addr"].to_numpy().astype(np.uint64, copy=False)
    if has_id.any():  # most sources have no ids: skip the extra pass then
        ids = events["alloc_id"].to_numpy(dtype=np.int64, na_value=0).view(np.uint64)
        values = np.where(has_id, ids, values)
    if not _one_process(events):
        values = _scoped_values(values, user_space_pids(events, layer_codes, category_codes(events["layer"])[1]))
    value_codes, uniques = _factorized(values)
    del values
    # A handful of (layer, device, id-or-address) groups. In-place int32 arithmetic: on 10^7
    # rows every temporary array is 40-80 MB of fresh pages, and faulting them in is much of
    # the cost here.
    group = layer_codes.astype(np.int32)
    group += 2
    group *= len(device_names) + 1
    group += device_codes
    group += 1
    group *= 2
    group += has_id
    group[kind == 0] = 0
    key = _renumbered(group).astype(np.int64)
    del group
    key *= max(len(uniques), 1)
    key += value_codes
    return key


# A user-space address (x86-64 and aarch64: below 2^48) and its process's code (below 2^16)
# fit one uint64 together; other values (a fuzzed file's) are scoped by a second hashing.
_ADDRESS_BITS = 48


def _scoped_values(values: np.ndarray, pids: np.ndarray) -> np.ndarray:
    """`values` (ids or addresses, uint64) made distinct per process where `pids` (from
    user_space_pids) is ≥ 0 and more than one process is there: the process's code in the
    bits above an address, or, where a value or the processes do not fit, each (value,
    process) pair numbered by hashing. Unchanged for a one-process recording."""
    codes, count = _scope_codes(pids)
    if count == 1:
        return values
    scoped = pids >= 0
    if count <= (1 << (64 - _ADDRESS_BITS)) and int(np.max(values, where=scoped, initial=0)) < (1 << _ADDRESS_BITS):
        shifted = codes.astype(np.uint64)
        shifted <<= np.uint64(_ADDRESS_BITS)
        shifted |= values
        return np.where(scoped, shifted, values)
    value_codes, _ = _factorized(values)
    return value_codes.astype(np.uint64) * np.uint64(count) + codes.astype(np.uint64)


# Pids up to the kernel's largest pid_max (2^22) are renumbered by a table indexed by pid, a
# lookup per row; others (a file's pid column may hold any int32) by hashing: a table for a
# fuzzed recording's pid 2^31 - 1 took 16 GiB, and the suite's run was killed for memory.
_PID_TABLE_UP_TO = 1 << 22


def _scope_codes(pids: np.ndarray) -> tuple[np.ndarray, int]:
    """(per row a dense code of its user_space_pids value, how many codes): all 0 where the
    user-space rows are of one process (most recordings: nothing to tell apart)."""
    lowest, highest = int(pids.min(initial=0)), int(pids.max(initial=0))
    user = pids[pids >= 0] if lowest < 0 else pids
    if len(user) == 0 or user.min() == user.max():
        return np.zeros(len(pids), dtype=np.int32), 1
    if lowest >= -1 and highest < _PID_TABLE_UP_TO:
        codes = _renumbered(pids + 1)
        return codes.astype(np.int32, copy=False), int(codes.max()) + 1
    codes, uniques = pd.factorize(pids)
    return codes.astype(np.int32), len(uniques)


_SPLIT_AT = 2_000_000  # rows: below this, one thread factorizes faster than two and a merge


def _factorized(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """pd.factorize on two threads (it releases the GIL while hashing): each half is
    factorized alone, then the halves' uniques are merged and their codes mapped to the
    merged ones. Codes are dense (0..uniques-1) but not in first-seen order across halves."""
    if len(values) < _SPLIT_AT:
        return pd.factorize(values)
    half = len(values) // 2
    with ThreadPoolExecutor(2) as pool:
        (first, first_uniques), (second, second_uniques) = pool.map(pd.factorize, (values[:half], values[half:]))
    merged_codes, uniques = pd.factorize(np.concatenate([first_uniques, second_uniques]))
    codes = np.empty(len(values), dtype=np.int64)
    codes[:half] = merged_codes[:len(first_uniques)][first]
    codes[half:] = merged_codes[len(first_uniques):][second]
    return codes, uniques


def _renumbered(group: np.ndarray) -> np.ndarray:
    """Small non-negative codes renumbered 0..k-1 in order (a handful of groups are present), so
    the key spans as few bits as it can; a lookup table, not a sort."""
    present = np.bincount(group) > 0 if len(group) else np.zeros(1, dtype=bool)
    table = (np.cumsum(present) - 1).astype(group.dtype)
    return table[group]


def _in_time_order(ts: np.ndarray, seq: np.ndarray) -> bool:
    """True when rows are ordered by (ts, seq). Comparisons, not np.diff: no int64 temporaries."""
    if len(ts) < 2:
        return True
    rising, same = ts[1:] > ts[:-1], ts[1:] == ts[:-1]
    return bool((rising | (same & (seq[1:] > seq[:-1]))).all())


def _unpermuted(arrays, order: np.ndarray) -> list[np.ndarray]:
    """Each array (in `order`'s order) put back in row order."""
    out = []
    for values in arrays:
        back = np.empty_like(values)
        back[order] = values
        out.append(back)
    return out


def _as_groups(key: np.ndarray) -> pd.Categorical:
    """The pairing key as a categorical of dense codes: the k distinct keys renumbered 0..k-1
    in key order, by a lookup table over the key's span (no hashing). next_of_key groups by
    these codes in one linear pass; left sparse (the key spans groups × distinct values, more
    than the rows on a folded part's mostly unique addresses), pandas would recode them
    through a hash table first: next_of_key took 0.46-0.72 s on 10^7 events that way, and
    0.18-0.39 s so (bench/RESULTS.md, "The leak report had slowed"). The int64 key is not
    kept."""
    if not len(key):
        return pd.Categorical.from_codes(np.zeros(0, dtype=np.int8), categories=pd.RangeIndex(1), validate=False)
    span = int(key.max()) + 1
    present = np.zeros(span, dtype=bool)
    present[key] = True
    table = np.cumsum(present, dtype=np.int32 if span < 2**31 else np.int64)
    del present
    table -= 1
    return pd.Categorical.from_codes(table[key], categories=pd.RangeIndex(int(table[-1]) + 1), validate=False)


def _judge(key: pd.Categorical, kind: np.ndarray, ts: np.ndarray):
    """For rows in time order: (end_kind, end_ts, unmatched-free mask) of every row, judged by
    the next and the previous row of the same key. end_kind/end_ts are only meaningful on
    alloc rows."""
    n = len(kind)
    following = next_of_key(key)  # the next row of the same key, -1 where none
    prev_kind = previous_kinds(kind, following)
    has_next = following >= 0
    following = following[has_next]
    next_kind = np.zeros(n, dtype=np.int8)
    next_kind[has_next] = kind[following]
    end_ts = np.zeros(n, dtype=np.int64)
    end_ts[has_next] = ts[following]

    end_kind = np.full(n, _LIVE, dtype=np.int8)
    end_kind[next_kind == _ALLOC] = _MISSED
    end_kind[(next_kind == _FREE) | (next_kind == _FREE_REQUESTED)] = _FREED
    return end_kind, end_ts, unmatched_frees(kind, prev_kind)


def next_of_key(key: pd.Categorical) -> np.ndarray:
    """For rows in time order, grouped by `key` (as _as_groups makes it: every category
    present): per row, the position of the next row of its key, -1 where none. One
    group-wise shift of row positions (no sort). `observed=False, sort=True` has pandas
    take the codes as they are; its arrays are sized by the categories, which dense codes
    keep at most the rows."""
    n = len(key)
    positions = np.arange(n, dtype=np.int32 if n < 2**31 else np.int64)
    following = pd.Series(positions, copy=False).groupby(key, sort=True, observed=False).shift(-1, fill_value=-1)
    return following.to_numpy()


def previous_kinds(kind: np.ndarray, following: np.ndarray) -> np.ndarray:
    """Per row: the kind of the row before it of its key (0: none), the inverse of `following`."""
    has_next = following >= 0
    prev_kind = np.zeros(len(kind), dtype=np.int8)
    prev_kind[following[has_next]] = kind[has_next]
    return prev_kind


def unmatched_frees(kind: np.ndarray, prev_kind: np.ndarray) -> np.ndarray:
    """Per row: a free (or free request) that follows no allocation of its key, and is not
    the completion of a free request (PyTorch's caching allocator reports both)."""
    is_free = (kind == _FREE) | (kind == _FREE_REQUESTED)
    completion = (kind == _FREE) & (prev_kind == _FREE_REQUESTED)
    return is_free & (prev_kind != _ALLOC) & ~completion


def _allocations_frame(events: pd.DataFrame, positions: np.ndarray, end_ts: np.ndarray,
                       end_kind: np.ndarray) -> pd.DataFrame:
    """ALLOCATION_COLUMNS of the alloc rows at `positions`: each column taken once, no frame copies."""
    columns = {name: events[name].array.take(positions) for name in _CARRIED}
    columns["alloc_ts_ns"] = columns.pop("ts_ns")
    live = end_kind == _LIVE
    end_ts[live] = 0
    columns["end_ts_ns"] = pd.arrays.IntegerArray(end_ts, live)
    columns["end_kind"] = pd.Categorical.from_codes(end_kind, categories=list(END_KINDS))
    columns["weight"] = _weights(events, positions)
    columns["module"] = _modules(events, positions)
    return pd.DataFrame({name: columns[name] for name in ALLOCATION_COLUMNS}, copy=False)


def _modules(events: pd.DataFrame, positions: np.ndarray) -> pd.Categorical:
    """The `module` timeline.with_modules derived for the alloc rows at `positions` (the
    nn.Module path running on the allocating thread; null where none), all null for events
    that have no such column (a timeline built without it)."""
    if "module" not in events:
        return pd.Categorical.from_codes(np.full(len(positions), -1, dtype=np.int8), categories=[])
    return events["module"].array.take(positions)


def _weights(events: pd.DataFrame, positions: np.ndarray) -> np.ndarray:
    """How many allocations each one stands for (sampled sources), 1.0 where not sampled."""
    if "weight" not in events:
        return np.ones(len(positions))
    weight = events["weight"].to_numpy(dtype=float, na_value=np.nan)[positions]
    weight[np.isnan(weight)] = 1.0
    return weight


def _count_by_layer(layer_codes: np.ndarray, layer_names: np.ndarray) -> dict[str, int]:
    counts = np.bincount(layer_codes + 1, minlength=len(layer_names) + 1)
    names = ["?"] + [label_of(x) for x in layer_names]
    return {names[i]: int(c) for i, c in enumerate(counts) if c}


def labels(column: pd.Series) -> np.ndarray:
    """The column's values as text (object array; None where missing), without a Python call per row."""
    codes, names = category_codes(column)
    return np.array([label_of(x) for x in names] + [None], dtype=object)[codes]


def category_codes(column: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """Integer codes (-1 = missing) and the labels they index, for categorical or plain columns
    (a plain column is factorized: one hash pass)."""
    if isinstance(column.dtype, pd.CategoricalDtype):
        return column.cat.codes.to_numpy(), column.cat.categories.to_numpy(dtype=object)
    codes, uniques = pd.factorize(column, use_na_sentinel=True)
    return codes, np.asarray(uniques, dtype=object)


def label_of(value) -> str:
    """A category label as text."""
    # str() of a str-mixin Enum gives "Layer.X" on Python >= 3.11; we want its value.
    return str(value.value) if isinstance(value, enum.Enum) else str(value)
