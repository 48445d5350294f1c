"""Folding (issue 23, item 2): pairing in time-ordered batches gives pair_lifetimes' verdicts
over the whole; parts that overlap in time come out in time order; a folded analysis keeps
exactly what the leak, peak and end views judge, and the views that need every event refuse
it (exit 2) instead of drawing wrong curves."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from memprof.analysis.fold import PairingStream, PeakTracker, live_at_any, named_model_state
from memprof.analysis.layers import live_curve, weighted_bytes
from memprof.analysis.lifetimes import end_times, pair_lifetimes
from memprof.api import analyse
from memprof.errors import ExitCode, FoldedRecordingError
from memprof.model.frames import concat_frames
from memprof.model.meta import RecordingMeta
from memprof.recording import RecordingWriter
from memprof.recording.stream import event_parts, paired_batches
from memprof.report import reporters
from memprof.timeline import with_model_state
from tests.diff_factories import write_recording
from tests.factories import ev, events_frame, random_lifetimes
from tests.report_factories import known_recording

S = 1_000_000_000


def _verdicts(allocations: pd.DataFrame) -> list[tuple]:
    """Each allocation's identity and verdict, sorted (batches emit allocations as they end)."""
    rows = zip(allocations["alloc_ts_ns"], allocations["layer"].astype(str), allocations["addr"],
               end_times(allocations), allocations["end_kind"].astype(str), allocations["size_bytes"])
    return sorted((int(a), layer, int(addr), int(e), kind, int(size)) for a, layer, addr, e, kind, size in rows)


def _streamed(events: pd.DataFrame, cuts: list[int]) -> tuple[pd.DataFrame, PairingStream]:
    stream = PairingStream()
    bounds = [0, *cuts, len(events)]
    ended = [stream.feed(events.iloc[a:b].reset_index(drop=True)) for a, b in zip(bounds[:-1], bounds[1:])]
    return concat_frames([*ended, stream.finish()]), stream


def _awkward_events() -> pd.DataFrame:
    """Frees that find no allocation, an address handed out twice (a missed free) and a
    caching allocator's free_requested completed by a free, each across a batch cut below."""
    rows = [ev(10, "free", 0x1), ev(20, "alloc", 0x2, 64, 1), ev(30, "alloc", 0x2, 32, 1),
            ev(40, "alloc", 0x3, 128, 2, layer="cuda_block", device="cuda:0"),
            ev(50, "free_requested", 0x3, layer="cuda_block", device="cuda:0"),
            ev(60, "free", 0x3, layer="cuda_block", device="cuda:0"), ev(70, "free", 0x2), ev(80, "free", 0x2),
            ev(90, "alloc", 0x4, 8, 3), ev(95, "free_requested", 0x5, layer="cuda_block", device="cuda:0")]
    return events_frame(rows)


@pytest.mark.parametrize("cuts", [[], [1, 2, 3, 4, 5, 6, 7, 8, 9], [3, 5], [2, 6]])
def test_batches_give_the_verdicts_and_counts_of_one_pass(cuts):
    events = _awkward_events()
    whole = pair_lifetimes(events)
    streamed, stream = _streamed(events, cuts)
    assert _verdicts(streamed) == _verdicts(whole.allocations)
    assert stream.totals() == (whole.unmatched_frees, whole.missed_frees)
    assert whole.unmatched_frees == {"native_heap": 2, "cuda_block": 1} and whole.missed_frees == {"native_heap": 1}


def test_random_timeline_in_many_batches_pairs_as_one():
    events = random_lifetimes(20_000, seed=3, live_fraction=0.05)
    whole = pair_lifetimes(events)
    streamed, stream = _streamed(events, list(range(997, len(events), 997)))
    assert len(streamed) == 20_000
    assert _verdicts(streamed) == _verdicts(whole.allocations)
    assert (streamed["end_kind"] == "live").sum() == (whole.allocations["end_kind"] == "live").sum() > 900


def test_live_at_any_follows_the_half_open_lifetime():
    alloc = np.array([0, 5, 10, 11, 30])
    end = np.array([5, 10, 11, 20, np.iinfo(np.int64).max])
    assert live_at_any(alloc, end, np.array([10, 25])).tolist() == [False, False, True, False, False]
    assert live_at_any(alloc, end, np.array([4, 30])).tolist() == [True, False, False, False, True]


def test_peaks_tracked_batch_by_batch_are_the_layers_peaks():
    events = random_lifetimes(30_000, seed=7)
    whole = pair_lifetimes(events).allocations
    tracker, stream = PeakTracker(), PairingStream()
    for start in range(0, len(events), 4_999):
        batch = events.iloc[start:start + 4_999].reset_index(drop=True)
        tracker.add(batch, stream.feed(batch))
    peaks = tracker.peaks()
    for layer in ("native_heap", "kernel_slab", "torch_cpu"):
        mine = whole[whole["layer"] == layer]
        size = weighted_bytes(mine["size_bytes"].to_numpy(dtype=np.int64), mine["weight"].to_numpy())
        times, live = live_curve(mine["alloc_ts_ns"].to_numpy(), end_times(mine), size)
        at = int(np.argmax(live))
        assert peaks[(layer,)] == (int(live[at]), int(times[at]))


