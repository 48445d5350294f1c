"""layer_summary and its renderers: known answers on synthetic timelines."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
from rich.console import Console

from memprof.analysis.chains import canonical_stacks
from memprof.analysis.layers import ChainBytes, LayerStats, MetricStats, layer_summary, live_curve
from memprof.analysis.leaks import chain_frames
from memprof.analysis.lifetimes import pair_lifetimes
from memprof.analysis.views import About, LayersView
from memprof.report.layers import render, to_json
from tests.factories import churn, concat_events, ev, events_frame, stacks_frames

S = 1_000_000_000
MiB = 1 << 20
HALF = MiB // 2

# native_heap: 1 MiB (chain 1) kept; 1.5 MiB (chain 2) and 0.5 MiB (chain 3) held from 2 s and
# 3 s, freed at 4 s and 5 s: 3 MiB live from 3 s to 4 s, 1 MiB at the end.
HEAP = [
    (1 * S, "alloc", 0xA0, MiB, 1),
    (2 * S, "alloc", 0xB0, 3 * HALF, 2),
    (3 * S, "alloc", 0xC0, HALF, 3),
    (4 * S, "free", 0xB0),
    (5 * S, "free", 0xC0),
]
# kernel_slab: 2 MiB at 6 s, half of it freed at 7 s.
SLAB = [
    ev(6 * S, "alloc", 0x10, MiB, 7, layer="kernel_slab"),
    ev(6 * S, "alloc", 0x20, MiB, 8, layer="kernel_slab"),
    ev(7 * S, "free", 0x20, layer="kernel_slab"),
]


def summary_of(rows, samples=None, **kwargs):
    return layer_summary(pair_lifetimes(events_frame(rows)), samples, **kwargs)


def samples_frame(rows) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=["ts_ns", "metric", "device", "value"])
    return frame.astype({"ts_ns": "int64", "value": "float64"})


SAMPLES = samples_frame([
    (4 * S, "rss_bytes", "cpu", 20.0 * MiB),
    (1 * S, "rss_bytes", "cpu", 10.0 * MiB),
    (2 * S, "rss_bytes", "cpu", 30.0 * MiB),
    (3 * S, "rss_bytes", "cpu", 30.0 * MiB),  # the peak again: the first one counts
    (5 * S, "rss_bytes", "cpu", float("nan")),  # no value: ignored
    (1 * S, "gpu_used_bytes", "cuda:1", 5.0),
    (1 * S, "gpu_used_bytes", "cuda:0", 7.0),
    (2 * S, "gpu_used_bytes", "cuda:0", 3.0),
])


def test_peak_of_exactly_3_mib_then_1_mib_final():
    result = summary_of(HEAP)
    assert result.layers == [LayerStats(
        layer="native_heap", peak_bytes=3 * MiB, peak_ns=3 * S, final_bytes=MiB, alloc_count=3,
        top_chains=[ChainBytes(2, 3 * HALF, 1), ChainBytes(1, MiB, 1), ChainBytes(3, HALF, 1)],
    )]
    assert result.metrics == []


def test_layers_are_not_summed():
    result = summary_of(HEAP + SLAB)
    heap, slab = result.layers  # schema order: native_heap before kernel_slab
    assert (heap.layer, heap.peak_bytes, heap.peak_ns, heap.final_bytes) == ("native_heap", 3 * MiB, 3 * S, MiB)
    assert (slab.layer, slab.peak_bytes, slab.peak_ns, slab.final_bytes, slab.alloc_count) == \
        ("kernel_slab", 2 * MiB, 6 * S, MiB, 2)
    assert [c.stack_id for c in slab.top_chains] == [7, 8]


def test_a_free_and_an_alloc_at_one_time_make_no_spurious_peak():
    rows = [(1 * S, "alloc", 0xA0, MiB, 1), (2 * S, "alloc", 0xB0, MiB, 2), (2 * S, "free", 0xA0)]
    (heap,) = summary_of(rows).layers
    assert (heap.peak_bytes, heap.peak_ns, heap.final_bytes) == (MiB, 1 * S, MiB)
    assert heap.top_chains == [ChainBytes(1, MiB, 1)]  # at the peak, chain 2 was not yet allocated


def test_top_chains_at_the_peak_by_bytes_then_count():
    rows = [
        (1 * S, "alloc", 0x1, 100, 5), (1 * S, "alloc", 0x2, 100, 5), (1 * S, "alloc", 0x3, 100, 5),
        (1 * S, "alloc", 0x4, 400, 6),
        (1 * S, "alloc", 0x5, 300, 9),  # same bytes as chain 5, fewer allocations
        (1 * S, "alloc", 0x6, 50, None),  # no stack
        (1 * S, "alloc", 0x7, 10_000, 4), (1 * S, "free", 0x7),  # made and freed at once: never live
        (2 * S, "alloc", 0x8, 600, 4),  # after the peak (950 B live then)
        (2 * S, "free", 0x4), (2 * S, "free", 0x5),
    ]
    (heap,) = summary_of(rows, top=4).layers
    assert (heap.peak_bytes, heap.peak_ns) == (1050, 1 * S)
    assert heap.top_chains == [ChainBytes(6, 400, 1), ChainBytes(5, 300, 3), ChainBytes(9, 300, 1),
                               ChainBytes(None, 50, 1)]
    assert summary_of(rows, top=1).layers[0].top_chains == [ChainBytes(6, 400, 1)]
    assert summary_of(rows, top=0).layers[0].top_chains == []


def test_metrics_peak_final_and_time():
    result = summary_of(HEAP, SAMPLES)
    assert result.metrics == [
        MetricStats("gpu_used_bytes", "cuda:0", peak=7.0, peak_ns=1 * S, final=3.0),
        MetricStats("gpu_used_bytes", "cuda:1", peak=5.0, peak_ns=1 * S, final=5.0),
        MetricStats("rss_bytes", "cpu", peak=30.0 * MiB, peak_ns=2 * S, final=20.0 * MiB),
    ]


def test_no_allocations_and_no_samples():
    result = layer_summary(pair_lifetimes(events_frame([])), samples_frame([]))
    assert result.layers == [] and result.metrics == []


def test_live_curve_matches_a_direct_count():
    events = churn(500, every_ns=1_000, size=64, pool=7)
    allocations = pair_lifetimes(concat_events(events, events_frame([(10, "alloc", 0x99, 5, 1)]))).allocations
    alloc_ts = allocations["alloc_ts_ns"].to_numpy()
    end_ts = allocations["end_ts_ns"].to_numpy(dtype=np.int64, na_value=np.iinfo(np.int64).max)
    size = allocations["size_bytes"].to_numpy(dtype=np.int64)
    times, live = live_curve(alloc_ts, end_ts, size)
    direct = [int(size[(alloc_ts <= t) & (t < end_ts)].sum()) for t in times]
    assert live.tolist() == direct and np.all(np.diff(times) > 0)


# -- renderers --------------------------------------------------------------------------------

CHAINS = {
    1: [("native", "malloc", "libc.so.6", None, None), ("native", "load_cache", "train", None, None),
        ("python", "main", None, "train.py", 9)],
    2: [("native", "__libc_malloc", "libc.so.6", None, None), ("native", "_int_malloc", "libc.so.6", None, None),
        ("native", "collate[batch]", "train", None, None), ("python", "step", None, "train.py", 42),
        ("python", "loop", None, "train.py", 30), ("python", "main", None, "train.py", 9)],
    7: [("kernel", "kmalloc_trace+0x2f", "vmlinux", None, None),
        ("kernel", "alloc_pipe_info+0x3f", "vmlinux", None, None),
        ("kernel", "create_pipe_files", "vmlinux", None, None)],
}


def rendered() -> tuple[str, dict]:
    stacks, frames = stacks_frames(CHAINS)
    result = summary_of(HEAP + SLAB, SAMPLES, canonical_stack=canonical_stacks(stacks))
    chains = chain_frames(stacks, frames, [c.stack_id for layer in result.layers for c in layer.top_chains])
    console = Console(width=100, record=True, color_system=None)
    view = LayersView(result, About("run.memprof"), chains)
    render(view, console)
    return console.export_text(), to_json(view)


def test_terminal_shows_the_numbers_and_chains():
    text, _ = rendered()
    heap_table = text[text.index("native_heap"):text.index("kernel_slab")]
    assert "3.0 MiB" in heap_table and "+3.00s" in heap_table and "1.0 MiB" in heap_table
    # "[batch]" escaped (not read as markup); the malloc frames skipped.
    assert "1. 1.5 MiB in 1 allocation  collate[batch] ← step ← loop ← …" in heap_table
    assert "2. 1.0 MiB in 1 allocation  load_cache ← main" in heap_table
    assert "3. 512 B" not in heap_table and "512.0 KiB in 1 allocation  (no stack recorded)" in heap_table
    slab_table = text[text.index("kernel_slab"):text.index("samples")]
    assert "2.0 MiB" in slab_table and "+6.00s" in slab_table
    assert "alloc_pipe_info ← create_pipe_files" in slab_table and "kmalloc" not in slab_table
    samples = text[text.index("samples"):]
    assert "rss_bytes" in samples and "30.0 MiB" in samples and "20.0 MiB" in samples and "+2.00s" in samples
    assert "gpu_used_bytes" in samples and "cuda:1" in samples and "7 B" in samples
    assert max(len(line) for line in text.splitlines()) <= 100


def test_json_has_every_number_and_stacks():
    _, data = rendered()
    json.dumps(data)  # plain types only
    assert data["recording"] == "run.memprof"
    heap = data["layers"][0]
    assert {k: heap[k] for k in ("layer", "peak_bytes", "peak_ns", "final_bytes", "alloc_count")} == {
        "layer": "native_heap", "peak_bytes": 3 * MiB, "peak_ns": 3 * S, "final_bytes": MiB, "alloc_count": 3}
    assert [(c["stack_id"], c["live_bytes"], c["live_count"]) for c in heap["top_chains"]] == \
        [(2, 3 * HALF, 1), (1, MiB, 1), (3, HALF, 1)]
    assert heap["top_chains"][0]["stack"][2] == {"kind": "native", "function": "collate[batch]", "module": "train",
                                                 "file": None, "line": None}
    assert heap["top_chains"][2]["stack"] == []
    assert data["metrics"][-1] == {"metric": "rss_bytes", "device": "cpu", "peak": 30.0 * MiB,
                                   "peak_ns": 2 * S, "final": 20.0 * MiB}


def test_sampled_allocations_count_by_their_weight():
    """Two allocations sampled with weight 4 stand for eight: an unbiased estimate."""
    rows = [ev(1 * S, "alloc", 0x10, 1000, 1, weight=4.0), ev(2 * S, "alloc", 0x20, 1000, 1, weight=4.0)]
    (heap,) = summary_of(rows).layers
    assert (heap.peak_bytes, heap.alloc_count) == (8000, 8)
    assert (heap.top_chains[0].live_bytes, heap.top_chains[0].live_count) == (8000, 8)


def test_loss_is_shown_in_the_layers_report():
    result = summary_of(HEAP)
    console = Console(width=120, record=True, color_system=None)
    view = LayersView(result, About("run.memprof", lost_events=47, notes=("kmem: a note",)))
    render(view, console)
    text = console.export_text()
    assert "47 events were lost while recording" in text and "note: kmem: a note" in text
    doc = to_json(view)
    assert (doc["lost_events"], doc["notes"]) == (47, ["kmem: a note"])


def test_weighted_bytes_of_damaged_weights_and_sizes_are_defined():
    """NaN or infinite weights and sizes near int64's end (a tampered part, a bogus u64
    size) give defined int64 byte counts, never a cast of NaN or an overflow."""
    import warnings
    from memprof.analysis.layers import weighted_bytes
    size = np.array([100, 100, 100, np.iinfo(np.int64).max, -np.iinfo(np.int64).max], dtype=np.int64)
    weight = np.array([2.5, np.nan, np.inf, 1.0, 1.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = weighted_bytes(size, weight)
    assert got.tolist() == [250, 0, 1 << 62, 1 << 62, -(1 << 62)]
