"""`report modules`: per nn.Module instance path and layer, what its forwards allocated and
what of it was held at the layer's peak and at the end (issue 21, item 5).

A module's allocations are those the timeline gave its path (`module`: the innermost module
running on the allocating thread; analysis/modules.py), so a parent's numbers leave out its
children's. Calls are its forwards seen (its `module:PATH` boundary rows, every thread and
process). Pure functions; times CLOCK_MONOTONIC ns, sizes bytes (sampled allocations count
by their weight, as everywhere).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from memprof.analysis.attribution import AT_END, AT_PEAK, Span, attribute
from memprof.analysis.layers import weighted_bytes
from memprof.analysis.lifetimes import Lifetimes, category_codes, label_of
from memprof.analysis.modules import alloc_modules
from memprof.model.schema import MODULE_PREFIX, Action


@dataclass(frozen=True)
class ModuleUse:
    """One module path in one layer (`module` None: allocations made in no module's
    forward; `calls` is then None). `allocated_*`: every allocation made in it over the
    recording; `peak_bytes`: of those, live at the layer's peak; `end_bytes`: live at the end."""

    module: str | None
    calls: int | None
    allocated_bytes: int
    allocated_count: int
    peak_bytes: int
    end_bytes: int

    @property
    def bytes_per_call(self) -> float | None:
        """Bytes allocated per forward, None without calls."""
        return self.allocated_bytes / self.calls if self.calls else None


@dataclass(frozen=True)
class LayerModules:
    """A layer's modules, most bytes at the peak first (then allocated, then path), at most
    `top`; `left_out` more exist. `peak_ns`/`end_ns`: the moments the layer is judged at."""

    layer: str
    peak_ns: int
    end_ns: int
    peak_bytes: int
    modules: list[ModuleUse]
    left_out: int


@dataclass(frozen=True)
class ModulesResult:
    """Per layer (schema order). `tracked`: the recording has module boundaries (recorded
    with --torch-modules); without them every allocation is in no module."""

    layers: list[LayerModules]
    tracked: bool


def module_use(lifetimes: Lifetimes, events: pd.DataFrame, span: Span, *, layers=None,
               top: int | None = 10) -> ModulesResult:
    """Each layer's modules (module docstring); `layers` keeps only those, `top` None keeps
    every module. `events` is the timeline the lifetimes were paired from."""
    peak = attribute(lifetimes, by="module", at=AT_PEAK, span=span, events=events, layers=layers, top=None)
    end = {layer.layer: layer for layer in
           attribute(lifetimes, by="module", at=AT_END, span=span, events=events, layers=layers, top=None).layers}
    allocated = _allocated(lifetimes.allocations, events, lifetimes.folded_modules)
    calls = module_calls(events)
    result = []
    for layer in peak.layers:
        at_peak = {row.module: row.live_bytes for row in layer.rows}
        at_end = {row.module: row.live_bytes for row in end[layer.layer].rows}
        mine = allocated.get(layer.layer, {})
        rows = [ModuleUse(module=path, calls=None if path is None else calls.get(path, 0),
                          allocated_bytes=mine.get(path, (0, 0))[0], allocated_count=mine.get(path, (0, 0))[1],
                          peak_bytes=at_peak.get(path, 0), end_bytes=at_end.get(path, 0))
                for path in set(mine) | set(at_peak) | set(at_end)]
        rows.sort(key=lambda r: (-r.peak_bytes, -r.allocated_bytes, r.module is None, r.module or ""))
        shown = rows if top is None else rows[:top]
        result.append(LayerModules(layer=layer.layer, peak_ns=layer.ts_ns, end_ns=end[layer.layer].ts_ns,
                                   peak_bytes=layer.live_bytes, modules=shown, left_out=len(rows) - len(shown)))
    return ModulesResult(layers=result, tracked=bool(calls))


def module_calls(events: pd.DataFrame) -> dict[str, int]:
    """{module path: forwards of it} from the `module:PATH` boundary rows (counted on the
    categories, not per row)."""
    marks = events["category"][(events["action"] == Action.MARK.value).to_numpy()]
    codes, names = category_codes(marks)
    counts = np.bincount(codes[codes >= 0], minlength=len(names))
    return {label_of(name)[len(MODULE_PREFIX):]: int(n) for name, n in zip(names, counts)
            if n and label_of(name).startswith(MODULE_PREFIX)}


def _allocated(allocations: pd.DataFrame, events: pd.DataFrame, folded: pd.DataFrame | None = None) -> dict[str, dict]:
    """{layer: {module path or None: (bytes, count)}} of every allocation (weighted), those a
    fold dropped (`folded`: Lifetimes.folded_modules, a few rows per chain) with them."""
    layer_codes, layer_names = category_codes(allocations["layer"])
    weight = allocations["weight"].to_numpy(dtype=float)
    table = pd.DataFrame({
        "layer": layer_codes, "module": alloc_modules(allocations, events),
        "bytes": weighted_bytes(allocations["size_bytes"].to_numpy(dtype=float, na_value=0.0), weight),
        "count": weight})
    sums = table[layer_codes >= 0].groupby(["layer", "module"], sort=False, observed=True, dropna=False).agg(
        bytes=("bytes", "sum"), count=("count", "sum")).reset_index()
    totals: dict[tuple, list] = {}
    for code, module, n_bytes, count in sums.itertuples(index=False):  # one row per (layer, module): a few hundred
        totals[label_of(layer_names[code]), _path(module)] = [int(n_bytes), float(count)]
    if folded is not None:
        for layer, module, n_bytes, count in zip(folded["layer"], folded["module"], folded["bytes"], folded["n"]):
            total = totals.setdefault((label_of(layer), _path(module)), [0, 0.0])
            total[0] += int(n_bytes)
            total[1] += float(count)
    out: dict[str, dict] = {}
    for (layer, path), (n_bytes, count) in totals.items():
        out.setdefault(layer, {})[path] = (n_bytes, int(round(count)))
    return out


def _path(module) -> str | None:
    """A module path, None for no module (a missing value)."""
    return module if isinstance(module, str) else None