def test_model_state_names_the_allocation_live_at_the_note():
    rows = [ev(10, "alloc", 0xA, 4096, 1), ev(20, "free", 0xA), ev(30, "alloc", 0xA, 4096, 1),
            dict(ts_ns=40, action="mark", category="state:parameter:fc.weight", addr=0xA),
            dict(ts_ns=50, action="mark", category="state:parameter:fc.bias", addr=0xB),
            ev(60, "alloc", 0xB, 64, 2), dict(ts_ns=70, action="mark", category="state:parameter:fc.bias", addr=0xB)]
    events = events_frame(rows, layer="torch_cpu")
    expected = pair_lifetimes(with_model_state(events)).allocations["category"].astype(object).tolist()
    others = events[events["action"] == "mark"].reset_index(drop=True)
    named = named_model_state(pair_lifetimes(events).allocations, others)
    assert named["category"].astype(object).tolist() == expected
    assert expected[1:] == ["state:parameter:fc.weight", "state:parameter:fc.bias"] and pd.isna(expected[0])


def _write_parts(path, parts: list[pd.DataFrame], end_ns: int) -> None:
    """A recording whose events parts are `parts`, one flush each (as the recorder leaves them)."""
    writer = RecordingWriter(path, RecordingMeta(memprof_version="0.1.0", command=["x"], pid=100, start_ns=0))
    for part in parts:
        writer.append("events", {name: part[name] for name in part.columns})
        writer.flush()
    writer.finalize(end_ns=end_ns)


def test_overlapping_parts_come_out_in_time_order_in_batches(tmp_path):
    events = random_lifetimes(6_000, seed=1)
    events["seq"] = np.arange(len(events), dtype=np.int64)
    # Three parts that overlap in time: the middle one holds rows older than the first's last.
    order = np.r_[0:2_500, 3_000:6_000, 2_500:3_000, 6_000:len(events)]
    chunks = [events.iloc[order[a:b]].reset_index(drop=True) for a, b in ((0, 4_000), (4_000, 8_000), (8_000, len(order)))]
    _write_parts(tmp_path / "r.memprof", chunks, end_ns=61 * S)
    parts = event_parts(tmp_path / "r.memprof")
    assert [p.rows for p in parts] == [4_000, 4_000, len(events) - 8_000]
    batches = list(paired_batches(parts, batch_rows=1_000))
    assert len(batches) >= 3
    streamed = concat_frames(batches)
    assert streamed["seq"].tolist() == list(range(len(events)))


