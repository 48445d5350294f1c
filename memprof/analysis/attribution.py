"""Attribution: who held each layer's live bytes at one moment — by allocation chain, by
function (self and total), by tensor category, or the layer's total alone.

Pure functions over the lifetimes and the interned `stacks`/`frames` tables; no I/O. Times
are CLOCK_MONOTONIC ns, sizes bytes.

The moment a layer is judged at (`at`):
- "end": when the target began to exit (`leaks.end_of_target`), before its teardown frees;
- "peak": the layer's own high-water mark, first reached (as `layers.live_curve` gives it),
  so each layer is judged at its own time;
- an int: that many ns after the recording's start, the same time for every layer.

An allocation is live at t when alloc_ts_ns ≤ t < end_ts_ns (NA end: never ended): the
value of the layer's curve just after every event at t. Bytes are never added across
layers: every row is keyed by (layer, key). A sampled allocation stands for `weight` of
them: its bytes count as rint(size_bytes × weight) (as on the layer's curve), its count as
weight. Allocations without a size count as 0 bytes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Union

import numpy as np
import pandas as pd

from memprof.analysis.chains import DEFAULT_NATIVE_FRAMES, NativeFrames, check_native_frames, with_canonical_stacks
from memprof.analysis.layers import ChainBytes, live_curve
from memprof.analysis.lifetimes import Lifetimes, category_codes, end_times, label_of, live_mask
from memprof.analysis.modules import alloc_modules
from memprof.errors import UsageError
from memprof.model.schema import EVAL_LOOP_FUNCTIONS, LAYERS, Action, FrameKind

AT_END, AT_PEAK = "end", "peak"
BY_CHOICES = ("chain", "function", "layer", "category", "module", "rank")
NO_CATEGORY = "unknown"  # the category of allocations no source gave a tensor role
NO_FUNCTION = -1  # the function code of allocations without frames
_NO_STACK = -1

At = Union[str, int]  # AT_END, AT_PEAK, or ns after the recording's start


@dataclass(frozen=True)
class Span:
    """The recording's times, CLOCK_MONOTONIC ns: its start (origin of the relative times a
    user gives), `end_ns` (when the target began to exit; the recording's end when it did
    not) and the recording's end."""

    start_ns: int
    end_ns: int
    recording_end_ns: int

    @property
    def target_exited(self) -> bool:
        return self.end_ns < self.recording_end_ns


@dataclass(frozen=True)
class FunctionRow:
    """One function: identity (kind, function, and `module` for kernel/native frames or
    `file` for Python ones; all None for allocations without frames). `total_*`: live
    allocations whose chain holds the function (once per chain, even when recursive);
    `self_*`: those whose chain's innermost frame it is."""

    kind: str | None
    function: str | None
    module: str | None
    file: str | None
    self_bytes: int
    self_count: int
    total_bytes: int
    total_count: int


@dataclass(frozen=True)
class CategoryRow:
    """Live bytes of one tensor category (NO_CATEGORY where none was recorded)."""

    category: str
    live_bytes: int
    live_count: int


@dataclass(frozen=True)
class RankRow:
    """Live bytes of the processes of one rank of a distributed job ("rank 3", with
    "@host" when the ranks ran on several hosts; "no rank": the launcher and its tools)."""

    rank: str
    live_bytes: int
    live_count: int


@dataclass(frozen=True)
class ModuleRow:
    """Live bytes allocated inside one nn.Module instance path (`transformer.h.3.attn`; ""
    the outermost module), innermost module only; `module` None: in no module's forward."""

    module: str | None
    live_bytes: int
    live_count: int


Row = Union[ChainBytes, FunctionRow, CategoryRow, ModuleRow]


@dataclass(frozen=True)
class LayerLive:
    """One layer at `ts_ns`: everything live in it, and its rows (biggest first, at most
    `top`; `rows_left_out` more exist). No rows when grouping by layer."""

    layer: str
    ts_ns: int
    live_bytes: int
    live_count: int
    rows: list[Row]
    rows_left_out: int


