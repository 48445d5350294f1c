"""`memprof.mark("epoch 1")` labels reach every view of the timeline (issue 20 item 5): the
Chrome trace, Perfetto, the CSV/Parquet marks table and the HTML page name the moment by its
label; the exit mark and the agent's per-tensor notes stay off the timeline; a mark that also
counts the steps keeps its label."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb

from memprof.analysis.series import instants
from memprof.cli.main import cli
from memprof.model.meta import ClockAnchor
from memprof.sources.agent_reader.source import AgentSource
from tests.export_factories import MS, known_events, write_recording
from tests.factories import concat_events, events_frame, mark, typed_events
from tests.unit.test_agent_source import agent  # noqa: F401  (the real agent module, a fixture)

EPOCH_NS, NOTE_NS, EXEC_NS, EXIT_NS = 7_000 * MS, 8_000 * MS, 9_000 * MS, 40_000 * MS


def marked_events() -> pd.DataFrame:
    """known_events (steps 1 and 2 at 5 s and 15 s, an OOM at 25 s) with the user's mark
    "epoch 1" at 7 s (thread 102), a profiler tensor note at 8 s, an exec of another process
    at 9 s and the exit mark at 40 s."""
    extra = events_frame([
        {**mark(EPOCH_NS, 100, "epoch 1"), "tid": 102, "step": 1, "layer": None},
        {**mark(NOTE_NS, 100, "tensor:activation"), "step": 1, "layer": None},
        {**mark(EXEC_NS, 300, "exec"), "layer": None},
        {**mark(EXIT_NS, 100, "exit"), "layer": None},
    ])
    return concat_events(known_events(), extra)


@pytest.fixture
def recording(tmp_path) -> Path:
    return write_recording(tmp_path / "run.memprof", marked_events())


def invoke(*args):
    result = CliRunner().invoke(cli, list(map(str, args)), catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    return result.stdout


def test_instants_name_the_users_marks_and_leave_out_exit_exec_and_tensor_notes():
    frame = instants(marked_events())
    assert frame["kind"].tolist() == ["step", "mark", "step", "oom"]
    assert frame["ts_ns"].tolist() == [5_000 * MS, EPOCH_NS, 15_000 * MS, 25_000 * MS]
    epoch = frame.iloc[1]
    assert (epoch.label, epoch.step, epoch.pid, epoch.tid) == ("epoch 1", 1, 100, 102)


def test_chrome_trace_has_the_mark_as_a_named_instant(recording, tmp_path):
    out = tmp_path / "t.json"
    invoke("export", recording, "--format", "chrome-trace", "-o", out)
    marks = [e for e in json.loads(out.read_text())["traceEvents"] if e["ph"] == "i"]
    assert [e["name"] for e in marks] == ["step 1", "epoch 1", "step 2", "OOM"]
    epoch = marks[1]
    assert (epoch["ts"], epoch["tid"], epoch["args"]) == (EPOCH_NS / 1000, 102, {"step": 1})


def test_perfetto_has_the_mark_as_a_named_instant(recording, tmp_path):
    out = tmp_path / "t.pftrace"
    invoke("export", recording, "--format", "perfetto", "-o", out)
    trace = pb.Trace()
    trace.ParseFromString(out.read_bytes())
    named = [(p.timestamp, p.track_event.name) for p in trace.packet
             if p.HasField("track_event") and p.track_event.type == pb.TrackEvent.TYPE_INSTANT]
    assert named == [(5_000 * MS, "step 1"), (EPOCH_NS, "epoch 1"), (15_000 * MS, "step 2"), (25_000 * MS, "OOM")]


@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_tables_hold_a_marks_table_with_the_label(recording, tmp_path, fmt):
    out = tmp_path / "tables"
    invoke("export", recording, "--format", fmt, "-o", out)
    marks = pd.read_csv(out / "marks.csv") if fmt == "csv" else pq.read_table(out / "marks.parquet").to_pandas()
    assert marks.columns.tolist() == ["ts_ns", "kind", "label", "step", "pid", "tid"]
    assert marks[["ts_ns", "kind", "label", "step"]].values.tolist() == [
        [5_000 * MS, "step", "step", 1], [EPOCH_NS, "mark", "epoch 1", 1], [15_000 * MS, "step", "step", 2]]


def test_html_page_data_carries_the_mark_for_the_timeline(recording):
    data = json.loads(invoke("report", "html", recording, "--format", "json"))
    assert data["marks"] == [[EPOCH_NS, "epoch 1"]]  # the recording starts at 0 ns


def test_a_mark_that_counts_the_steps_keeps_its_label(agent, tmp_path):  # noqa: F811
    agent.mark("epoch 1")  # nothing else counts steps: this mark begins step 1
    agent.mark("epoch 2")
    agent.flush()
    events, _, _ = AgentSource(tmp_path / "rec.memprof").poll(ClockAnchor(0, 0))
    assert list(zip(events["category"], events["step"])) == [
        ("step", 1), ("epoch 1", 1), ("step", 2), ("epoch 2", 2)]
    assert events["ts_ns"][0] == events["ts_ns"][1]  # the label marks the step's own moment


@pytest.mark.parametrize("label", ["exit", "exec", "step"])
def test_a_users_mark_named_like_memprofs_own_is_stored_apart(agent, tmp_path, label):
    agent.mark("first")
    agent.mark(label)  # each mark begins a step here (nothing else counts them) and keeps its label
    agent.flush()
    events, _, _ = AgentSource(tmp_path / "rec.memprof").poll(ClockAnchor(0, 0))
    assert list(events["category"]) == ["step", "first", "step", f"{label} (mark)"]
    shown = instants(typed_events(events))
    assert shown["kind"].tolist() == ["step", "mark", "step", "mark"]
    assert shown["label"].tolist()[-1] == f"{label} (mark)"
