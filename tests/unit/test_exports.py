"""`memprof export`: every format read back by a real reader (Perfetto's and pprof's protobuf
classes, speedscope's JSON schema, json, pyarrow) with known bytes, counts and times."""
from __future__ import annotations

import gzip
import json
from contextlib import contextmanager
from pathlib import Path

import jsonschema
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from memprof.analysis.chains import chain_frame_ids
from memprof.analysis.leaks import chain_frames
from memprof.analysis.lifetimes import pair_lifetimes
from memprof.analysis.series import chain_totals, downsample_max, instants, layer_series, sample_series
from memprof.cli import console
from memprof.cli.export import _RENDERERS
from memprof.cli.main import cli
from memprof.report.exports.pprof import SAMPLE_TYPES, profile_class
from tests.export_factories import END_NS, MS, MiB, known_events, write_recording
from tests.factories import ev, events_frame, stacks_frames

SCHEMA = json.loads((Path(__file__).resolve().parents[1] / "data" / "speedscope-file-format-schema.json").read_text())
S = 1000 * MS  # one second in ns


def invoke(*args):
    result = CliRunner().invoke(cli, list(map(str, args)), catch_exceptions=False, terminal_width=100)
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def recording(tmp_path) -> Path:
    return write_recording(tmp_path / "run.memprof")


def export(recording: Path, fmt: str, *extra) -> Path:
    code, _, err = invoke("export", recording, "--format", fmt, *extra)
    assert code == 0, err
    return Path(err.split("wrote ", 1)[1].split(" (", 1)[0])


# --- analysis: series ---------------------------------------------------------------------

def test_downsample_keeps_the_highest_point_of_each_bucket_and_the_last_point():
    times = np.arange(1001, dtype=np.int64) * 10
    values = np.ones(1001, dtype=np.int64)
    values[537], values[12], values[1000] = 1_000_000, 7, 3
    t, v = downsample_max(times, values, max_points=11)  # 10 buckets of 100 points, then the last
    assert len(t) == 11 and (t[-1], v[-1]) == (10_000, 3)
    assert (t[5], v[5]) == (5370, 1_000_000) and (t[0], v[0]) == (120, 7)
    assert (t[1], v[1]) == (1000, 1)  # tied: the bucket's earliest point
    assert np.all(np.diff(t) > 0)


def test_downsample_leaves_a_short_curve_and_refuses_fewer_than_two_points():
    t, v = downsample_max(np.array([1, 2, 3]), np.array([5, 1, 4]), max_points=3)
    assert t.tolist() == [1, 2, 3] and v.tolist() == [5, 1, 4]
    with pytest.raises(ValueError):
        downsample_max(np.array([1, 2, 3]), np.array([5, 1, 4]), max_points=1)


def test_layer_series_one_curve_per_layer_and_device_with_weights():
    events = events_frame([
        ev(10, "alloc", 0x1, 100, 1, device="cuda:1", layer="cuda_block"),
        ev(20, "alloc", 0x2, 1000, 1, device="cuda:0", layer="cuda_block", weight=3.0),
        ev(30, "alloc", 0x3, 64, 1, layer="kernel_slab"),
        ev(40, "free", 0x2, device="cuda:0", layer="cuda_block"),
    ])
    series = layer_series(pair_lifetimes(events))
    assert [(s.name, s.device, s.unit) for s in series] == [
        ("cuda_block", "cuda:0", "bytes"), ("cuda_block", "cuda:1", "bytes"), ("kernel_slab", "cpu", "bytes")]
    assert series[0].times_ns.tolist() == [20, 40] and series[0].values.tolist() == [3000, 0]
    assert series[1].values.tolist() == [100] and series[2].values.tolist() == [64]


def test_sample_series_by_metric_and_device_in_time_order_without_missing_values():
    samples = pd.DataFrame({"ts_ns": [30, 10, 20, 10, 40], "metric": ["rss_bytes"] * 3 + ["gpu_util", "rss_bytes"],
                            "device": [None, None, None, "cuda:0", None], "value": [3.0, 1.0, 2.0, 50.0, np.nan]})
    series = sample_series(samples)
    assert [(s.name, s.device, s.unit) for s in series] == [("gpu_util", "cuda:0", ""), ("rss_bytes", "", "bytes")]
    assert series[1].times_ns.tolist() == [10, 20, 30] and series[1].values.tolist() == [1.0, 2.0, 3.0]
    assert sample_series(None) == [] and sample_series(samples.iloc[:0]) == []