@dataclass(frozen=True)
class Attribution:
    """Layers outermost first (schema order, then unknown names sorted). `at` is "end",
    "peak" or "time"."""

    by: str
    at: str
    span: Span
    layers: list[LayerLive]


def attribute(lifetimes: Lifetimes, *, by: str, at: At, span: Span, stacks: pd.DataFrame | None = None,
              frames: pd.DataFrame | None = None, events: pd.DataFrame | None = None,
              layers: Iterable[str] | None = None, top: int | None = 10,
              canonical_stack: Mapping[int, int] | None = None, native_frames: str = DEFAULT_NATIVE_FRAMES,
              rank_of_pid: Callable[[np.ndarray], np.ndarray] | None = None) -> Attribution:
    """Live bytes of each layer at `at` (module docstring), grouped `by` one of BY_CHOICES.

    "function" needs `stacks` and `frames` (chains read as `native_frames` says: "merged"
    drops the interpreter's eval-loop frames where the Python frames they ran are known);
    "category" needs the `events` the lifetimes were paired from, and so does "module" unless
    the allocations carry their `module`; "rank" needs `rank_of_pid` (pids -> rank labels,
    ranks.rank_labels). `layers` keeps only those;
    `top` None keeps every row. Raises UsageError for a time outside the recording."""
    if by not in BY_CHOICES:
        raise ValueError(f"by must be one of {BY_CHOICES}, not {by!r}")
    if by == "function" and (stacks is None or frames is None):
        raise ValueError("grouping by function needs the stacks and frames tables")
    allocations = with_canonical_stacks(lifetimes.allocations, canonical_stack)
    table, names = _allocation_table(allocations, events if by == "category" else None, layers)
    if by == "module":
        table["module"] = alloc_modules(allocations, events)[table.index.to_numpy()]
    if by == "rank":
        if rank_of_pid is None:
            raise ValueError("grouping by rank needs rank_of_pid")
        table["rank"] = rank_of_pid(allocations["pid"].to_numpy()[table.index.to_numpy()])
    times = judge_times(table, at, span)
    live = _live_at(table, times)
    if by == "function":
        grouped = _by_function(live, stacks, frames, native_frames)
    else:
        grouped = _GROUPERS[by](live)
    layer_rows = [_layer_live(label_of(names[code]), times[code], live, grouped, code, by, top)
                  for code in _layer_order(times, names)]
    return Attribution(by=by, at=at if isinstance(at, str) else "time", span=span, layers=layer_rows)


# --- the moment -----------------------------------------------------------------------------

def judge_times(table: pd.DataFrame, at: At, span: Span) -> dict[int, int]:
    """layer code -> the ts_ns it is judged at, for every layer in `table` (_allocation_table)."""
    codes = np.unique(table["layer"].to_numpy()).tolist()
    if at == AT_END:
        return {code: int(span.end_ns) for code in codes}
    if at == AT_PEAK:
        return {code: _peak_ns(table[table["layer"].to_numpy() == code]) for code in codes}
    if isinstance(at, str):
        raise ValueError(f"at must be {AT_END!r}, {AT_PEAK!r} or ns after the start, not {at!r}")
    ts_ns = time_at(at, span)
    return {code: ts_ns for code in codes}


def time_at(offset_ns: int, span: Span) -> int:
    """The CLOCK_MONOTONIC ns `offset_ns` after the recording's start; UsageError (with the
    recording's duration in its hint) when that is outside the recording."""
    duration = span.recording_end_ns - span.start_ns
    if not 0 <= offset_ns <= duration:
        raise UsageError(f"the time +{_seconds(offset_ns)} is outside the recording, which lasted {_seconds(duration)}",
                         f"give --at a time from 0s to {_seconds(duration)} after the recording's start "
                         f"(e.g. {_seconds(duration // 2)}), or end, or peak")
    return int(span.start_ns + offset_ns)


def _seconds(ns: int) -> str:
    return f"{ns / 1e9:.3f}".rstrip("0").rstrip(".") + "s"


