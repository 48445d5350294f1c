"""torch.profiler Chrome traces → timeline rows (memprof/sources/torch_import/profiler.py), over a
hand-built CUDA trace and a real CPU trace recorded with torch (tests/data/)."""
from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner

from memprof.analysis.lifetimes import pair_lifetimes
from memprof.cli.main import cli
from memprof.errors import BadInputError
from memprof.recording import open_recording
from memprof.sources.torch_import.profiler import profiler_rows
from memprof.sources.torch_import.snapshot import realtime_ns
from tests.factories import typed_events

DATA = Path(__file__).resolve().parents[1] / "data"
sys.path.insert(0, str(DATA))
import make_profiler_trace as real  # noqa: E402
import make_snapshot_fixtures as fx  # noqa: E402

CUDA_TRACE = DATA / "handbuilt_profiler_trace_cuda.json"
REAL_TRACE = DATA / "real_cpu_profiler_trace.json.gz"
MiB = 1 << 20


def rows_of(trace: dict):
    result = profiler_rows(trace, realtime_ns)
    keys = list(result.events)
    return result, [dict(zip(keys, values)) for values in zip(*(result.events[k] for k in keys))]


def chain(result, stack_id) -> list[tuple]:
    ids = [f for s, f in zip(result.stacks["stack_id"], result.stacks["frame_id"]) if s == stack_id]
    by_id = {fid: (kind, fn, file, line) for fid, kind, fn, file, line in zip(
        result.frames["frame_id"], result.frames["kind"], result.frames["function"], result.frames["file"],
        result.frames["line"])}
    return [by_id[f] for f in ids]


def test_cuda_trace_rows_layers_devices_and_order():
    result, rows = rows_of(json.loads(CUDA_TRACE.read_text()))
    assert Counter((r["layer"], r["action"], r["device"]) for r in rows) == {
        ("cuda_block", "alloc", "cuda:0"): 10, ("cuda_block", "free", "cuda:0"): 6,
        ("torch_cpu", "alloc", "cpu"): 1, ("torch_cpu", "free", "cpu"): 1, ("cuda_block", "oom", "cuda:0"): 1}
    assert [r["ts_ns"] for r in rows] == sorted(r["ts_ns"] for r in rows)
    assert [r["seq"] for r in rows] == list(range(19))
    assert {(r["pid"], r["tid"]) for r in rows} == {(4242, 7)}
    first = rows[0]
    assert (first["addr"], first["size_bytes"], first["ts_ns"]) == (fx.CUDA_BASE, 2 * MiB, fx.BASE_NS + 1_015_000)
    oom = [r for r in rows if r["action"] == "oom"][0]
    assert oom["size_bytes"] == oom["requested_bytes"] == 80 * 1024 * MiB and oom["addr"] == 0
    stats = result.stats
    assert stats["skipped_device_types"] == {"device type 13": 1}
    assert (stats["first_ns"], stats["last_ns"]) == (fx.BASE_NS, fx.BASE_NS + 2_000_000_000)
    assert pair_lifetimes(typed_events(result.events)).unmatched_frees == {"cuda_block": 1}


def test_each_memory_event_gets_the_ops_and_python_functions_open_on_its_thread():
    result, rows = rows_of(json.loads(CUDA_TRACE.read_text()))
    leak = [r for r in rows if r["action"] == "alloc" and r["size_bytes"] == 2 * MiB]
    assert len({r["stack_id"] for r in leak}) == 1
    assert chain(result, leak[0]["stack_id"]) == [
        ("native", "aten::empty", None, None), ("python", "cache_batch", "/work/job/train.py", 40),
        ("python", "main", "/work/job/train.py", 100)]
    temp = [r for r in rows if r["action"] == "alloc" and r["size_bytes"] == MiB][0]
    assert [f[1] for f in chain(result, temp["stack_id"])] == ["aten::empty", "aten::ones", "forward", "main"]
    freed = [r for r in rows if r["action"] == "free" and r["size_bytes"] == MiB][0]
    assert [f[1] for f in chain(result, freed["stack_id"])] == ["forward", "main"]  # aten::ones had ended
    cpu = [r for r in rows if r["device"] == "cpu"][0]
    assert [f[1] for f in chain(result, cpu["stack_id"])] == ["main"]


def test_real_cpu_trace_imports_and_leaks_names_the_function(tmp_path):
    out = tmp_path / "real.memprof"
    result = CliRunner().invoke(cli, ["import", str(REAL_TRACE), "-o", str(out)])
    assert result.exit_code == 0, result.stderr
    rec = open_recording(out)
    assert set(rec.meta.sources) == {"torch_profiler"} and rec.meta.clock == "CLOCK_REALTIME"
    assert set(rec.events["layer"].dropna()) == {"torch_cpu"}
    report = CliRunner().invoke(cli, ["report", "leaks", str(out), "--format", "json"])
    assert report.exit_code == 0, report.stderr
    findings = json.loads(report.stdout)["findings"]
    assert [(f["layer"], f["live_bytes"], f["live_count"]) for f in findings] == [("torch_cpu", 23 * MiB, 23)]
    python = [f for f in findings[0]["stack"] if f["kind"] == "python" and f["function"] == "step"]
    assert python and python[0]["file"].endswith("make_profiler_trace.py") and python[0]["line"] == real.STEP_LINE
    assert findings[0]["stack"][0] == {"kind": "native", "function": "aten::empty", "module": None, "file": None,
                                       "line": None}


def test_a_snapshot_and_a_trace_in_one_recording(tmp_path):
    out = tmp_path / "both.memprof"
    result = CliRunner().invoke(cli, ["import", str(DATA / "handbuilt_snapshot_oom.pickle"), str(REAL_TRACE),
                                      "-o", str(out)])
    assert result.exit_code == 0, result.stderr
    rec = open_recording(out)
    assert set(rec.meta.sources) == {"torch_snapshot", "torch_profiler"}
    assert rec.meta.sources["torch_snapshot"].events == 3 and len(rec.events) == 3 + 161


@pytest.mark.parametrize("trace, message", [
    ([], "holds a JSON list, not a torch.profiler Chrome trace"),
    ({"schemaVersion": 1}, "holds JSON without a traceEvents list"),
    ({"traceEvents": [], "baseTimeNanoseconds": "soon"}, "baseTimeNanoseconds is 'soon'"),
    ({"traceEvents": [{"ph": "i", "name": "[memory]", "ts": 1}]}, "traceEvents[0]: a [memory] event without args"),
    ({"traceEvents": [{"ph": "i", "name": "[memory]", "ts": 1, "args": {"Bytes": 8, "Device Type": 0, "Addr": -4}}]},
     "traceEvents[0]: Addr -4 and Bytes 8 are not an allocation"),
    ({"traceEvents": [{"ph": "i", "name": "[memory]", "ts": "1", "args": {}}]}, "traceEvents[0]: ts is '1'"),
])
def test_bad_traces_are_bad_input_errors(trace, message):
    with pytest.raises(BadInputError) as e:
        profiler_rows(trace, realtime_ns)
    assert message in e.value.message


def test_a_trace_without_memory_events_says_how_to_get_them():
    result, rows = rows_of({"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1, "dur": 2}]})
    assert rows == [] and any("profile_memory=True" in n for n in result.stats["notes"])


def test_invalid_json_exits_5_with_one_line(tmp_path):
    bad = tmp_path / "trace.json"
    bad.write_text('{"traceEvents": [')
    result = CliRunner().invoke(cli, ["import", str(bad), "-o", str(tmp_path / "o.memprof")])
    assert result.exit_code == 5
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 2 and f"{bad}: not valid JSON" in lines[0]
