"""Per-layer memory over time: peak, when it peaked, what was held at the end, and which
chains held the most at the peak; plus the peak and final value of every sampled metric.

Pure functions over lifetimes and the `samples` table; no I/O. Times are CLOCK_MONOTONIC ns,
sizes bytes. Bytes are never added across layers (DESIGN.md §3): each layer is summarized on
its own. Within a layer, every device's allocations count together (cuda_block on cuda:0 and
cuda:1 make one curve).

Live bytes of a layer at time t are the sizes of its allocations with
alloc_ts_ns ≤ t < end_ts_ns (end_ts_ns NA: still live). The curve changes only at events, and
all events at one time count together: an allocation freed at t and another made at t never
both count at t. Allocations without a size count as 0 bytes.

Every allocation counts once. When allocations are sampled (one in N recorded), each will
carry a weight (N) and its bytes and count will be multiplied by it here; not yet.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, NamedTuple

import numpy as np
import pandas as pd

from memprof.analysis.chains import with_canonical_stacks
from memprof.analysis.lifetimes import NEVER, Lifetimes, category_codes, end_times, label_of, live_mask
from memprof.model.schema import LAYERS

# Estimates past this are damage (a tampered part, a bogus u64 size), not memory: clipped
# so the int64 cast stays defined.
_MAX_WEIGHTED_BYTES = float(1 << 62)


def weighted_bytes(size: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """Bytes each allocation stands for: rint(size × weight) as int64. A weight that is not
    a finite number (a damaged part) counts as 0 bytes, and products are clipped to ±2^62,
    so no cast of NaN, infinity or an overflow yields an undefined value."""
    product = np.nan_to_num(size * weight, nan=0.0, posinf=_MAX_WEIGHTED_BYTES, neginf=-_MAX_WEIGHTED_BYTES)
    return np.rint(np.clip(product, -_MAX_WEIGHTED_BYTES, _MAX_WEIGHTED_BYTES)).astype(np.int64)


@dataclass(frozen=True)
class ChainBytes:
    """Live bytes and count of one chain (canonical stack_id; None: recorded without a stack)
    at one time (a layer's peak in layer_summary, the time asked for in attribution.attribute)."""

    stack_id: int | None
    live_bytes: int
    live_count: int


@dataclass(frozen=True)
class LayerStats:
    """One layer's curve: its highest live bytes (`peak_bytes`, first reached at `peak_ns`),
    live bytes after its last event (`final_bytes`), how many allocations it saw, and the
    chains holding the most at the peak (by live bytes, then count, descending)."""

    layer: str
    peak_bytes: int
    peak_ns: int
    final_bytes: int
    alloc_count: int
    top_chains: list[ChainBytes]


@dataclass(frozen=True)
class MetricStats:
    """One sampled series (metric, device): highest value (first reached at `peak_ns`) and
    the value at its last sample. Units are in the metric's name."""

    metric: str
    device: str
    peak: float
    peak_ns: int
    final: float


@dataclass
class LayerSummary:
    """Layers outermost first (schema order; unknown layer names after, sorted); metrics by
    (metric, device)."""

    layers: list[LayerStats]
    metrics: list[MetricStats]


def layer_summary(lifetimes: Lifetimes, samples: pd.DataFrame | None, *,
                  canonical_stack: Mapping[int, int] | None = None, top: int = 3) -> LayerSummary:
    """Summarize every layer that has allocations, and every series in `samples` (columns
    ts_ns, metric, device, value; None or empty: no metrics). At most `top` chains per layer.
    `canonical_stack` merges stack ids with identical frames (chains.canonical_stacks).
    Sampled allocations count by their weight (bytes and counts are estimates then)."""
    allocations = with_canonical_stacks(lifetimes.allocations, canonical_stack)
    codes, names = category_codes(allocations["layer"])
    columns = LiveColumns.of(allocations)
    layers = []
    for code in _layer_order(codes, names):
        layers.append(_layer_stats(label_of(names[code]), columns.subset(codes == code), top))
    return LayerSummary(layers=layers, metrics=metric_stats(samples))


class LiveColumns(NamedTuple):
    """The allocation columns the curve needs, as plain numpy arrays (one entry per allocation);
    regions.py reads each layer's peak per window from them too."""

    alloc_ts: np.ndarray
    end_ts: np.ndarray  # int64 max where the allocation never ended
    size: np.ndarray
    has_stack: np.ndarray
    stack: np.ndarray  # 0 where has_stack is False
    weight: np.ndarray  # allocations each one stands for (sampled sources); 1.0 otherwise

    @classmethod
    def of(cls, allocations: pd.DataFrame) -> "LiveColumns":
        stack = allocations["stack_id"]
        weight = allocations["weight"].to_numpy(dtype=float) if "weight" in allocations else np.ones(len(allocations))
        size = allocations["size_bytes"].to_numpy(dtype=np.int64, na_value=0)
        return cls(alloc_ts=allocations["alloc_ts_ns"].to_numpy(dtype=np.int64),
                   end_ts=end_times(allocations),
                   size=weighted_bytes(size, weight),  # estimated bytes it stands for
                   has_stack=stack.notna().to_numpy(), stack=stack.to_numpy(dtype=np.int64, na_value=0),
                   weight=weight)

    def subset(self, mask: np.ndarray) -> "LiveColumns":
        return LiveColumns(*(values[mask] for values in self))


def _layer_order(codes: np.ndarray, names: np.ndarray) -> list[int]:
    """Codes of the layers that occur, in schema order, then unknown names sorted."""
    present = np.unique(codes[codes >= 0])
    rank = {layer: i for i, layer in enumerate(LAYERS)}
    return sorted(present.tolist(), key=lambda c: (rank.get(label_of(names[c]), len(rank)), label_of(names[c])))


def _layer_stats(layer: str, cols: LiveColumns, top: int) -> LayerStats:
    times, live = live_curve(cols.alloc_ts, cols.end_ts, cols.size)
    peak_at = int(np.argmax(live))  # first maximum: the earliest time the peak was reached
    peak_ns = int(times[peak_at])
    return LayerStats(layer=layer, peak_bytes=int(live[peak_at]), peak_ns=peak_ns, final_bytes=int(live[-1]),
                      alloc_count=int(round(cols.weight.sum())), top_chains=chains_at(cols, peak_ns, top))


def live_curve(alloc_ts: np.ndarray, end_ts: np.ndarray, size: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(times, live bytes just after all events at each time): distinct event times ascending.

    `end_ts` holds int64 max for allocations that never ended (they add no event). Needs at
    least one allocation."""
    ended = end_ts != NEVER
    times = np.concatenate([alloc_ts, end_ts[ended]])
    deltas = np.concatenate([size, -size[ended]])
    order = np.argsort(times, kind="stable")
    times, live = times[order], np.cumsum(deltas[order])
    last_of_time = np.append(times[1:] != times[:-1], True)
    return times[last_of_time], live[last_of_time]


def chains_at(cols: LiveColumns, ts_ns: int, top: int) -> list[ChainBytes]:
    """The `top` chains by bytes live at `ts_ns`, then by count (descending), then stack_id."""
    live = live_mask(cols.alloc_ts, cols.end_ts, ts_ns)
    if top <= 0 or not live.any():
        return []
    frame = pd.DataFrame({"stack_id": np.where(cols.has_stack, cols.stack, -1)[live],
                          "has_stack": cols.has_stack[live], "size": cols.size[live], "weight": cols.weight[live]})
    groups = frame.groupby(["has_stack", "stack_id"], sort=False).agg(
        live_bytes=("size", "sum"), live_count=("weight", "sum")).reset_index()
    groups = groups.sort_values(["live_bytes", "live_count", "has_stack", "stack_id"],
                                ascending=[False, False, False, True], kind="stable").head(top)
    return [ChainBytes(stack_id=int(row.stack_id) if row.has_stack else None, live_bytes=int(row.live_bytes),
                       live_count=int(round(row.live_count))) for row in groups.itertuples(index=False)]


def metric_stats(samples: pd.DataFrame | None) -> list[MetricStats]:
    """Peak (earliest time reached) and final (latest sample) value of each (metric, device)
    series; samples with a missing value are ignored. Sorted by (metric, device)."""
    if samples is None or samples.empty:
        return []
    frame = samples[["ts_ns", "metric", "device", "value"]].dropna(subset=["value"])
    frame = frame.assign(device=frame["device"].astype(object).where(frame["device"].notna(), ""),
                         metric=frame["metric"].astype(str))
    frame = frame.sort_values(["metric", "device", "ts_ns"], kind="stable", ignore_index=True)
    grouped = frame.groupby(["metric", "device"], sort=True)
    peaks = frame.loc[grouped["value"].idxmax()]
    finals = grouped["value"].last()
    return [MetricStats(metric=str(row.metric), device=str(row.device), peak=float(row.value),
                        peak_ns=int(row.ts_ns), final=float(finals[(row.metric, row.device)]))
            for row in peaks.itertuples(index=False)]
