"""Regions and the memory surface: what each configuration of a sweep cost.

A region begins at a mark of the user's that carries numbers (`memprof.mark("config",
seq_len=512, batch=8)`) and lasts until the next such mark; the last one lasts until the
target's end (when its root process began to exit, else the end of the recording). Marks
without numbers, step marks and the agent's own notes do not cut regions, and the quantities
each outermost forward writes (batch, seq_len, tokens) are not marks: they make none.

For each region and each (layer, device): the peak of the live bytes within [start, end) —
the whole process's live bytes of that layer on that device, as `layers.live_curve` computes
them: the value in effect at the start, then just after all events at each time before the
end — the earliest time it was reached, and the `top` chains holding the most at that time.

With two quantities whose values vary over the regions (seq_len and batch), the surface: per
(layer, device), a grid of region peaks with the first-named quantity's distinct values as
rows and the second's as columns (ascending); a cell no region ran is None, and a cell two
regions ran holds the higher peak (the result's notes say so).

Pure functions over the timeline, lifetimes and the `samples` table; no I/O. Times are
CLOCK_MONOTONIC ns of the recording host, sizes bytes; bytes are never added across layers
or devices.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

import numpy as np
import pandas as pd

from memprof.analysis.chains import with_canonical_stacks
from memprof.analysis.layers import ChainBytes, LiveColumns, chains_at, live_curve
from memprof.analysis.lifetimes import Lifetimes, category_codes, label_of
from memprof.analysis.series import instants
from memprof.model.schema import LAYERS, QUANTITY_DEVICE, QUANTITY_PREFIX

# How long before its mark row a mark's numbers may be stamped: the agent stamps a mark and
# its numbers with one clock read, so 0; a forward's sizes (the other quantities) never
# share a mark's time. (Agents before that change read the clock twice, tens of µs apart:
# their recordings pair with match_ns=1_000_000.)
MATCH_NS = 0
DEFAULT_TOP = 3
HOW_TO = 'call memprof.mark("config", seq_len=512, batch=8) before each configuration'


@dataclass(frozen=True)
class RegionPeak:
    """One (layer, device)'s highest live bytes within a region, first reached at `peak_ns`
    (the region's start when what was live as it began was the most), and the chains holding
    the most then (by live bytes, then count)."""

    layer: str
    device: str
    peak_bytes: int
    peak_ns: int
    top_chains: list[ChainBytes]


@dataclass(frozen=True)
class Region:
    """[start_ns, end_ns) from one mark with numbers to the next (or the target's end):
    the mark's `label`, its process `pid`, its `quantities` (name -> value, in the order the
    mark named them) and each (layer, device)'s peak in it (layers in schema order, then
    devices by name)."""

    index: int
    label: str
    pid: int
    start_ns: int
    end_ns: int
    quantities: dict[str, float]
    peaks: list[RegionPeak]


@dataclass(frozen=True)
class SurfaceGrid:
    """One (layer, device)'s peaks: `bytes[i][j]` is the peak of the region whose row quantity
    is `row_values[i]` and column quantity `column_values[j]` (None: no region ran it)."""

    layer: str
    device: str
    bytes: list[list[int | None]]


@dataclass(frozen=True)
class Surface:
    """Peaks by two quantities: `rows` (the first-named, e.g. seq_len) × `columns` (batch),
    each's distinct values ascending; one grid per (layer, device)."""

    rows: str
    columns: str
    row_values: list[float]
    column_values: list[float]
    grids: list[SurfaceGrid]


@dataclass
class RegionsResult:
    """The regions in time order, the quantities they carry (first-named first), the surface
    (None: fewer than two quantities vary, `notes` say why), and `empty`: why there are no
    regions (None when there are)."""

    regions: list[Region]
    quantities: list[str]
    surface: Surface | None
    notes: list[str] = field(default_factory=list)
    empty: str | None = None