def test_instants_are_ooms_and_step_marks_only():
    frame = instants(known_events())
    assert frame["kind"].tolist() == ["step", "step", "oom"]
    assert frame["ts_ns"].tolist() == [5 * S, 15 * S, 25 * S] and frame["step"].tolist() == [1, 2, pd.NA]
    oom = frame.iloc[2]
    assert (oom.layer, oom.device, oom.size_bytes, oom.pid, oom.tid) == ("cuda_block", "cuda:0", 8 * MiB, 100, 101)


def test_chain_totals_in_use_at_the_end_and_all_allocations_weighted():
    events = events_frame([
        ev(10, "alloc", 0x1, 100, 5, weight=4.0), ev(20, "alloc", 0x2, 50, 5),
        ev(30, "free", 0x1), ev(40, "alloc", 0x3, 8, None, layer="kernel_slab"),
    ])
    totals = chain_totals(pair_lifetimes(events), end_ns=35)
    assert totals["layer"].tolist() == ["native_heap", "kernel_slab"]
    heap = totals.iloc[0]
    assert (heap.stack_id, heap.inuse_bytes, heap.inuse_count, heap.alloc_bytes, heap.alloc_count) == (5, 50, 1, 450, 5)
    slab = totals.iloc[1]  # allocated after the end: counted in alloc_*, not in use
    assert pd.isna(slab.stack_id) and (slab.inuse_bytes, slab.alloc_bytes, slab.alloc_count) == (0, 8, 1)


# --- perfetto ---------------------------------------------------------------------------------

def _trace(path: Path) -> pb.Trace:
    trace = pb.Trace()
    trace.ParseFromString(path.read_bytes())
    return trace


def _counter_values(trace: pb.Trace) -> dict[str, list]:
    names = {p.track_descriptor.uuid: p.track_descriptor.name for p in trace.packet
             if p.HasField("track_descriptor") and p.track_descriptor.HasField("counter")}
    values = {name: [] for name in names.values()}
    for p in trace.packet:
        if p.HasField("track_event") and p.track_event.type == pb.TrackEvent.TYPE_COUNTER:
            e = p.track_event
            value = e.counter_value if e.HasField("counter_value") else e.double_counter_value
            values[names[e.track_uuid]].append((p.timestamp, value))
    return values


def test_perfetto_counter_tracks_per_layer_and_device_and_samples(recording):
    trace = _trace(export(recording, "perfetto"))
    assert _counter_values(trace) == {
        "cuda_block live bytes (cuda:0)": [(10 * S, MiB), (20 * S, 3 * MiB), (30 * S, 2 * MiB)],
        "native_heap live bytes (cpu)": [(1 * S, 4096), (2 * S, 8192), (3 * S, 12288), (4 * S, 12388),
                                         (4500 * MS, 12288)],
        "nvml_used_bytes (cuda:0)": [(2 * S, 5e8)],
        "rss_bytes": [(1 * S, 1e6), (2 * S, 3e6), (3 * S, 2e6)],
    }
    tracks = [p.track_descriptor for p in trace.packet if p.HasField("track_descriptor")]
    process = next(t for t in tracks if t.HasField("process"))
    assert (process.process.pid, process.process.process_name, list(process.process.cmdline)) == (
        100, "python3", ["/usr/bin/python3.11"])
    counters = [t for t in tracks if t.HasField("counter")]
    assert {t.parent_uuid for t in counters} == {process.uuid}
    assert all(t.counter.unit == pb.CounterDescriptor.UNIT_SIZE_BYTES for t in counters)
    timed = [p for p in trace.packet if p.HasField("track_event")]
    assert {p.timestamp_clock_id for p in timed} == {3} and {p.trusted_packet_sequence_id for p in trace.packet} == {1}
    assert trace.packet[0].clock_snapshot.primary_trace_clock == pb.BUILTIN_CLOCK_MONOTONIC