def _peak_ns(layer_table: pd.DataFrame) -> int:
    """When the layer's live bytes first reached their highest value."""
    times, live = live_curve(layer_table["alloc_ts"].to_numpy(), layer_table["end_ts"].to_numpy(),
                             layer_table["bytes"].to_numpy())
    return int(times[int(np.argmax(live))])


# --- the allocations -------------------------------------------------------------------------

def _allocation_table(allocations: pd.DataFrame, events: pd.DataFrame | None,
                      layers: Iterable[str] | None) -> tuple[pd.DataFrame, np.ndarray]:
    """(table, layer names): one row per allocation of the wanted layers, with plain numpy
    columns layer (code into the names), alloc_ts, end_ts (int64 max: never ended), bytes
    (weighted), count (= weight), stack (-1: none) and, given `events`, category (a label)."""
    codes, names = category_codes(allocations["layer"])
    weight = allocations["weight"].to_numpy(dtype=float)
    size = allocations["size_bytes"].to_numpy(dtype=np.int64, na_value=0)
    table = pd.DataFrame({
        "layer": codes, "alloc_ts": allocations["alloc_ts_ns"].to_numpy(dtype=np.int64),
        "end_ts": end_times(allocations),
        "bytes": np.rint(size * weight).astype(np.int64),  # estimated bytes it stands for
        "count": weight, "stack": allocations["stack_id"].to_numpy(dtype=np.int64, na_value=_NO_STACK),
    })
    if events is not None:
        table["category"] = alloc_categories(allocations, events)
    keep = codes >= 0
    if layers is not None:
        wanted = {label_of(layer) for layer in layers}
        keep &= np.isin(codes, [i for i, name in enumerate(names) if label_of(name) in wanted])
    return table[keep], names


def alloc_categories(allocations: pd.DataFrame, events: pd.DataFrame) -> pd.Categorical:
    """Each allocation's tensor category (NO_CATEGORY where null), as a categorical.

    Lifetimes do not carry the column: their rows are the alloc events of `events` in
    timeline order (lifetimes.pair_lifetimes), so the alloc rows' categories line up."""
    if "category" in allocations:
        codes, names = category_codes(allocations["category"])
    else:
        codes, names = category_codes(events["category"])
        codes = codes[(events["action"] == Action.ALLOC.value).to_numpy()]
        if len(codes) != len(allocations):
            raise ValueError("`events` are not the events these lifetimes were paired from")
    names = [label_of(name) for name in names]
    if NO_CATEGORY not in names:
        names.append(NO_CATEGORY)
    return pd.Categorical.from_codes(np.where(codes < 0, names.index(NO_CATEGORY), codes), categories=names)


def _live_at(table: pd.DataFrame, times: dict[int, int]) -> pd.DataFrame:
    """The rows live at their layer's time: alloc_ts <= t < end_ts."""
    if table.empty:
        return table
    codes = table["layer"].to_numpy()
    lookup = np.zeros(codes.max() + 1, dtype=np.int64)
    lookup[list(times)] = list(times.values())
    t = lookup[codes]
    return table[live_mask(table["alloc_ts"].to_numpy(), table["end_ts"].to_numpy(), t)]


def _layer_order(times: dict[int, int], names: np.ndarray) -> list[int]:
    """Codes of the layers present, in schema order, then unknown names sorted."""
    rank = {layer: i for i, layer in enumerate(LAYERS)}
    return sorted(times, key=lambda c: (rank.get(label_of(names[c]), len(rank)), label_of(names[c])))


# --- groupings: one frame per grouping, sorted biggest first within each layer ----------------