def regions(lifetimes: Lifetimes, events: pd.DataFrame, samples: pd.DataFrame | None, *, end_ns: int,
            layers: Iterable[str] | None = None, top: int = DEFAULT_TOP,
            canonical_stack: Mapping[int, int] | None = None) -> RegionsResult:
    """The regions of a recording whose target ended at `end_ns` (module docstring), each
    with the peak of every (layer, device) (only `layers` when given) and its `top` chains;
    and the surface when two quantities vary. `canonical_stack` merges identical chains."""
    marks = marks_with_numbers(events, samples)
    if marks.empty:
        return RegionsResult([], [], None, empty=_why_none(events))
    starts = marks["ts_ns"].to_numpy(dtype=np.int64)
    ends = np.append(starts[1:], max(int(end_ns), int(starts[-1])))
    curves = _curves(with_canonical_stacks(lifetimes.allocations, canonical_stack), layers)
    found = [Region(index=i + 1, label=str(row.label), pid=int(row.pid), start_ns=int(starts[i]), end_ns=int(ends[i]),
                    quantities=dict(row.quantities),
                    peaks=[_peak(curve, int(starts[i]), int(ends[i]), top) for curve in curves])
             for i, row in enumerate(marks.itertuples(index=False))]
    names = _quantity_order(found)
    surface, notes = memory_surface(found, names)
    return RegionsResult(found, names, surface, notes)


def marks_with_numbers(events: pd.DataFrame, samples: pd.DataFrame | None, match_ns: int = MATCH_NS) -> pd.DataFrame:
    """The user's marks that carry numbers: ts_ns, label, pid and quantities (name -> value,
    in the order the mark named them), in time order. A mark's numbers are the quantity
    samples (metric quantity:NAME, device "") of the latest sample time at or before it, no
    more than `match_ns` before it, that no earlier mark took. (Samples carry no pid: the
    agent stamps a mark's numbers just before the mark, so time alone pairs them.)"""
    columns = ["ts_ns", "label", "pid", "quantities"]
    rows = instants(events)
    rows = rows[rows["kind"] == "mark"]
    groups = _quantity_groups(samples)
    if rows.empty or not groups:
        return pd.DataFrame({name: [] for name in columns})
    times = np.fromiter(groups, dtype=np.int64, count=len(groups))  # ascending: built in time order
    kept, taken = [], set()
    for row in rows.itertuples(index=False):
        at = int(np.searchsorted(times, row.ts_ns, side="right")) - 1
        if at < 0 or row.ts_ns - times[at] > match_ns or at in taken:
            continue
        taken.add(at)
        kept.append((int(row.ts_ns), str(row.label), int(row.pid), groups[int(times[at])]))
    return pd.DataFrame(kept, columns=columns)


def _quantity_groups(samples: pd.DataFrame | None) -> dict[int, dict[str, float]]:
    """ts_ns -> {name: value} of the quantity samples written at that time, ascending by time,
    names in the order the samples were written (the order memprof.mark was given them)."""
    if samples is None or samples.empty:
        return {}
    metric = samples["metric"].astype(str)
    device = samples["device"].astype(object).where(samples["device"].notna(), QUANTITY_DEVICE)
    wanted = metric.str.startswith(QUANTITY_PREFIX).to_numpy() & (device == QUANTITY_DEVICE).to_numpy()
    frame = pd.DataFrame({"ts_ns": samples["ts_ns"].to_numpy(dtype=np.int64)[wanted],
                          "name": metric[wanted].str.slice(len(QUANTITY_PREFIX)).to_numpy(),
                          "value": samples["value"].to_numpy(dtype=float)[wanted]})
    frame = frame[np.isfinite(frame["value"].to_numpy())].sort_values("ts_ns", kind="stable")  # keeps written order
    groups: dict[int, dict[str, float]] = {}
    for ts, name, value in zip(frame["ts_ns"].tolist(), frame["name"].tolist(), frame["value"].tolist()):
        groups.setdefault(ts, {})[name] = value
    return groups


def _why_none(events: pd.DataFrame) -> str:
    """Why a recording has no regions, and how to make them."""
    marks = int((instants(events)["kind"] == "mark").sum())
    if marks == 0:
        return f"no regions: the recording has no marks of yours (memprof.mark); {HOW_TO}"
    if marks == 1:
        return f"no regions: your one mark (memprof.mark) carries no numbers; {HOW_TO}"
    return f"no regions: none of your {marks} marks (memprof.mark) carries numbers; {HOW_TO}"


# ---- peaks -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Curve:
    """One (layer, device)'s allocations and live curve (times ascending, live just after)."""

    layer: str
    device: str
    cols: LiveColumns
    times: np.ndarray
    live: np.ndarray