def test_perfetto_instants_for_the_oom_and_step_marks_on_named_threads(recording):
    trace = _trace(export(recording, "perfetto"))
    threads = {p.track_descriptor.uuid: p.track_descriptor.thread for p in trace.packet
               if p.HasField("track_descriptor") and p.track_descriptor.HasField("thread")}
    assert sorted((t.pid, t.tid, t.thread_name) for t in threads.values()) == [
        (100, 100, "python3"), (100, 101, "python3")]
    marks = [(p.timestamp, p.track_event.name, threads[p.track_event.track_uuid].tid, p.track_event)
             for p in trace.packet if p.HasField("track_event") and p.track_event.type == pb.TrackEvent.TYPE_INSTANT]
    assert [m[:3] for m in marks] == [(5 * S, "step 1", 100), (15 * S, "step 2", 100), (25 * S, "OOM", 101)]
    annotations = {a.name: a.int_value or a.string_value for a in marks[2][3].debug_annotations}
    assert annotations == {"layer": "cuda_block", "device": "cuda:0", "size_bytes": 8 * MiB}


# --- chrome trace ------------------------------------------------------------------------------

def test_chrome_trace_counters_instants_and_names_in_microseconds(recording):
    events = json.loads(export(recording, "chrome-trace").read_text())["traceEvents"]
    gpu = [(e["ts"], e["args"]["live_bytes"]) for e in events if e["ph"] == "C" and e["name"].startswith("cuda_block")]
    assert gpu == [(10e6, MiB), (20e6, 3 * MiB), (30e6, 2 * MiB)]
    assert {e["pid"] for e in events if e["ph"] == "C"} == {100}
    instants_ = [(e["ts"], e["name"], e["tid"], e["s"]) for e in events if e["ph"] == "i"]
    assert instants_ == [(5e6, "step 1", 100, "t"), (15e6, "step 2", 100, "t"), (25e6, "OOM", 101, "t")]
    oom = next(e for e in events if e["ph"] == "i" and e["name"] == "OOM")
    assert oom["args"] == {"layer": "cuda_block", "device": "cuda:0", "size_bytes": 8 * MiB}
    names = sorted((e["name"], e["pid"], e["tid"], e["args"]["name"]) for e in events if e["ph"] == "M")
    assert names == [("process_name", 100, 0, "python3"), ("thread_name", 100, 100, "python3"),
                     ("thread_name", 100, 101, "python3")]


def test_max_points_keeps_each_tracks_peak_and_its_last_point(recording):
    events = json.loads(export(recording, "chrome-trace", "--max-points", "2").read_text())["traceEvents"]
    heap = [(e["ts"], e["args"]["live_bytes"]) for e in events
            if e["ph"] == "C" and e["name"].startswith("native_heap")]
    assert heap == [(4e6, 12388), (4.5e6, 12288)]


# --- speedscope --------------------------------------------------------------------------------

def test_speedscope_validates_against_the_schema_with_end_and_peak_profiles(recording):
    document = json.loads(export(recording, "speedscope").read_text())
    jsonschema.Draft6Validator(SCHEMA).validate(document)
    frames = [f["name"] for f in document["shared"]["frames"]]
    assert len(frames) == len(set((f["name"], f.get("file"), f.get("line")) for f in document["shared"]["frames"]))
    end, peak = document["profiles"]

    def stacks(profile):
        return sorted(([frames[i] for i in sample], w) for sample, w in zip(profile["samples"], profile["weights"]))
    train_step = ["native_heap", "[py] train_step (train.py:42)", "[n] malloc (libc.so.6)"]
    assert end["name"] == "live bytes at the end" and end["unit"] == "bytes"
    assert stacks(end) == [(["cuda_block", "[no stack]"], 2 * MiB), (train_step, 12288)]
    assert end["endValue"] == 2 * MiB + 12288 and end["startValue"] == 0
    assert stacks(peak) == [
        (["cuda_block", "[no stack]"], 2 * MiB),
        (["cuda_block", "[py] cache_batch (train.py:10)", "[n] cudaMalloc (libcudart.so)"], MiB),
        (["native_heap", "[py] load (data.py:7)", "[n] malloc (libc.so.6)"], 100), (train_step, 12288)]
    step_frame = document["shared"]["frames"][frames.index("[py] train_step (train.py:42)")]
    assert step_frame == {"name": "[py] train_step (train.py:42)", "file": "train.py", "line": 42}


# --- pprof -------------------------------------------------------------------------------------

def _profile(path: Path):
    profile = profile_class()()
    profile.ParseFromString(gzip.decompress(path.read_bytes()))
    return profile


