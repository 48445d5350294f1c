"""What the HTML report shows, computed once and bounded in size: every layer's live-bytes
curve and every sampled series, downsampled; step marks and OOMs; the leak findings (as
`memprof report leaks` finds them); icicle trees of the chains holding each layer's bytes at
the end and at its peak (as `memprof report top/peak` attribute them); the GPU breakdown;
the regions between marks with numbers and their memory surface (as `memprof report regions`
gives them, one chain per region and layer); and what the recording lost or sampled.

Pure functions over the timeline, its lifetimes, the stacks/frames/samples tables and the
recording's metadata; no I/O. Times are CLOCK_MONOTONIC ns, sizes bytes.

Size is bounded whatever the recording's length: a curve keeps at most `max_points` + 2
points (the highest value of each of `max_points` equal time buckets, at the time it was
reached, plus the first and last points), so peaks survive; at most MAX_MARKS step marks and
OOMs, `top` findings and `top` chains per layer in each tree, chains cut to MAX_DEPTH frames.
Bytes are never added across layers: each layer has its own curve and its own tree.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from memprof.analysis.attribution import Attribution, attribute
from memprof.analysis.gpu import GpuBreakdown, gpu_breakdown
from memprof.analysis.checkpoints import step_marks
from memprof.analysis.chains import DEFAULT_NATIVE_FRAMES
from memprof.analysis.leaks import DEFAULT_MIN_AGE_NS, LeakResult, chain_frames
from memprof.analysis.compaction import is_folded
from memprof.analysis.lifetimes import Lifetimes
from memprof.analysis.loss import Severity, recording_notes, skipped_frees
from memprof.analysis.overview import leak_report, recording_span
from memprof.analysis.regions import RegionsResult, regions
from memprof.analysis.series import CounterSeries, layer_series, sample_series, user_marks
from memprof.model.meta import RecordingMeta
from memprof.model.schema import Action

MAX_POINTS = 2000  # buckets per curve: a few thousand points draw sharply at any screen width
MAX_MARKS = 1000  # step marks, the user's marks and OOMs drawn at most (evenly picked beyond that)
MAX_DEPTH = 64  # frames kept per chain in a tree (the outermost; deeper ones are summed in "…")
REGION_TOP = 1  # chains named per region and layer: the page's table shows the one holding the most
# Layers that nest draw in one chart, side by side; families do not add up either.
FAMILIES = {"cuda_block": "gpu", "cuda_segment": "gpu", "cuda_driver": "gpu",
            "torch_cpu": "host", "native_heap": "host", "kernel_slab": "kernel", "kernel_page": "kernel"}
CAPACITY_METRICS = ("host_memory_total_bytes", "gpu_total_bytes")
_METRIC_FAMILY = {"gpu": "gpu", "rss": "host", "pss": "host"}  # by the metric name's first word


@dataclass(frozen=True)
class Series:
    """One downsampled curve: `times_ns` ascending (CLOCK_MONOTONIC), `values` (bytes for a
    layer; the metric's unit for a sample) held from each time until the next. `peak` is the
    series' highest value (first reached at `peak_ns`), `final` its last; `points_in` how
    many points it had before downsampling. `kind` is "layer" or "sample"."""

    name: str
    device: str
    kind: str
    family: str
    times_ns: np.ndarray
    values: np.ndarray
    peak: float
    peak_ns: int
    final: float
    points_in: int


@dataclass(frozen=True)
class Flame:
    """One layer's icicle at `ts_ns`: `root` is a node (frame, bytes, children) whose bytes
    are everything live in the layer then; below it the top chains, outermost frame first.
    `frame` indexes HtmlData.frames, or is -1 (the layer), -2 (other chains), -3 (deeper
    frames), -4 (no stack recorded). A node's bytes are at least the sum of its children's."""

    layer: str
    ts_ns: int
    live_count: int
    root: tuple


@dataclass(frozen=True)
class Stack:
    """Layers of one device that do not nest, on shared times, to draw stacked: `layers[i]`
    has `values[i]` (bytes held from each time until the next). Their sum is memory the
    device really held for the target at once (no byte counted twice)."""

    device: str
    layers: list[str]
    times_ns: np.ndarray
    values: list[np.ndarray]


# Layers that nest, innermost first: only the outermost present one of each chain is stacked
# (a tensor lives in the heap, a slab in pages; cuda_block in segments in driver memory).
NESTING = (("torch_cpu", "native_heap"), ("kernel_slab", "kernel_page"),
           ("cuda_block", "cuda_segment", "cuda_driver"))


def stacked_layers(series: list[Series]) -> list[Stack]:
    """Per device, the outermost recorded layer of each nesting chain, aligned on the union of
    their times, when there are two or more of them to stack."""
    out = []
    for device in sorted({s.device for s in series if s.kind == "layer"}):
        layers = {s.name: s for s in series if s.kind == "layer" and s.device == device}
        outer = [next(layers[name] for name in reversed(chain) if name in layers)
                 for chain in NESTING if any(name in layers for name in chain)]
        if len(outer) < 2:
            continue
        times = np.unique(np.concatenate([s.times_ns for s in outer]))
        out.append(Stack(device, [s.name for s in outer], times, [_held_at(s, times) for s in outer]))
    return out


def _held_at(series: Series, times: np.ndarray) -> np.ndarray:
    """The step curve's value at each of `times` (0 before its first point)."""
    at = np.searchsorted(series.times_ns, times, side="right") - 1
    return np.where(at >= 0, series.values[np.maximum(at, 0)], 0)


@dataclass
class HtmlData:
    """Everything the page shows (module docstring). `span` = (start_ns, end_ns of the
    target, end of the recording); `frames` = distinct (kind, function, where) triples the
    flame nodes point to; `warnings` what the recording lost, sampled or estimated (what
    changes the results), `notes` how it was recorded (information), both in plain words."""

    span: tuple[int, int, int]
    series: list[Series]
    stacks: list[Stack]
    steps: pd.DataFrame  # step, ts_ns (at most MAX_MARKS)
    ooms: pd.DataFrame  # ts_ns, layer, device, size_bytes (at most MAX_MARKS)
    leaks: LeakResult
    chains: dict[int, list[dict]]
    flames: dict[str, list[Flame]]  # "end" | "peak" -> one per layer
    frames: list[tuple[str | None, str | None, str | None]]
    gpu: GpuBreakdown
    warnings: list[str] = field(default_factory=list)
    max_points: int = MAX_POINTS
    notes: list[str] = field(default_factory=list)
    marks: pd.DataFrame = field(default_factory=lambda: pd.DataFrame({"ts_ns": [], "label": []}))  # memprof.mark
    regions: RegionsResult | None = None  # between marks with numbers, and the memory surface (regions.py)
    advice: Any = None  # advice.AdviceResult (memprof.api fills it; its chains are in `chains`)


def html_data(events: pd.DataFrame, lifetimes: Lifetimes, *, stacks: pd.DataFrame, frames: pd.DataFrame,
              samples: pd.DataFrame | None, meta: RecordingMeta, canonical_stack: Mapping[int, int] | None = None,
              top: int = 20, max_points: int = MAX_POINTS, native_frames: str = DEFAULT_NATIVE_FRAMES,
              min_age_ns: int = DEFAULT_MIN_AGE_NS, leaks: LeakResult | None = None,
              gpu: GpuBreakdown | None = None, curve_times_ns: Sequence[int] | None = None,
              curve_extremes: Mapping | None = None) -> HtmlData:
    """The page's data for one recording (module docstring). Leaks are judged as `memprof
    report leaks` judges them with its defaults and `min_age_ns`; `leaks` (that judgement
    with its `top`) and `gpu` (gpu_breakdown with its defaults), where the caller has them.
    `curve_times_ns`, `curve_extremes`: the layers' curves only at those times and through those
    points (a folded recording's kept moments and the highest and lowest point between two of them:
    series.layer_series)."""
    curves = timeline_series(lifetimes, samples, max_points=max_points, at_ns=curve_times_ns, extremes=curve_extremes)
    span = recording_span(meta, events)
    if leaks is None:
        leaks = leak_report(meta, events, lifetimes, stacks, frames, canonical_stack=canonical_stack, top=top,
                            min_age_ns=min_age_ns)
    attributions = {at: attribute(lifetimes, by="chain", at=at, span=span, top=top, canonical_stack=canonical_stack)
                    for at in ("end", "peak")}
    shown = [f.stack_id for f in leaks.findings + leaks.not_leaks]
    shown += [row.stack_id for a in attributions.values() for layer in a.layers for row in layer.rows]
    # Each region's chains at its peaks: a bounded count (regions × layers × REGION_TOP).
    swept = regions(lifetimes, events, samples, end_ns=span.end_ns, top=REGION_TOP, canonical_stack=canonical_stack)
    shown += [c.stack_id for r in swept.regions for peak in r.peaks for c in peak.top_chains]
    chains = chain_frames(stacks, frames, shown, native_frames)
    flames, frame_table = flame_trees(attributions, chains)
    notes = recording_notes(meta)
    return HtmlData(span=(span.start_ns, span.end_ns, span.recording_end_ns),
                    series=curves, stacks=stacked_layers(curves),
                    steps=_thinned(step_marks(events)), ooms=_thinned(oom_events(events)), leaks=leaks,
                    chains=chains, flames=flames, frames=frame_table,
                    gpu=gpu if gpu is not None else gpu_breakdown(lifetimes, events, samples, meta=meta),
                    max_points=max_points,
                    warnings=loss_warnings(meta, lifetimes) + [n for n in notes if n.severity is Severity.CAVEAT],
                    notes=[n for n in notes if n.severity is Severity.INFO], marks=_thinned(user_marks(events)),
                    regions=swept)


# ---- curves ---------------------------------------------------------------------------------

def timeline_series(lifetimes: Lifetimes, samples: pd.DataFrame | None, *,
                    max_points: int = MAX_POINTS, at_ns: Sequence[int] | None = None,
                    extremes: Mapping | None = None) -> list[Series]:
    """Live bytes of each (layer, device), layers outermost first (only at `at_ns` and through
    `extremes` where given: series.layer_series), then each sampled (metric, device) series sorted but
    capacities; each cut to at most `max_points` points keeping every peak
    (series.downsample_max), and placed in its chart's family."""
    counters = layer_series(lifetimes, max_points, at_ns, extremes) + [
        # Capacities (the machine's RAM, a GPU's total) are constants, not curves: the page
        # states them instead of drawing a flat line that squeezes every other one.
        c for c in sample_series(samples, max_points) if c.name not in CAPACITY_METRICS]
    return [_series(c) for c in counters]


def _series(counter: CounterSeries) -> Series:
    if counter.kind == "layer":
        family = FAMILIES.get(counter.name, counter.name)
    else:
        family = _METRIC_FAMILY.get(counter.name.split("_")[0], "samples")
    peak_at = int(np.argmax(counter.values))  # the cut keeps every peak: this is the curve's own
    return Series(counter.name, counter.device, counter.kind, family, counter.times_ns, counter.values,
                  peak=counter.values[peak_at].item(), peak_ns=int(counter.times_ns[peak_at]),
                  final=counter.values[-1].item(), points_in=counter.points_in)


# ---- marks ----------------------------------------------------------------------------------

def oom_events(events: pd.DataFrame) -> pd.DataFrame:
    """OOM events as (ts_ns, layer, device, size_bytes) in time order; size 0 where unknown."""
    if len(events) == 0:
        return pd.DataFrame({"ts_ns": [], "layer": [], "device": [], "size_bytes": []})
    rows = events[(events["action"] == Action.OOM.value).to_numpy()]
    return pd.DataFrame({"ts_ns": rows["ts_ns"].to_numpy(np.int64),
                         "layer": rows["layer"].astype(object).fillna("").astype(str).to_numpy(),
                         "device": rows["device"].astype(object).fillna("").astype(str).to_numpy(),
                         "size_bytes": rows["size_bytes"].to_numpy(dtype=np.int64, na_value=0)})


def _thinned(frame: pd.DataFrame, limit: int = MAX_MARKS) -> pd.DataFrame:
    """At most `limit` rows, evenly picked, first and last kept."""
    if len(frame) <= limit:
        return frame.reset_index(drop=True)
    keep = np.unique(np.linspace(0, len(frame) - 1, limit).round().astype(np.int64))
    return frame.iloc[keep].reset_index(drop=True)


# ---- icicles --------------------------------------------------------------------------------

_LAYER, _OTHER, _DEEPER, _NO_STACK = -1, -2, -3, -4


def flame_trees(attributions: Mapping[str, Attribution], chains: Mapping[int, list[dict]]) \
        -> tuple[dict[str, list[Flame]], list[tuple]]:
    """One Flame per layer of each attribution (by chain), and the frame table its nodes
    index. Frames merge on (kind, function, module or file): lines do not split a node."""
    table: dict[tuple, int] = {}
    flames = {at: [_flame(layer, chains, table) for layer in result.layers] for at, result in attributions.items()}
    return flames, list(table)


def _flame(layer, chains: Mapping[int, list[dict]], table: dict) -> Flame:
    root = [_LAYER, int(layer.live_bytes), {}]
    for row in layer.rows:
        if row.stack_id is None:
            path = [_NO_STACK]
        else:
            path = [_frame_index(frame, table) for frame in reversed(chains.get(row.stack_id, []))]
        if len(path) > MAX_DEPTH:
            path = path[:MAX_DEPTH] + [_DEEPER]
        _add(root, path, int(row.live_bytes))
    shown = sum(node[1] for node in root[2].values())
    if layer.live_bytes > shown:
        root[2][_OTHER] = [_OTHER, int(layer.live_bytes) - shown, {}]
    return Flame(layer=layer.layer, ts_ns=layer.ts_ns, live_count=layer.live_count, root=_frozen(root))


def _frame_index(frame: dict, table: dict) -> int:
    key = (frame.get("kind"), frame.get("function"), frame.get("module") or frame.get("file"))
    return table.setdefault(key, len(table))


def _add(root: list, path: list[int], nbytes: int) -> None:
    """Add one chain's bytes along `path` (outermost first) below the root (which counts them already)."""
    node = root
    for index in path:
        node = node[2].setdefault(index, [index, 0, {}])
        node[1] += nbytes


def _frozen(node: list) -> tuple:
    """(frame, bytes, children biggest first) as nested tuples."""
    children = sorted(node[2].values(), key=lambda child: -child[1])
    return node[0], node[1], tuple(_frozen(child) for child in children)


# ---- loss -----------------------------------------------------------------------------------

def loss_warnings(meta: RecordingMeta, lifetimes: Lifetimes) -> list[str]:
    """Plain-words warnings: events each source lost or skipped, and allocations recorded one
    in N (their bytes and counts are estimates)."""
    out = []
    for name, stats in sorted(meta.sources.items()):
        if stats.lost:
            out.append(f"{name}: {stats.lost} events were lost (ring buffer full): curves and findings miss them")
        frees = skipped_frees(stats)
        if frees:
            out.append(f"{name}: {sum(frees.values())} frees were skipped by the kernel ({_listed(frees)}): "
                       "allocations shown as live may have been freed")
    allocations = lifetimes.allocations
    weight = allocations["weight"].to_numpy(dtype=float) if "weight" in allocations else np.ones(0)
    if len(weight) and "addr" in allocations:  # folded pairs (record --max-size) are exact counts, not samples
        weight = weight[~is_folded(allocations["addr"].to_numpy())]
    sampled = int((weight != 1.0).sum())
    if sampled:
        out.append(f"{sampled} allocations were sampled (each stands for up to {weight.max():g}): "
                   "their bytes and counts are estimates")
    return out


def _listed(counts: Mapping[str, int]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in sorted(counts.items()) if v)