def test_a_folded_recording_gives_the_leaks_layers_and_peaks_of_the_whole(tmp_path):
    path = known_recording(tmp_path / "k.memprof")
    whole, folded = analyse(path), analyse(path, max_memory=1)
    assert whole.fold is None and folded.fold is not None and folded.fold.events == 42
    for view in (lambda a: a.leaks(top=None), lambda a: a.layers(), lambda a: a.attribution(at="peak"),
                 lambda a: a.attribution(at="end", by="function")):
        a, b = reporters.to_json(view(whole)), reporters.to_json(view(folded))
        assert b.pop("notes")[-1].startswith("folded: 42 events need about 7.0 KiB whole")
        a.pop("notes")
        assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def _churn_recording(path):
    """Steps 1..10 a second apart; in each of steps 1..9, 50 allocations of 10 B (chain 1) made
    at a quarter of the step and freed at its half, one of 4096 B (chain 3) kept to the end;
    in step 5 also 1 MiB (chain 2) for a tenth of a second: the peak."""
    rows = [dict(ts_ns=k * S, action="mark", category="step", step=k) for k in range(1, 11)]
    rows += [ev(k * S + S // 4 + i, "alloc", 0x100 + i, 10, 1) for k in range(1, 10) for i in range(50)]
    rows += [ev(k * S + S // 2 + i, "free", 0x100 + i) for k in range(1, 10) for i in range(50)]
    rows += [ev(5 * S + S // 3, "alloc", 0x9000, 1 << 20, 2), ev(5 * S + S // 3 + S // 10, "free", 0x9000)]  # the peak
    rows += [ev(k * S + S // 4, "alloc", 0x10_0000 * k, 4096, 3) for k in range(1, 10)]  # kept across steps
    return write_recording(path, events_frame(sorted(rows, key=lambda r: r["ts_ns"]), layer="native_heap"),
                           end_ns=11 * S)


def test_short_lived_allocations_are_counted_not_kept(tmp_path):
    """Churn between two steps is dropped, counted in its layer's allocations; what lives
    across a step, and what is live at the peak (step 5's churn with it), are kept."""
    path = _churn_recording(tmp_path / "churn.memprof")
    whole, folded = analyse(path), analyse(path, max_memory=1)
    assert len(whole.lifetimes.allocations) == 9 * 50 + 1 + 9
    assert folded.fold.dropped_count == {"native_heap": 8 * 50} and folded.fold.kept == 50 + 1 + 9
    assert folded.layers().result.layers[0].alloc_count == whole.layers().result.layers[0].alloc_count == 460
    peak = lambda a: (a.layers().result.layers[0].peak_bytes, a.layers().result.layers[0].peak_ns)  # noqa: E731
    assert peak(folded) == peak(whole) and peak(whole)[0] == (1 << 20) + 5 * 4096 + 50 * 10


@pytest.mark.parametrize("view", ["regions", "advice", "html"])
def test_views_that_need_every_event_refuse_a_folded_recording(tmp_path, view):
    """Refused where the fold was not asked to keep what they read (analyse(regions=…, advice=…))."""
    folded = analyse(known_recording(tmp_path / "k.memprof"), max_memory=1)
    with pytest.raises(FoldedRecordingError) as raised:
        getattr(folded, view)()
    assert raised.value.exit_code == ExitCode.USAGE and "--max-memory" in raised.value.hint
    assert view in raised.value.what
    with pytest.raises(FoldedRecordingError):
        folded.leaks(window_ns=S)
    with pytest.raises(FoldedRecordingError):
        folded.attribution(at=3 * S)


def _gpu_recording(path, *, steps: bool):
    """Two GPUs over 10 s: each second a 1 GiB segment on cuda:0 and 512 MiB on cuda:1 that
    stay; within each second 20 blocks of 64 MiB on cuda:0, each freed 1 ms after its birth
    (the churn a fold drops), requested 48 MiB each; at 6.5 s a 3 GiB block on cuda:1 for 0.1 s (its peak,
    between any two points); step marks each second when `steps`."""
    from tests.gpu_factories import GiB, MiB, cuda, step_marks, timeline_of, write_recording as write_gpu
    rows = step_marks(range(1, 10)) if steps else []
    for k in range(1, 10):
        rows += [cuda(k * S + 1, "alloc", 0x1_0000_0000 * k, GiB, layer="cuda_segment"),
                 cuda(k * S + 2, "alloc", 0x1_0000_0000 * k, 512 * MiB, layer="cuda_segment", device="cuda:1")]
        for i in range(20):
            born = k * S + S // 4 + i * 1000
            rows += [cuda(born, "alloc", 0x9_0000_0000 + i, 64 * MiB, requested_bytes=48 * MiB),
                     cuda(born + S // 1000, "free", 0x9_0000_0000 + i)]
    rows += [cuda(6 * S + S // 2, "alloc", 0x7_0000_0000, 3 * GiB, device="cuda:1"),
             cuda(6 * S + S // 2 + S // 10, "free", 0x7_0000_0000, device="cuda:1")]
    return write_gpu(path, timeline_of(rows))


@pytest.mark.parametrize("steps", [True, False])
def test_report_gpu_reads_a_folded_recording_at_the_points_it_kept(tmp_path, steps):
    """The fold keeps what is live at `report gpu`'s points and at each GPU's peak in each
    layer: the breakdown is the whole recording's at the same points, peaks included, though
    the churn between the points was dropped. With step marks the points are the whole's;
    without, they span the recording (the whole's span its GPU data), so the whole is read
    at the fold's times to compare."""
    from memprof.analysis.gpu import gpu_breakdown
    from memprof.analysis.views import GpuView
    path = _gpu_recording(tmp_path / "gpu.memprof", steps=steps)
    whole, folded = analyse(path), analyse(path, max_memory=1, gpu_points=5)
    assert sum(folded.fold.dropped_count.values()) > 0 and len(folded.fold.gpu_times_ns) == 5
    if steps:
        expected = whole.gpu(points=5)
    else:
        expected = GpuView(gpu_breakdown(whole.lifetimes, whole.events, whole.rec.samples, meta=whole.rec.meta,
                                         times_ns=folded.fold.gpu_times_ns), whole.about)
    a, b = reporters.to_json(expected), reporters.to_json(folded.gpu(points=5))
    notes = b.pop("notes")
    assert notes[-1].startswith("folded: each term's peak") and "the 5 times `report gpu` reads" in notes[-2]
    assert notes[:-2] == a.pop("notes")
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    assert [d["peak_reserved_bytes"] for d in b["devices"]] == [9 * (1 << 30), 9 * (512 << 20)]
    # cuda:0's 20 blocks live together only inside one millisecond, away from every point
    assert b["devices"][0]["peak_requested_bytes"] == 20 * 48 * (1 << 20)
    with pytest.raises(FoldedRecordingError):
        folded.gpu(points=20)  # points it was not asked to keep


def test_report_regions_reads_a_folded_recording_as_the_whole(tmp_path):
    """test_regions' sweep (4 regions, a carried allocation live as region 3 begins), with
    20 native_heap allocations of 8 B per region, each freed 1 µs after its birth, and in
    kernel_page 128 B live [1.1 s, 1.2 s) then 64 B live [1.999 s, 2.001 s): region 2's
    kernel_page peak is what was live as it began, at no other moment a fold keeps. The fold
    drops all but the first native_heap allocation of each region (its peak) and keeps each
    region's start, so every (layer, device)'s peak per region and the chains holding it
    are the whole's."""
    from tests.factories import concat_events
    from tests.gpu_factories import write_recording as write_with_samples
    from tests.unit.test_regions import CONFIGS, MS, sweep_events, sweep_samples
    churn = [ev(t + 300 * MS + i * 1000, action, 0x7000 + i, 8 if action == "alloc" else None, 5, layer="native_heap")
             for t, *_ in CONFIGS for i in range(20) for action in ("alloc", "free")]
    churn = [dict(row, ts_ns=row["ts_ns"] + (1 if row["action"] == "free" else 0)) for row in churn]
    churn += [ev(1_100 * MS, "alloc", 0x8000, 128, 6, layer="kernel_page"), ev(1_200 * MS, "free", 0x8000, layer="kernel_page"),
              ev(1_999 * MS, "alloc", 0x8001, 64, 6, layer="kernel_page"), ev(2_001 * MS, "free", 0x8001, layer="kernel_page")]
    events = concat_events(sweep_events(), events_frame(churn))
    path = write_with_samples(tmp_path / "sweep.memprof", events, sweep_samples())
    whole, folded = analyse(path), analyse(path, max_memory=1, regions=True)
    assert folded.fold.dropped_count == {"native_heap": 4 * 19}, folded.fold.dropped_count
    a, b = reporters.to_json(whole.regions()), reporters.to_json(folded.regions())
    assert "a region's start or peak" in b.pop("notes")[-1]
    a.pop("notes")
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    assert [[p["peak_bytes"] for p in r["peaks"] if p["layer"] == "native_heap"] for r in b["regions"]] == [[8]] * 4
    assert [[p["peak_bytes"] for p in r["peaks"] if p["layer"] == "kernel_page"] for r in b["regions"]] == \
        [[128], [64], [0], [0]]
    with pytest.raises(FoldedRecordingError):
        analyse(path, max_memory=1).regions()  # a fold not asked to keep the regions


@pytest.mark.parametrize("fmt", ["pprof", "speedscope", "folded"])
def test_exports_of_live_chains_read_a_folded_recording_as_the_whole(tmp_path, fmt):
    """speedscope and folded read the chains live at the end and at each layer's peak, which
    every fold keeps; pprof also what each chain allocated in all, which the fold counts for
    what it dropped (400 of chain 1's 450 allocations here): the same bytes as the whole's."""
    import gzip
    from click.testing import CliRunner
    from memprof.cli.main import cli
    path = _churn_recording(tmp_path / "churn.memprof")
    outputs = []
    for extra in ((), ("--max-memory", "1")):
        out = tmp_path / f"out{len(outputs)}"
        result = CliRunner().invoke(cli, ["export", str(path), "--format", fmt, "-o", str(out), *extra])
        assert result.exit_code == 0, result.output
        outputs.append(gzip.decompress(out.read_bytes()) if fmt == "pprof" else out.read_bytes())
    assert outputs[0] == outputs[1] and len(outputs[0]) > 0


def test_exports_of_every_event_refuse_a_folded_recording(tmp_path):
    from click.testing import CliRunner
    from memprof.cli.main import cli
    path = _churn_recording(tmp_path / "churn.memprof")
    for fmt in ("csv", "parquet"):
        result = CliRunner().invoke(cli, ["export", str(path), "--format", fmt, "-o", str(tmp_path / fmt),
                                          "--max-memory", "1"])
        assert result.exit_code == ExitCode.USAGE and "needs every event" in result.output, (fmt, result.output)
        assert f"{path}/events/*.parquet" in " ".join(result.output.split()).replace("/ ", "/")
        assert not (tmp_path / fmt).exists()


def _counter_points(trace: dict) -> dict[str, list[tuple[float, int]]]:
    """A Chrome trace's layer counters: track name -> [(µs, live bytes)] in time order."""
    tracks: dict = {}
    for event in trace["traceEvents"]:
        if event["ph"] == "C" and "live_bytes" in event["args"]:
            tracks.setdefault(event["name"], []).append((event["ts"], event["args"]["live_bytes"]))
    return tracks


def test_trace_exports_of_a_fold_draw_each_curve_through_the_moments_it_kept(tmp_path):
    """chrome-trace (perfetto takes the same timeline) of the churn recording, folded: each
    layer's counter has a point at each moment the fold kept, each the whole curve's value
    there, the peak among them, and a warning says the churn between them is not drawn."""
    from click.testing import CliRunner
    from memprof.cli.main import cli
    path = _churn_recording(tmp_path / "churn.memprof")
    traces, said = [], []
    for extra in ((), ("--max-memory", "1")):
        out = tmp_path / f"trace{len(traces)}.json"
        result = CliRunner().invoke(cli, ["export", str(path), "--format", "chrome-trace", "-o", str(out), *extra])
        assert result.exit_code == 0, result.output
        traces.append(_counter_points(json.loads(out.read_text())))
        said.append(" ".join(result.output.split()))
    (name, whole), = traces[0].items()
    folded = traces[1][name]
    assert len(folded) < len(whole) and "moments the fold kept" in said[1] and "moments" not in said[0]
    times = [t for t, _ in whole]
    for t, live in folded:  # the whole's step curve read at each folded point
        assert live == whole[np.searchsorted(times, t, side="right") - 1][1]
    assert max(v for _, v in folded) == max(v for _, v in whole) == (1 << 20) + 5 * 4096 + 50 * 10
    for extra in ((), ("--max-memory", "1")):  # perfetto builds from the same timeline
        result = CliRunner().invoke(cli, ["export", str(path), "--format", "perfetto", "-o",
                                          str(tmp_path / f"t{len(extra)}.pftrace"), *extra])
        assert result.exit_code == 0, result.output


def test_a_time_asked_for_keeps_what_was_live_then(tmp_path):
    """`report top --at TIME` on a folded recording: the fold keeps what was live at TIME
    (step 3's churn, which it drops otherwise), and the view is the whole recording's."""
    path = _churn_recording(tmp_path / "churn.memprof")
    at = 3 * S + S // 3  # step 3's 50 churn allocations are live, as are chain 3's first three
    whole, folded = analyse(path), analyse(path, max_memory=1, keep_at=(at,))
    assert folded.fold.kept_at_ns == (at,) and folded.fold.kept == 50 + 1 + 9 + 50
    a, b = reporters.to_json(whole.attribution(at=at)), reporters.to_json(folded.attribution(at=at))
    assert b.pop("notes")[-1].startswith("folded:") and "+3.33s" in folded.fold.note
    a.pop("notes")
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    assert {row["stack_id"]: row["live_bytes"] for row in b["layers"][0]["rows"]} == {1: 500, 3: 3 * 4096}
    with pytest.raises(FoldedRecordingError):
        folded.attribution(at=at + S)  # a time it was not asked to keep


def test_windows_asked_for_keep_what_the_leak_trends_read(tmp_path):
    """`report leaks --window` on a folded recording without step marks: the fold keeps what
    was live at the end of each window asked for, so the growth found is the whole's."""
    rows = [ev(k * S // 2 + S // 8, "alloc", 0x10_0000 + k, 8192, 5) for k in range(40)]  # grows: never freed
    # Churn live across each half-second boundary only (the default windows, 20 s / 32, mostly miss it).
    rows += [ev(k * S // 2 - S // 20 + i, "alloc", 0x100 + i, 10, 1) for k in range(1, 40) for i in range(20)]
    rows += [ev(k * S // 2 + S // 20 + i, "free", 0x100 + i) for k in range(1, 40) for i in range(20)]
    path = write_recording(tmp_path / "w.memprof", events_frame(sorted(rows, key=lambda r: r["ts_ns"])), end_ns=20 * S)
    window = S // 2
    whole, folded = analyse(path), analyse(path, max_memory=1, window_ns=window)
    a = reporters.to_json(whole.leaks(window_ns=window, top=None))
    b = reporters.to_json(folded.leaks(window_ns=window, top=None))
    a.pop("notes"), b.pop("notes")
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    grows = [f for f in b["findings"] if f["kind"] == "grows_per_step"]
    assert [(f["live_count"], round(f["slope_bytes_per_step"])) for f in grows] == [(40, 8192)]
    assert folded.fold.window_ns == window and "native_heap" not in folded.fold.dropped_count  # all at a boundary
    with pytest.raises(FoldedRecordingError):
        folded.leaks(window_ns=S)  # windows it was not asked to keep


def _growing_without_steps(path):
    """No step marks: 40 blocks of 8192 B (chain 5) made half a second apart and never freed,
    and churn of 20 × 10 B (chain 1) live across each half-second."""
    rows = [ev(k * S // 2 + S // 8, "alloc", 0x10_0000 + k, 8192, 5) for k in range(40)]
    rows += [ev(k * S // 2 - S // 20 + i, "alloc", 0x100 + i, 10, 1) for k in range(1, 40) for i in range(20)]
    rows += [ev(k * S // 2 + S // 20 + i, "free", 0x100 + i) for k in range(1, 40) for i in range(20)]
    return write_recording(path, events_frame(sorted(rows, key=lambda r: r["ts_ns"])), end_ns=20 * S)


def test_growth_of_a_folded_recording_by_step_is_the_whole_ones(tmp_path):
    path = _churn_recording(tmp_path / "churn.memprof")
    whole, folded = analyse(path), analyse(path, max_memory=1)
    a, b = reporters.to_json(whole.growth()), reporters.to_json(folded.growth())
    a.pop("notes"), b.pop("notes")
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    chain = [s for s in b["series"] if s["chain"] and s["stack_id"] == 3]
    assert chain and round(chain[0]["linear"]["b"]) == 4096  # chain 3 keeps 4096 B a step


def test_growth_of_a_folded_recording_without_steps_reads_the_window_ends_it_kept(tmp_path):
    from memprof.analysis.growth import growth
    from memprof.analysis.views import GrowthView
    path = _growing_without_steps(tmp_path / "w.memprof")
    whole, folded = analyse(path), analyse(path, max_memory=1)
    view = folded.growth()
    times = np.asarray([int(round(x * 1e9)) for x in view.result.series[0].x])  # seconds since the start (0)
    assert len(times) == 32 and view.result.notes[-1].startswith("folded: judged at the 32 window ends")
    expected = growth(whole.lifetimes, whole.events, whole.rec.samples, origin_ns=0, canonical_stack=whole.canonical,
                      times_ns=times)
    a = reporters.to_json(GrowthView(expected, folded.about, view.chains))
    b = reporters.to_json(view)
    a.pop("notes"), b.pop("notes")
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    chain = [s for s in view.result.series if s.chain and s.stack_id == 5]
    assert chain and chain[0].linear.b == pytest.approx(16384, rel=0.05)  # 8192 B every half second


def test_report_top_at_a_time_reads_a_folded_recording(tmp_path):
    from click.testing import CliRunner
    from memprof.cli.main import cli
    path = _churn_recording(tmp_path / "churn.memprof")
    args = ["report", "top", str(path), "--at", "3.333333333s", "--format", "json"]
    whole = CliRunner().invoke(cli, args, catch_exceptions=False)
    folded = CliRunner().invoke(cli, [*args, "--max-memory", "1"], catch_exceptions=False)
    assert whole.exit_code == folded.exit_code == 0, folded.output
    rows = lambda out: json.loads(out)["layers"][0]["rows"]  # noqa: E731
    assert rows(folded.stdout) == rows(whole.stdout) and sum(r["live_bytes"] for r in rows(folded.stdout)) == 500 + 3 * 4096


def test_a_folded_recording_ends_what_an_exec_left_as_the_whole_does(tmp_path):
    """The fold streams allocation rows only; the exec mark, read with the other rows, still
    ends what the old image held (three blocks here), so the views match the whole's."""
    rows = [dict(ts_ns=k * S, action="mark", category="step", step=k, pid=100) for k in range(1, 11)]
    rows += [ev(S // 10 + i, "alloc", 0x500 + i, 768, 4) for i in range(3)]  # the image before the exec
    rows += [dict(ts_ns=S // 2, action="mark", category="exec", pid=100)]
    rows += [ev(k * S + S // 4, "alloc", 0x10_0000 * k, 4096, 3) for k in range(1, 10)]
    path = write_recording(tmp_path / "exec.memprof", events_frame(sorted(rows, key=lambda r: r["ts_ns"])),
                           end_ns=11 * S)
    whole, folded = analyse(path), analyse(path, max_memory=1)
    assert folded.fold is not None
    for view in (lambda a: a.leaks(top=None), lambda a: a.layers(), lambda a: a.attribution(at="end")):
        a, b = reporters.to_json(view(whole)), reporters.to_json(view(folded))
        a.pop("notes"), b.pop("notes")
        assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    assert reporters.to_json(folded.attribution(at="end"))["layers"][0]["live_bytes"] == 9 * 4096


def test_timeline_of_a_folded_recording_keeps_its_marks(tmp_path):
    folded = analyse(known_recording(tmp_path / "k.memprof"), max_memory=1)
    assert set(folded.events["action"].astype(str)) == {"mark"} and len(folded.events) == 21


def test_a_chains_module_counts_the_allocations_the_fold_dropped(tmp_path):
    """Chain 1 allocates ten times inside fc1 (each freed before the next step: dropped but the
    one at the peak) and keeps one allocation made outside any module: its module is fc1,
    folded or not (without the tally of what was dropped it would be one fc1 against one none)."""
    rows = [dict(ts_ns=k * S, action="mark", category="step", step=k) for k in range(1, 11)]
    for k in range(1, 11):
        rows += [dict(ts_ns=k * S + 100, action="mark", category="module:fc1"),
                 ev(k * S + 200, "alloc", 0x100, 64, 1), ev(k * S + 300, "free", 0x100),
                 dict(ts_ns=k * S + 400, action="mark", category="module-none")]
    rows.append(ev(10 * S + 500, "alloc", 0x200, 64, 1))  # held at the end, in no module
    path = write_recording(tmp_path / "m.memprof", events_frame(rows, layer="torch_cpu"), end_ns=12 * S)
    whole, folded = analyse(path), analyse(path, max_memory=1)
    assert folded.fold.dropped_count == {"torch_cpu": 9}  # the first is live at the layer's peak: kept
    module = lambda a: [f.module for f in a.leaks(top=None, min_age_ns=0).result.findings]  # noqa: E731
    assert module(folded) == module(whole) == ["fc1"]
    # `report modules` counts what the fold dropped in each module's bytes allocated.
    a, b = reporters.to_json(whole.modules(top=None)), reporters.to_json(folded.modules(top=None))
    a.pop("notes"), b.pop("notes")
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    fc1 = [m for layer in b["layers"] for m in layer["modules"] if m["module"] == "fc1"]
    assert [(m["calls"], m["allocated_count"], m["allocated_bytes"]) for m in fc1] == [(10, 10, 640)]


def _outcomes(result) -> list[tuple]:
    """Every rule's verdict, whole: its advice (all of it) or why it said nothing."""
    return [(o.rule.id, o.verdict.why_not, [(a.title, a.evidence, a.change, a.saving, a.saving_bytes, a.chains,
                                              a.modules, a.numbers) for a in o.verdict.advice])
            for o in result.outcomes]


@pytest.mark.parametrize("kept", [True, False], ids=["graph_kept", "control"])
def test_advice_on_a_fold_that_kept_what_its_rules_read_is_the_wholes(tmp_path, kept):
    """The autograd training recording (a graph kept per step, and its control freed each
    step, with a 1 MiB temporary per step the fold drops): every rule says the same, folded."""
    from tests.training_factories import write
    from tests.unit.test_advice_autograd import CHAINS, PER_STEP, STEPS, training
    rows, end = training(kept=kept)
    path = write(tmp_path / "train.memprof", rows, CHAINS, end)
    whole, folded = analyse(path), analyse(path, max_memory=1, advice=True)
    assert folded.fold.advice and sum(folded.fold.dropped_count.values()) >= STEPS - 2  # the temporaries
    assert _outcomes(folded.advice().result) == _outcomes(whole.advice().result)
    given = [a for a in whole.advice().result.advice if a.rule == "autograd-graph-kept"]
    assert [round(a.numbers["growth_bytes_per_step"]) for a in given] == ([PER_STEP] if kept else [])
    assert folded.summary().result.advice == whole.summary().result.advice


def test_a_rule_whose_view_a_fold_cannot_give_says_so(tmp_path):
    """A rule whose view refuses the fold is silent with the reason, and the others judge."""
    from memprof.analysis.advice import advise
    from memprof.analysis.advice.model import Rule

    # A view the fold refuses (as `report growth` refuses one that kept no window ends to fit).
    odd = Rule(id="odd", title="", trigger="", evidence="", advice="", saving="", thresholds=(),
               check=lambda facts: facts.every_event("`report growth`"))
    folded = analyse(known_recording(tmp_path / "k.memprof"), max_memory=1, advice=True)
    [outcome] = advise(folded, rules=(odd,)).outcomes
    assert outcome.verdict.why_not == "not judged: this recording was folded, and `report growth` needs every event"
    assert len(advise(folded).outcomes) == len(advise(analyse(tmp_path / "k.memprof")).outcomes)


def test_html_of_a_fold_draws_each_curve_through_the_moments_it_kept(tmp_path):
    """The churn recording's page, folded: its curve has a point at each moment the fold kept
    (the steps, the end, the peak), each the whole curve's value there, the peak among them;
    the churn between steps is not drawn, and a warning says so."""
    path = _churn_recording(tmp_path / "churn.memprof")
    whole, folded = analyse(path), analyse(path, max_memory=1, advice=True)
    [full] = [s for s in whole.html().data.series if s.kind == "layer"]
    [drawn] = [s for s in folded.html().data.series if s.kind == "layer"]
    steps = [k * S for k in range(2, 11)]  # step 1 comes before the first allocation: the curve starts after it
    assert set(steps) <= set(drawn.times_ns.tolist()) <= set(folded.fold.instants_ns)
    at = np.searchsorted(full.times_ns, drawn.times_ns, side="right") - 1
    assert drawn.values.tolist() == full.values[at].tolist()
    assert (drawn.peak, drawn.peak_ns) == (full.peak, full.peak_ns) == ((1 << 20) + 5 * 4096 + 50 * 10, full.peak_ns)
    assert drawn.values[drawn.times_ns.tolist().index(9 * S)] == 8 * 4096  # steps 1..8's kept 4096 B
    assert len(drawn.times_ns) < len(full.times_ns)  # 400 churn allocations and frees are not drawn
    assert any(w.startswith("folded: each layer's curve") for w in folded.html().data.warnings)
    assert not any(w.startswith("folded:") for w in whole.html().data.warnings)


def test_every_advice_and_page_test_passes_on_its_recordings_folded(tmp_path):
    """Each advice rule's tests (advice with its exact numbers, and the controls that give
    none) and the page's tests, run with every recording folded (tests/fold_probe.py): a
    rule that read what a fold drops would give other numbers, or advice where none is due."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    repo = Path(__file__).resolve().parents[2]
    tests = sorted(str(p.relative_to(repo)) for p in (repo / "tests" / "unit").glob("test_advice_*.py"))
    counts = tmp_path / "counts.json"
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.fold_probe",
                          "--basetemp", str(tmp_path / "t"), *tests, "tests/unit/test_html.py"],
                         cwd=repo, env={**os.environ, "MEMPROF_FOLD_PROBE_OUT": str(counts)},
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:]
    folded = json.loads(counts.read_text())
    assert folded.get("whole", 0) == 0 and folded["folded"] >= 70, folded


def test_a_fold_for_advice_keeps_what_a_worker_held_at_its_first_and_last_sample(tmp_path):
    """The dataloader rule weighs a worker's heap at its first and last PSS sample: a fold for
    advice keeps what was live then. Two workers whose PSS grows (36 and 18 MiB), no step
    marks; worker 1 holds 8 MiB from 9.95 s to 10.05 s, over its last sample (10 s), so its
    heap grew 8 MiB (> 10 % of 36 MiB): not copy-on-read, whole. A fold that dropped the
    8 MiB (born and freed between two kept moments) would advise on it."""
    from memprof.analysis.advice import dataloader
    from tests.factories import ev as row
    from tests.unit.test_advice_dataloader import ROOT, W1, W2, churn, record, trigger_samples
    MiB = 1 << 20
    held = [row(9 * S + 95 * S // 100, "alloc", 0x7700_0000, 8 * MiB, 6, layer="torch_cpu", pid=W1, tid=W1),
            row(10 * S + 5 * S // 100, "free", 0x7700_0000, layer="torch_cpu", pid=W1, tid=W1),
            # The layer's peak elsewhere (a fold keeps each peak): 64 MiB in the root for 0.1 s.
            row(5 * S + S // 10, "alloc", 0x7800_0000, 64 * MiB, 6, layer="torch_cpu", pid=ROOT, tid=ROOT),
            row(5 * S + S // 5, "free", 0x7800_0000, layer="torch_cpu", pid=ROOT, tid=ROOT)]
    whole = record(tmp_path, churn(W1) + churn(W2) + churn(ROOT) + held, trigger_samples())
    path = whole.rec.path

    def workers(analysed) -> list[int]:
        return [w["pid"] for a in dataloader.check(analysed).advice for w in a.numbers["workers"]]
    assert workers(whole) == [W2]
    assert workers(analyse(path, max_memory=1, advice=True)) == [W2]
    assert workers(analyse(path, max_memory=1)) == [W1, W2]  # a fold not asked for advice dropped the 8 MiB


@pytest.mark.parametrize("batch_rows", [None, 7], ids=["one_batch", "stretches_across_batches"])
def test_curves_of_a_fold_asked_for_them_keep_the_highest_point_between_two_kept_moments(tmp_path, monkeypatch,
                                                                                           batch_rows):
    """analyse(curves=True): between two moments the fold kept, the curve also goes through
    the highest and the lowest point there (each step's churn of 50 × 10 B on top of chain
    3's 4096 B a step): every drawn point is the whole curve's value at its time, and between
    each two moments kept the drawn curve reaches the whole's highest and lowest, also where
    the pairing's batches (7 rows) cut each stretch into several."""
    import functools

    import memprof.bounded
    from memprof.bounded import CURVE_STRETCHES
    if batch_rows:
        monkeypatch.setattr(memprof.bounded, "paired_batches",
                            functools.partial(paired_batches, batch_rows=batch_rows))
    path = _churn_recording(tmp_path / "churn.memprof")
    whole, folded = analyse(path), analyse(path, max_memory=1, advice=True, curves=True)
    [full] = [s for s in whole.html().data.series if s.kind == "layer"]
    [drawn] = [s for s in folded.html().data.series if s.kind == "layer"]
    at = np.searchsorted(full.times_ns, drawn.times_ns, side="right") - 1
    assert drawn.values.tolist() == full.values[at].tolist()
    # The moments kept before the pass (the peak, found in it, is the highest of its stretch).
    edges = np.setdiff1d(np.asarray(folded.fold.instants_ns), [full.peak_ns])
    for low, high in zip(edges[:-1], edges[1:]):
        inside = lambda s: s.values[(s.times_ns > low) & (s.times_ns < high)]  # noqa: E731
        assert inside(drawn).max(initial=0) == inside(full).max(initial=0), (low, high)
        assert inside(drawn).min(initial=1 << 40) == inside(full).min(initial=1 << 40), (low, high)
    tops = {int(v) for v in drawn.values if v % 4096 == 500 and v < 1 << 20}  # each step's churn at its height
    assert tops == {k * 4096 + 500 for k in range(1, 10)}
    [trace] = folded.fold.curve_extremes.values()
    # A highest and a lowest point per stretch at most: between moments kept, and on the even grid.
    assert len(trace[0]) <= 2 * (len(folded.fold.instants_ns) + CURVE_STRETCHES + 2)