def _curves(allocations: pd.DataFrame, wanted: Iterable[str] | None) -> list[_Curve]:
    """Each (layer, device) with allocations, layers in schema order (unknown names after,
    sorted), then devices by name; only `wanted` layers when given."""
    if allocations.empty:
        return []
    layer_codes, layer_names = category_codes(allocations["layer"])
    device_codes, device_names = category_codes(allocations["device"])
    keep = set(wanted) if wanted else None
    cols = LiveColumns.of(allocations)
    rank = {layer: i for i, layer in enumerate(LAYERS)}
    pairs = []
    for layer_code, device_code in np.unique(np.stack([layer_codes, device_codes], axis=1), axis=0).tolist():
        layer = label_of(layer_names[layer_code]) if layer_code >= 0 else None
        if layer is None or (keep is not None and layer not in keep):
            continue
        device = label_of(device_names[device_code]) if device_code >= 0 else ""
        pairs.append((rank.get(layer, len(rank)), layer, device, (layer_codes == layer_code) & (device_codes == device_code)))
    curves = []
    for _, layer, device, mask in sorted(pairs, key=lambda p: p[:3]):
        sub = cols.subset(mask)
        times, live = live_curve(sub.alloc_ts, sub.end_ts, sub.size)
        curves.append(_Curve(layer, device, sub, times, live))
    return curves


def _peak(curve: _Curve, start_ns: int, end_ns: int, top: int) -> RegionPeak:
    """The curve's highest value within [start_ns, end_ns): what was live at the start, or
    just after the events of a time inside; the earliest such time (the start for the former)."""
    first = int(np.searchsorted(curve.times, start_ns, side="right"))  # points after the start
    stop = int(np.searchsorted(curve.times, end_ns, side="left"))  # points before the end
    at_start = int(curve.live[first - 1]) if first > 0 else 0
    peak_bytes, peak_ns = at_start, start_ns
    if stop > first:
        inside = curve.live[first:stop]
        best = int(np.argmax(inside))  # the first maximum: the earliest time
        if int(inside[best]) > at_start:
            peak_bytes, peak_ns = int(inside[best]), int(curve.times[first + best])
    return RegionPeak(curve.layer, curve.device, peak_bytes, peak_ns, chains_at(curve.cols, peak_ns, top))


# ---- the surface -------------------------------------------------------------------------------

def _quantity_order(found: list[Region]) -> list[str]:
    """Every quantity of the regions, in the order they were first named."""
    names: dict[str, None] = {}
    for region in found:
        names.update(dict.fromkeys(region.quantities))
    return list(names)


def memory_surface(found: list[Region], names: list[str]) -> tuple[Surface | None, list[str]]:
    """The surface of the first two quantities (in `names`' order) whose values vary over the
    regions that carry both, and notes on what was left out or why there is none."""
    varying = [name for name in names if len({r.quantities[name] for r in found if name in r.quantities}) > 1]
    if len(varying) < 2:
        what = "no quantity varies" if not varying else f"only {varying[0]} varies"
        return None, [f"no memory surface: {what} over the regions (it needs two, e.g. seq_len and batch)"]
    rows, columns = varying[:2]
    notes = [] if len(varying) == 2 else [f"memory surface of {rows} × {columns}: {', '.join(varying[2:])} also vary "
                                          "and are not on it (a cell is the highest peak of the regions it holds)"]
    runs = [r for r in found if rows in r.quantities and columns in r.quantities]
    row_values = sorted({r.quantities[rows] for r in runs})
    column_values = sorted({r.quantities[columns] for r in runs})
    cells = [(row_values.index(r.quantities[rows]), column_values.index(r.quantities[columns]), r) for r in runs]
    if len({(i, j) for i, j, _ in cells}) < len(cells):
        notes.append(f"some ({rows}, {columns}) pairs ran in more than one region: their cell is the highest peak")
    if len(runs) < len(found):
        notes.append(f"{len(found) - len(runs)} region(s) without both {rows} and {columns} are not on the surface")
    keys = [(p.layer, p.device) for p in found[0].peaks]  # every region has every curve, in one order
    grids = []
    for k, (layer, device) in enumerate(keys):
        grid: list[list[int | None]] = [[None] * len(column_values) for _ in row_values]
        for i, j, region in cells:
            value = region.peaks[k].peak_bytes
            grid[i][j] = value if grid[i][j] is None else max(grid[i][j], value)
        grids.append(SurfaceGrid(layer, device, grid))
    return Surface(rows, columns, row_values, column_values, grids), notes
