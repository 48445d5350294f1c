"""Time series for exports to timeline viewers (Perfetto, chrome://tracing) and per-chain
totals for profile viewers (pprof).

Pure functions over the lifetimes, the timeline and the `samples` table; no I/O. Times are
CLOCK_MONOTONIC ns, sizes bytes.

A counter series is one curve: the live bytes of one (layer, device) — bytes are never added
across layers, nor across devices here, since a viewer shows one track per device — or one
sampled metric of one device. Curves are cut to at most `max_points` points by keeping the
highest point of each bucket of consecutive points, so every peak survives (a valley
narrower than a bucket may not), and the curve's last point is always kept, so the final
value is exact. Sampled allocations count by their weight, as on `layers.live_curve`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from memprof.analysis.chains import with_canonical_stacks
from memprof.analysis.layers import live_curve, weighted_bytes
from memprof.analysis.lifetimes import Lifetimes, category_codes, end_times, label_of, labels, live_mask
from memprof.model.schema import LAYERS, MARK_LABELS, MODULE_NONE, MODULE_PREFIX, MODULE_RETURN_PREFIX, STATE_PREFIX, TENSOR_PREFIX, Action, Mark

DEFAULT_MAX_POINTS = 20_000
_NO_STACK = -1
INSTANT_COLUMNS = ["ts_ns", "kind", "pid", "tid", "layer", "device", "size_bytes", "step", "label"]


@dataclass(frozen=True)
class CounterSeries:
    """One counter track. `kind` "layer": `name` is the layer and `values` its live bytes
    (int64) just after all events at each time; `kind` "sample": `name` is the metric (its
    unit in its name) and `values` the sampled values (float64). `device` is "" where the
    series has none. `unit` is "bytes" for layers and metrics named *_bytes, else "".
    `times_ns` ascend strictly. `points_in` is how many points the curve had before it was
    cut to `max_points`."""

    kind: str
    name: str
    device: str
    unit: str
    times_ns: np.ndarray
    values: np.ndarray
    points_in: int = 0


@dataclass(frozen=True)
class ExportTimeline:
    """Everything a timeline viewer shows: counter tracks (layers in schema order, then
    metrics by name; devices sorted), instants (INSTANT_COLUMNS: OOMs, step marks and the
    user's marks, in time order) and the span of the recording, CLOCK_MONOTONIC ns."""

    counters: list[CounterSeries]
    instants: pd.DataFrame
    start_ns: int
    end_ns: int


def export_timeline(lifetimes: Lifetimes, events: pd.DataFrame, samples: pd.DataFrame | None, *,
                    start_ns: int, end_ns: int, max_points: int = DEFAULT_MAX_POINTS,
                    at_ns: Sequence[int] | None = None, extremes: Mapping | None = None) -> ExportTimeline:
    """The counters (`layer_series` + `sample_series`) and instants (`instants`) of a
    recording spanning [start_ns, end_ns], each curve cut to at most `max_points` points;
    the layers' curves only at `at_ns` and through `extremes` where given (a fold's kept moments
    and the highest and lowest point between two of them: layer_series)."""
    counters = layer_series(lifetimes, max_points, at_ns, extremes) + sample_series(samples, max_points)
    return ExportTimeline(counters=counters, instants=instants(events), start_ns=int(start_ns), end_ns=int(end_ns))


def downsample_max(times: np.ndarray, values: np.ndarray, max_points: int = DEFAULT_MAX_POINTS):
    """(times, values) with at most `max_points` points (≥ 2): the last point, and of the
    others, cut into max_points − 1 buckets of consecutive points (sizes differ by at most
    one), the highest of each (the earliest where tied). Unchanged when short enough."""
    if max_points < 2:
        raise ValueError(f"max_points must be at least 2, not {max_points}")
    n = len(times)
    if n <= max_points:
        return times, values
    buckets, body = max_points - 1, n - 1  # body > buckets: no bucket is empty
    edges = np.arange(buckets + 1, dtype=np.int64) * body // buckets
    bucket_of = np.repeat(np.arange(buckets), np.diff(edges))
    highest = np.maximum.reduceat(values[:body], edges[:-1])
    at_max = np.flatnonzero(values[:body] == highest[bucket_of])
    first = at_max[np.unique(bucket_of[at_max], return_index=True)[1]]
    keep = np.append(first, n - 1)
    return times[keep], values[keep]


def layer_series(lifetimes: Lifetimes, max_points: int = DEFAULT_MAX_POINTS,
                 at_ns: Sequence[int] | None = None, extremes: Mapping | None = None) -> list[CounterSeries]:
    """Live bytes of each (layer, device) over time: layers in schema order (unknown names
    after, sorted), devices sorted. Allocations without a size count 0 bytes. `at_ns`
    (ascending ns): the curves only at those times (a fold's kept moments, Fold.instants_ns,
    where its kept allocations give the whole recording's live bytes), not at every event;
    `extremes`: (layer, device) -> (ns, bytes), more points of those curves, exact, that the
    kept allocations cannot give (Fold.curve_extremes: each stretch's highest and lowest point)."""
    allocations = lifetimes.allocations
    if allocations.empty:
        return []
    layer_codes, layer_names = category_codes(allocations["layer"])
    device_codes, device_names = category_codes(allocations["device"])
    alloc_ts = allocations["alloc_ts_ns"].to_numpy(dtype=np.int64)
    end_ts = end_times(allocations)
    size = _weighted_bytes(allocations)
    series = []
    for layer, device in _layer_device_order(layer_codes, layer_names, device_codes, device_names):
        mask = (layer_codes == layer) & (device_codes == device)
        name, device_name = label_of(layer_names[layer]), _device_label(device, device_names)
        times, live = live_curve(alloc_ts[mask], end_ts[mask], size[mask])
        if at_ns is not None:
            times, live = _at(times, live, at_ns)
            times, live = _with_points(times, live, (extremes or {}).get((name, device_name)))
            if len(times) == 0:  # only allocations kept for a missed free, after every kept moment
                continue
        kept_times, kept_live = downsample_max(times, live, max_points)
        series.append(CounterSeries(kind="layer", name=name, device=device_name, unit="bytes",
                                    times_ns=kept_times, values=kept_live, points_in=len(times)))
    return series


def _with_points(times: np.ndarray, live: np.ndarray, points) -> tuple[np.ndarray, np.ndarray]:
    """The curve (times, live) with `points` ((ns, bytes) or None) among its points, in time
    order; at a time in both, one point (both are the whole curve's value there)."""
    if points is None or len(points[0]) == 0:
        return times, live
    all_times = np.concatenate([times, np.asarray(points[0], dtype=np.int64)])
    all_live = np.concatenate([live, np.asarray(points[1], dtype=live.dtype)])
    all_times, first = np.unique(all_times, return_index=True)
    return all_times, all_live[first]


def _at(times: np.ndarray, live: np.ndarray, at_ns: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """The step curve (times, live: layers.live_curve) read at each of `at_ns` from its first
    event on (before it the layer held nothing, and a curve starts at its first event)."""
    at_ns = np.asarray(at_ns, dtype=np.int64)
    at_ns = at_ns[at_ns >= times[0]]
    return at_ns, live[np.searchsorted(times, at_ns, side="right") - 1]


def _weighted_bytes(allocations: pd.DataFrame) -> np.ndarray:
    """Bytes each allocation stands for: rint(size_bytes × weight), 0 where no size."""
    size = allocations["size_bytes"].to_numpy(dtype=np.int64, na_value=0)
    return weighted_bytes(size, allocations["weight"].to_numpy(dtype=float))


def _device_label(code: int, names: np.ndarray) -> str:
    return "" if code < 0 else label_of(names[code])


def _layer_device_order(layer_codes, layer_names, device_codes, device_names) -> list[tuple[int, int]]:
    """(layer code, device code) pairs present, layers in schema order, devices by name."""
    pairs = np.unique(np.stack([layer_codes, device_codes], axis=1), axis=0)
    rank = {layer: i for i, layer in enumerate(LAYERS)}

    def key(pair):
        layer = label_of(layer_names[pair[0]])
        return rank.get(layer, len(rank)), layer, _device_label(pair[1], device_names)
    return sorted(((int(a), int(b)) for a, b in pairs if a >= 0), key=key)


def sample_series(samples: pd.DataFrame | None, max_points: int = DEFAULT_MAX_POINTS) -> list[CounterSeries]:
    """Each sampled (metric, device) series in time order (samples without a value are
    dropped; of samples at one time the last is kept), sorted by (metric, device)."""
    if samples is None or samples.empty:
        return []
    frame = samples[["ts_ns", "metric", "device", "value"]].dropna(subset=["value"])
    frame = frame.assign(metric=frame["metric"].astype(str),
                         device=frame["device"].astype(object).where(frame["device"].notna(), ""))
    frame = frame.sort_values(["metric", "device", "ts_ns"], kind="stable")
    frame = frame.drop_duplicates(["metric", "device", "ts_ns"], keep="last")
    series = []
    for (metric, device), rows in frame.groupby(["metric", "device"], sort=True):
        times, values = downsample_max(rows["ts_ns"].to_numpy(dtype=np.int64),
                                       rows["value"].to_numpy(dtype=float), max_points)
        series.append(CounterSeries(kind="sample", name=str(metric), device=str(device),
                                    unit="bytes" if str(metric).endswith("_bytes") else "",
                                    times_ns=times, values=values, points_in=len(rows)))
    return series


def instants(events: pd.DataFrame) -> pd.DataFrame:
    """The moments a timeline marks (INSTANT_COLUMNS, in time order): `kind` "oom" for every
    `oom` row (an allocation that failed: its layer, device and requested size), "step" for
    every `mark` row with category "step" (`step` is the new step's number) and "mark" for
    the user's own marks (`memprof.mark("epoch 1")`: `label` is its text, `step` the step it
    fell in). `label` is the mark row's category ("step" for steps), None for OOMs. The
    exit and exec marks and the agent's per-tensor notes (`tensor:ROLE`, `state:ROLE:NAME`) are not
    moments to show."""
    action = labels(events["action"]) if len(events) else np.array([], dtype=object)
    category = labels(events["category"]) if len(events) else np.array([], dtype=object)
    is_oom = action == Action.OOM.value
    is_step = (action == Action.MARK.value) & (category == Mark.STEP.value)
    shown = is_oom | is_step | user_mark_rows(action, category)
    rows = events[shown]
    size = rows["size_bytes"].fillna(rows["requested_bytes"]) if "requested_bytes" in rows else rows["size_bytes"]
    frame = pd.DataFrame({
        "ts_ns": rows["ts_ns"].to_numpy(dtype=np.int64),
        "kind": np.select([is_oom[shown], is_step[shown]], ["oom", "step"], "mark").astype(object),
        "pid": rows["pid"].to_numpy(dtype=np.int64, na_value=0), "tid": rows["tid"].to_numpy(dtype=np.int64, na_value=0),
        "layer": labels(rows["layer"]), "device": labels(rows["device"]),
        "size_bytes": pd.array(size, dtype="Int64"), "step": pd.array(rows["step"], dtype="Int64"),
        "label": np.where(is_oom[shown], None, category[shown]).astype(object),
    }, columns=INSTANT_COLUMNS)
    return frame.sort_values("ts_ns", kind="stable", ignore_index=True)


def user_mark_rows(action: np.ndarray, category: np.ndarray) -> np.ndarray:
    """Per row (its action and category labels): a mark of the user's own — a `mark` row
    whose category is neither a step, an exit or an exec, nor one of the agent's per-tensor notes
    (`tensor:ROLE`, `state:ROLE:NAME`) and module boundaries (`module:PATH`, `module-return:PATH`, MODULE_NONE).
    Judged on the mark rows' distinct labels (module boundaries are two rows per module call:
    many rows, few labels)."""
    marks = np.flatnonzero(action == Action.MARK.value)
    codes, texts = pd.factorize(pd.Series(category[marks], dtype=object), use_na_sentinel=True)
    judged = np.array([isinstance(text, str) and text not in MARK_LABELS and text != MODULE_NONE
                       and not text.startswith((TENSOR_PREFIX, STATE_PREFIX, MODULE_PREFIX, MODULE_RETURN_PREFIX)) for text in texts]
                      + [False], dtype=bool)
    rows = np.zeros(len(action), dtype=bool)
    rows[marks[judged[codes]]] = True  # code -1 (no label) picks the trailing False
    return rows


def user_marks(events: pd.DataFrame) -> pd.DataFrame:
    """The user's own marks (`instants` of kind "mark"): ts_ns and label, in time order."""
    rows = instants(events)
    return rows.loc[rows["kind"] == "mark", ["ts_ns", "label"]].reset_index(drop=True)


def marks_table(instant_rows: pd.DataFrame) -> pd.DataFrame:
    """The steps and the user's marks of `instants` as a table (ts_ns, kind "step" | "mark",
    label, step, pid, tid), in time order; OOMs are left out (they are events, not marks)."""
    marks = instant_rows[instant_rows["kind"] != "oom"]
    return marks[["ts_ns", "kind", "label", "step", "pid", "tid"]].reset_index(drop=True)


def chain_totals(lifetimes: Lifetimes, *, end_ns: int, canonical_stack=None) -> pd.DataFrame:
    """Per (layer, chain): what it held at `end_ns` (`inuse_bytes`, `inuse_count`: alloc_ts_ns
    ≤ end_ns < end_ts_ns, as `attribution` judges "end") and everything it allocated over
    the recording (`alloc_bytes`, `alloc_count`), weighted and rounded to int64. Columns
    layer (str), stack_id (Int64; NA: recorded without a stack), then those four; layers in
    schema order, then biggest alloc_bytes first, then stack_id. Chains with identical
    frames are one (`canonical_stack`, see chains.canonical_stacks). Of a folded recording,
    what the fold dropped (born and freed between the moments it kept) counts in what each
    chain allocated (Lifetimes.folded_modules)."""
    columns = ["layer", "stack_id", "inuse_bytes", "inuse_count", "alloc_bytes", "alloc_count"]
    allocations = with_canonical_stacks(lifetimes.allocations, canonical_stack)
    dropped = _dropped_totals(lifetimes.folded_modules, canonical_stack)
    if allocations.empty and dropped is None:
        return pd.DataFrame({name: pd.Series(dtype="Int64" if name == "stack_id" else "int64" if name != "layer"
                                             else object) for name in columns})
    weight = allocations["weight"].to_numpy(dtype=float)
    size = _weighted_bytes(allocations)
    alloc_ts = allocations["alloc_ts_ns"].to_numpy(dtype=np.int64)
    live = live_mask(alloc_ts, end_times(allocations), end_ns)
    frame = pd.DataFrame({
        "layer": labels(allocations["layer"]),
        "stack": allocations["stack_id"].to_numpy(dtype=np.int64, na_value=_NO_STACK),
        "inuse_bytes": np.where(live, size, 0), "inuse_count": np.where(live, weight, 0.0),
        "alloc_bytes": size, "alloc_count": weight,
    })
    if dropped is not None:
        frame = pd.concat([frame, dropped], ignore_index=True)
    sums = frame.groupby(["layer", "stack"], sort=False).sum().reset_index()
    return _ordered_totals(sums)[columns]


def _dropped_totals(folded: pd.DataFrame | None, canonical_stack) -> pd.DataFrame | None:
    """A fold's dropped allocations (Lifetimes.folded_modules) as chain_totals rows: none
    held at the end, their weighted count and bytes allocated; None when nothing was dropped."""
    if folded is None or folded.empty:
        return None
    stack = folded["stack_id"].to_numpy(dtype=np.int64)  # -1: recorded without a stack (FoldTotals)
    if canonical_stack:
        stack = np.array([canonical_stack.get(s, s) for s in stack.tolist()], dtype=np.int64)
    return pd.DataFrame({"layer": folded["layer"].astype(object).map(label_of).to_numpy(),
                         "stack": np.where(stack < 0, _NO_STACK, stack),
                         "inuse_bytes": 0, "inuse_count": 0.0,
                         "alloc_bytes": folded["bytes"].to_numpy(dtype=np.int64), "alloc_count": folded["n"].to_numpy(dtype=float)})


def _ordered_totals(sums: pd.DataFrame) -> pd.DataFrame:
    rank = {layer: i for i, layer in enumerate(LAYERS)}
    sums = sums.assign(rank=sums["layer"].map(lambda layer: rank.get(layer, len(rank))),
                       inuse_count=np.rint(sums["inuse_count"]).astype(np.int64),
                       alloc_count=np.rint(sums["alloc_count"]).astype(np.int64),
                       stack_id=pd.array(sums["stack"].where(sums["stack"] != _NO_STACK), dtype="Int64"))
    return sums.sort_values(["rank", "layer", "alloc_bytes", "stack"], ascending=[True, True, False, True],
                            kind="stable", ignore_index=True)