def test_pprof_values_per_layer_and_chain_with_a_consistent_string_table(recording):
    profile = _profile(export(recording, "pprof"))
    strings = list(profile.string_table)
    assert strings[0] == "" and len(strings) == len(set(strings))
    assert [(strings[t.type], strings[t.unit]) for t in profile.sample_type] == list(SAMPLE_TYPES)
    assert strings[profile.default_sample_type] == "inuse_space" and profile.time_nanos == 1_700_000_000 * 10**9
    assert profile.duration_nanos == END_NS
    functions = {f.id: f for f in profile.function}
    locations = {loc.id: loc for loc in profile.location}

    def names(sample):
        return [strings[functions[locations[i].line[0].function_id].name] for i in sample.location_id]
    got = sorted((names(s), list(s.value), strings[s.label[0].str]) for s in profile.sample)
    assert got == sorted([
        (["malloc", "train_step", "native_heap"], [3, 12288, 3, 12288], "native_heap"),
        (["malloc", "load", "native_heap"], [1, 100, 0, 0], "native_heap"),
        (["cudaMalloc", "cache_batch", "cuda_block"], [1, MiB, 0, 0], "cuda_block"),
        (["[no stack]", "cuda_block"], [1, 2 * MiB, 1, 2 * MiB], "cuda_block"),
    ])


def test_pprof_deduplicates_locations_functions_and_mappings(recording):
    profile = _profile(export(recording, "pprof"))
    strings = list(profile.string_table)
    assert sorted(strings[m.filename] for m in profile.mapping) == ["libc.so.6", "libcudart.so"]
    function_keys = [(f.name, f.system_name, f.filename) for f in profile.function]
    assert len(function_keys) == len(set(function_keys)) == 8  # 5 functions, 2 layers, [no stack]
    assert [f.id for f in profile.function] == list(range(1, 9))
    assert len({loc.id for loc in profile.location}) == len(profile.location) == 8
    function_names = {f.id: strings[f.name] for f in profile.function}
    train = next(loc for loc in profile.location if function_names[loc.line[0].function_id] == "train_step")
    assert train.line[0].line == 42 and train.mapping_id == 0  # a Python frame: no library mapping
    indices = [i for f in profile.function for i in (f.name, f.system_name, f.filename)]
    assert max(indices) < len(strings)


EVAL = ("native", "_PyEval_EvalFrameDefault", "libpython3.11.so", None, None)
MIXED_CHAINS = {  # innermost first; frame ids are given in order, so a later stack never shares one
    5: [("native", "malloc", "libc.so.6", None, None), EVAL, ("python", "step", None, "train.py", 3), EVAL],
    6: [("kernel", "kmalloc", "vmlinux", None, None), EVAL],  # no Python frame: the eval loop stays
    9: [("python", "main", None, "train.py", 1)],
}


@pytest.mark.parametrize("native_frames", ["merged", "all"])
def test_chain_frame_ids_are_chain_frames_as_two_columns(native_frames):
    stacks, frames = stacks_frames(MIXED_CHAINS)
    rows = chain_frame_ids(stacks, frames, pd.array([9, None, 5, 6, 404, 5], dtype="Int64"), native_frames)
    names = dict(zip(frames["frame_id"], frames["function"]))
    got = {int(sid): [names[f] for f in group["frame_id"]] for sid, group in rows.groupby("stack_id", sort=True)}
    expected = chain_frames(stacks, frames, [9, 5, 6, 404], native_frames)
    assert got == {sid: [f["function"] for f in chain] for sid, chain in expected.items() if chain}
    assert rows["stack_id"].tolist() == sorted(rows["stack_id"].tolist())
    merged = ["malloc", "step"] if native_frames == "merged" else ["malloc", "_PyEval_EvalFrameDefault", "step",
                                                                   "_PyEval_EvalFrameDefault"]
    assert got[5] == merged and got[6] == ["kmalloc", "_PyEval_EvalFrameDefault"]