def _sums(live: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    return live.groupby(keys, sort=False).agg(live_bytes=("bytes", "sum"), live_count=("count", "sum")).reset_index()


def _by_chain(live: pd.DataFrame) -> pd.DataFrame:
    """layer, stack, live_bytes, live_count; by bytes, count (descending), no stack last, stack_id."""
    sums = _sums(live, ["layer", "stack"])
    return sums.assign(_none=sums["stack"] == _NO_STACK).sort_values(
        ["live_bytes", "live_count", "_none", "stack"], ascending=[False, False, True, True], kind="stable")


def _by_category(live: pd.DataFrame) -> pd.DataFrame:
    """layer, category, live_bytes, live_count; by bytes, count (descending), category."""
    sums = live.groupby(["layer", "category"], sort=False, observed=True).agg(
        live_bytes=("bytes", "sum"), live_count=("count", "sum")).reset_index()
    sums["category"] = sums["category"].astype(str)
    return sums.sort_values(["live_bytes", "live_count", "category"], ascending=[False, False, True], kind="stable")


def _by_layer(live: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame({"layer": pd.Series([], dtype=np.int64)})


def _by_function(live: pd.DataFrame, stacks: pd.DataFrame, frames: pd.DataFrame, native_frames: str) -> pd.DataFrame:
    """layer, fn, identity columns, self/total bytes and counts; by total bytes, self bytes
    (descending), allocations without frames last, then identity. Sums per stack first, then
    joined with the functions each stack holds: nothing is expanded per allocation."""
    chains = _sums(live, ["layer", "stack"])
    links, functions = stack_functions(stacks, frames, chains.loc[chains["stack"] != _NO_STACK, "stack"], native_frames)
    joined = chains.merge(links, on="stack", how="left")
    joined["fn"] = joined["fn"].fillna(NO_FUNCTION).astype(np.int64)  # no stack, or a stack without frames
    is_self = joined["self"].fillna(True).astype(bool).to_numpy()
    joined["self_bytes"] = np.where(is_self, joined["live_bytes"], 0)
    joined["self_count"] = np.where(is_self, joined["live_count"], 0.0)
    sums = joined.groupby(["layer", "fn"], sort=False).agg(
        total_bytes=("live_bytes", "sum"), total_count=("live_count", "sum"),
        self_bytes=("self_bytes", "sum"), self_count=("self_count", "sum")).reset_index()
    sums = sums.merge(functions, on="fn", how="left")
    return sums.assign(_none=sums["fn"] == NO_FUNCTION).sort_values(
        ["total_bytes", "self_bytes", "_none", "fn"], ascending=[False, False, True, True], kind="stable")


def _by_module(live: pd.DataFrame) -> pd.DataFrame:
    """layer, module (text, None: no module), live_bytes, live_count; by bytes, count
    (descending), then path, no module last."""
    sums = live.groupby(["layer", "module"], sort=False, observed=True, dropna=False).agg(
        live_bytes=("bytes", "sum"), live_count=("count", "sum")).reset_index()
    sums["module"] = sums["module"].astype(object).where(sums["module"].notna(), None)
    return sums.assign(_none=sums["module"].isna(), _path=sums["module"].fillna("")).sort_values(
        ["live_bytes", "live_count", "_none", "_path"], ascending=[False, False, True, True], kind="stable")


def _by_rank(live: pd.DataFrame) -> pd.DataFrame:
    """layer, rank, live_bytes, live_count; by bytes, count (descending), rank."""
    sums = live.groupby(["layer", "rank"], sort=False).agg(
        live_bytes=("bytes", "sum"), live_count=("count", "sum")).reset_index()
    return sums.sort_values(["live_bytes", "live_count", "rank"], ascending=[False, False, True], kind="stable")


_GROUPERS = {"chain": _by_chain, "category": _by_category, "layer": _by_layer, "module": _by_module,
             "rank": _by_rank}


def stack_functions(stacks: pd.DataFrame, frames: pd.DataFrame, stack_ids: Iterable,
                    native_frames: str = DEFAULT_NATIVE_FRAMES) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(links, functions) of the given stacks.

    `links`: one row per (stack, fn) — each function a chain holds, once however often it
    recurs — with `self` True where it is the chain's innermost frame. `functions`: fn (a
    code, in order of kind, function, place) -> kind, function, module (kernel/native) or
    file (Python). Frames of Python functions differ by line; one function is all its lines."""
    check_native_frames(native_frames)
    rows = stacks.loc[stacks["stack_id"].isin(pd.unique(np.asarray(stack_ids, dtype=np.int64))),
                      ["stack_id", "depth", "frame_id"]]
    rows = rows.merge(frames[["frame_id", "kind", "function", "module", "file"]], on="frame_id", how="left")
    if native_frames == NativeFrames.MERGED:
        rows = rows[~_eval_loop_frames(rows)]
    python = (rows["kind"] == FrameKind.PYTHON.value).to_numpy()
    module = rows["module"].astype(object).where(~python, None)
    file = rows["file"].astype(object).where(python, None)
    ident = pd.DataFrame({"kind": rows["kind"].astype(object), "function": rows["function"].astype(object),
                          "module": module, "file": file})
    fn = ident.groupby(list(ident.columns), dropna=False, sort=True).ngroup().to_numpy(dtype=np.int64)
    innermost = rows["depth"].to_numpy() == rows.groupby("stack_id")["depth"].transform("min").to_numpy()
    links = pd.DataFrame({"stack": rows["stack_id"].to_numpy(dtype=np.int64), "fn": fn, "self": innermost})
    links = links.groupby(["stack", "fn"], sort=False)["self"].any().reset_index()
    functions = ident.assign(fn=fn).drop_duplicates("fn")
    return links, functions.rename(columns={"function": "name"})


def _eval_loop_frames(rows: pd.DataFrame) -> pd.Series:
    """The interpreter's eval-loop frames of chains that also hold the Python frames they ran."""
    has_python = (rows["kind"] == FrameKind.PYTHON.value).groupby(rows["stack_id"]).transform("any")
    return has_python & (rows["kind"] == FrameKind.NATIVE.value) & rows["function"].isin(EVAL_LOOP_FUNCTIONS)


# --- rows --------------------------------------------------------------------------------------

def _layer_live(layer: str, ts_ns: int, live: pd.DataFrame, grouped: pd.DataFrame, code: int, by: str,
                top: int | None) -> LayerLive:
    mine = live[live["layer"].to_numpy() == code]
    rows = grouped[grouped["layer"].to_numpy() == code]
    shown = rows if top is None else rows.head(top)
    return LayerLive(layer=layer, ts_ns=int(ts_ns), live_bytes=int(mine["bytes"].sum()),
                     live_count=_count(mine["count"].sum()), rows=[_ROWS[by](row) for row in shown.itertuples()],
                     rows_left_out=len(rows) - len(shown))


def _chain_row(row) -> ChainBytes:
    return ChainBytes(stack_id=None if row.stack == _NO_STACK else int(row.stack), live_bytes=int(row.live_bytes),
                    live_count=_count(row.live_count))


def _category_row(row) -> CategoryRow:
    return CategoryRow(category=str(row.category), live_bytes=int(row.live_bytes), live_count=_count(row.live_count))


def _function_row(row) -> FunctionRow:
    return FunctionRow(kind=_text(row.kind), function=_text(row.name), module=_text(row.module), file=_text(row.file),
                       self_bytes=int(row.self_bytes), self_count=_count(row.self_count),
                       total_bytes=int(row.total_bytes), total_count=_count(row.total_count))


def _module_row(row) -> ModuleRow:
    return ModuleRow(module=_text(row.module), live_bytes=int(row.live_bytes), live_count=_count(row.live_count))


def _rank_row(row) -> RankRow:
    return RankRow(rank=str(row.rank), live_bytes=int(row.live_bytes), live_count=_count(row.live_count))


_ROWS = {"chain": _chain_row, "category": _category_row, "function": _function_row, "module": _module_row,
         "rank": _rank_row}


def _count(weights: float) -> int:
    """Allocations a sum of weights stands for."""
    return int(round(float(weights)))


def _text(value) -> str | None:
    return None if value is None or (not isinstance(value, str) and pd.isna(value)) else str(value)