def test_pprof_merges_eval_loop_frames_like_every_other_view(tmp_path):
    events = events_frame([ev(1 * MS, "alloc", 0x10, 64, 5), ev(2 * MS, "alloc", 0x20, 32, 6, layer="kernel_slab")])
    recording = write_recording(tmp_path / "mixed.memprof", events, chains=MIXED_CHAINS)
    profile = _profile(export(recording, "pprof"))
    strings = list(profile.string_table)
    functions = {f.id: strings[f.name] for f in profile.function}
    locations = {loc.id: functions[loc.line[0].function_id] for loc in profile.location}
    got = sorted([locations[i] for i in s.location_id] for s in profile.sample)
    assert got == [["kmalloc", "_PyEval_EvalFrameDefault", "kernel_slab"], ["malloc", "step", "native_heap"]]


def test_export_progress_names_each_stage_it_runs(recording, monkeypatch):
    """The bar says what runs (issue 20 item 11: the analysis's last stage, "merging identical
    chains", was all a user saw while pprof's own work, most of the time, ran unnamed)."""
    seen = _stages(monkeypatch)
    export(recording, "pprof")
    assert seen[3:] == ["merging identical chains", "totalling the bytes each chain held at the end and allocated in all",
                        "reading the frames of 3 chains", "encoding 4 pprof samples"]


@pytest.mark.parametrize("fmt", ["perfetto", "chrome-trace", "speedscope", "pprof", "folded", "csv", "parquet"])
def test_each_format_runs_the_stages_its_bar_counts(recording, monkeypatch, fmt):
    seen = _stages(monkeypatch)
    export(recording, fmt)
    assert len(seen) == 4 + _RENDERERS[fmt][1]  # 4: the analysis's (cli/common.analysed)


def _stages(monkeypatch) -> list[str]:
    """The stage names every progress bar is given from now on, in order."""
    seen: list[str] = []

    @contextmanager
    def progress(stages: int):
        yield seen.append
    monkeypatch.setattr(console, "progress", progress)
    return seen


# --- folded ------------------------------------------------------------------------------------

def test_folded_is_what_report_chains_flame_prints(recording):
    folded = export(recording, "folded").read_text()
    code, flame, _ = invoke("report", "chains", recording, "--flame")
    assert code == 0 and folded == flame
    assert folded == ("cuda_block;[no stack] 2097152\n"
                      "native_heap;[py] train_step (train.py:42);[n] malloc (libc.so.6) 12288\n")


def test_dash_writes_a_single_file_format_to_stdout_and_refuses_a_table(recording):
    code, out, err = invoke("export", recording, "--format", "folded", "-o", "-")
    assert code == 0 and out.startswith("cuda_block;[no stack] 2097152\n") and "wrote" not in err
    code, _, err = invoke("export", recording, "--format", "csv", "-o", "-")
    assert code == 2 and "csv writes a directory of three files, not stdout" in err


# --- csv and parquet ------------------------------------------------------------------------

def test_csv_events_and_findings(recording, tmp_path):
    out = tmp_path / "tables"
    code, _, err = invoke("export", recording, "--format", "csv", "-o", out)
    assert code == 0, err
    events = pd.read_csv(out / "events.csv")
    assert len(events) == 11 and events["size_bytes"].sum() == 3 * 4096 + 100 + 3 * MiB + 8 * MiB
    assert events["action"].tolist().count("oom") == 1 and events.loc[5, "category"] == "step"
    findings = pd.read_csv(out / "findings.csv")
    assert findings[["kind", "layer", "bytes", "count"]].values.tolist() == [
        ["held_at_end", "cuda_block", 2 * MiB, 1], ["held_at_end", "native_heap", 12288, 3]]
    assert findings["chain"].tolist() == ["[no stack]", "[py] train_step (train.py:42);[n] malloc (libc.so.6)"]
    assert findings["explanation"].tolist() == ["still held when the recording stopped"] * 2


def test_parquet_keeps_categories_as_dictionaries(recording):
    out = export(recording, "parquet")
    assert out.name == "run.memprof.export"
    table = pq.read_table(out / "events.parquet")
    for name in ("layer", "action", "device", "category"):
        assert pa.types.is_dictionary(table.schema.field(name).type), name
    events = table.to_pandas()
    counts = events["layer"].value_counts()
    assert counts[counts > 0].to_dict() == {"native_heap": 5, "cuda_block": 4}
    findings = pq.read_table(out / "findings.parquet").to_pandas()
    assert findings["bytes"].tolist() == [2 * MiB, 12288] and findings["stack_id"].tolist()[1] == 2


# --- empty and bad input ------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["perfetto", "chrome-trace", "speedscope", "pprof", "folded", "csv"])
def test_an_empty_recording_gives_a_valid_empty_export_and_a_warning(tmp_path, fmt):
    recording = write_recording(tmp_path / "empty.memprof", known_events().iloc[:0], samples=False)
    code, _, err = invoke("export", recording, "--format", fmt)
    assert code == 0, err
    assert "has no events: the export holds no memory curves or chains" in err
    path = Path(err.split("wrote ", 1)[1].split(" (", 1)[0])
    if fmt == "perfetto":
        assert not any(p.HasField("track_event") for p in _trace(path).packet)
    elif fmt == "chrome-trace":
        assert [e["ph"] for e in json.loads(path.read_text())["traceEvents"]] == ["M"]
    elif fmt == "speedscope":
        document = json.loads(path.read_text())
        jsonschema.Draft6Validator(SCHEMA).validate(document)
        assert [p["samples"] for p in document["profiles"]] == [[], []]
    elif fmt == "pprof":
        profile = _profile(path)
        assert len(profile.sample) == 0 and profile.string_table[0] == ""
    elif fmt == "folded":
        assert path.read_text() == ""
    else:
        assert all(pd.read_csv(path / f"{name}.csv").empty for name in ("events", "marks", "findings"))


def test_a_missing_recording_exits_5(tmp_path):
    code, _, err = invoke("export", tmp_path / "nope.memprof", "--format", "perfetto")
    assert code == 5 and "does not exist" in err


@pytest.mark.parametrize("fmt", ["speedscope", "parquet"])
def test_an_unwritable_output_exits_1_with_one_clear_line(recording, tmp_path, fmt):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code, _, err = invoke("export", recording, "--format", fmt, "-o", blocker / "out")
    assert code == 1
    assert f"memprof: error: cannot write {blocker / 'out'}: Not a directory" in " ".join(err.split())
    assert "Traceback" not in err


def test_an_unknown_format_is_a_usage_error(recording):
    code, _, err = invoke("export", recording, "--format", "svg")
    assert code == 2 and "'svg' is not one of" in err


def test_help_lists_every_format_and_its_viewer():
    code, out, _ = invoke("export", "--help")
    assert code == 0
    start = out.index("  perfetto ")
    assert out[start:out.index("  Times are")] == GOLDEN_FORMATS


GOLDEN_FORMATS = """\
  perfetto      Perfetto trace (protobuf): live bytes per layer and device and the sampled
                RSS/GPU metrics as counter tracks, OOMs, steps and memprof.mark labels as
                instants, process and thread names.   Open in ui.perfetto.dev.
  chrome-trace  the same as Chrome trace-event JSON.  chrome://tracing, ui.perfetto.dev.
  speedscope    live bytes by chain at the end and at each layer's peak, two profiles.
                                                      www.speedscope.app.
  pprof         gzipped profile.proto: inuse_space/inuse_objects (live at the end) and
                alloc_space/alloc_objects (every allocation).
                                                      go tool pprof -http=: FILE.
  folded        folded stacks of live bytes at the end (as `report chains --flame`).
                                                      flamegraph.pl, inferno, speedscope.
  csv, parquet  a directory: events (the merged timeline), marks (steps and memprof.mark
                labels) and findings (`report leaks`).
                                                      pandas, DuckDB, a spreadsheet.

"""


def test_findings_table_keeps_a_stack_id_near_int64_max_exactly():
    """A recording may hold any int64 stack id (a tampered part): the CSV/Parquet findings
    table keeps it exactly, where pandas' float64 inference lost it (an internal error)."""
    from memprof.analysis.leaks import LeakFinding, LeakResult
    from memprof.report.exports.tabular import findings_frame
    big = np.iinfo(np.int64).max
    finding = LeakFinding(layer="kernel_slab", stack_id=big, live_bytes=64, live_count=1, first_ns=1, last_ns=2,
                          growth_bytes_per_s=0.0, released_at_exit=False)
    none = LeakFinding(layer="kernel_slab", stack_id=None, live_bytes=8, live_count=1, first_ns=1, last_ns=2,
                       growth_bytes_per_s=0.0, released_at_exit=False)
    result = LeakResult(findings=[finding, none], end_ns=3, min_age_ns=0, recording_end_ns=3)
    frame = findings_frame(result, {})
    assert frame["stack_id"].tolist()[0] == big and frame["stack_id"].isna().tolist() == [False, True]
