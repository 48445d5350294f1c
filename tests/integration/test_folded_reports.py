"""A folded report says what the whole one says (issue 23, item 2), on real recordings: the
known PyTorch leak (torch_leak.py: 131,072 B kept per step), its control (train.py: nothing
kept) and the known kernel leak (kernel_leak: files and pipes never closed), each reported
whole and folded (`--max-memory 1KiB` forces the fold; a recording of this size is read whole
by default). Leaks, layers, the chains at each layer's peak, at the end and at a time, the
modules' totals, every advice rule's verdict, the summary and the leak gate agree to the byte,
and so does growth by step; only the note saying it was folded differs. The page draws its
curves through the moments the fold kept (a warning says so), and so does the Perfetto
trace; the exports of every event (csv, parquet) refuse the folded recording with exit 2."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
KERNEL_LEAK = REPO / "examples" / "bin" / "kernel_leak"
TORCH_LEAK = REPO / "examples" / "torch_leak.py"
TRAIN = REPO / "examples" / "train.py"
FOLD = ("--max-memory", "1KiB")
VIEWS = {"leaks": ("report", "leaks", "--top", "1000"), "layers": ("report", "layers", "--top", "10"),
         "peak": ("report", "top", "--at", "peak", "--top", "20"), "end": ("report", "top", "--at", "end", "--top", "20"),
         # A time: the fold is told to keep what was live then (each program runs for longer).
         "time": ("report", "top", "--at", "400ms", "--top", "20"),
         "windows": ("report", "leaks", "--window", "100ms", "--top", "1000"),
         "modules": ("report", "modules", "--top", "100"),
         # Every rule judged: the summary's advice and `report advice` read a fold made for them.
         "advice": ("report", "advice"), "summary": ("report",)}

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not importable")


def _recorded(run_memprof, recording: Path, *command) -> Path:
    result = run_memprof("record", "-q", "-o", recording, "--", *command, cwd=recording.parent, timeout=180)
    assert result.returncode == 0, result.stderr
    return recording


def _json(run_memprof, recording: Path, *args) -> dict:
    result = run_memprof(*args, recording, "--format", "json", cwd=recording.parent, timeout=180)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _text(note) -> str:
    """A note's words: the summary's notes are {"severity", "text"}, the other views' plain text."""
    return note["text"] if isinstance(note, dict) else str(note)


def _whole_and_folded(run_memprof, recording: Path, view: str) -> tuple[dict, dict]:
    whole, folded = _json(run_memprof, recording, *VIEWS[view]), _json(run_memprof, recording, *VIEWS[view], *FOLD)
    assert not any(_text(n).startswith("folded:") for n in whole["notes"])
    said = [n for n in folded.pop("notes") if _text(n).startswith("folded:")]
    assert len(said) == 1, folded
    whole.pop("notes")
    return whole, folded


@pytest.mark.parametrize("program", [
    pytest.param((sys.executable, TORCH_LEAK, "--steps", "20"), id="torch_leak", marks=needs_torch),
    pytest.param((sys.executable, TRAIN, "--steps", "20"), id="train_control", marks=needs_torch),
    pytest.param((KERNEL_LEAK,), id="kernel_leak"),
])
def test_folded_reports_say_what_the_whole_ones_say(tmp_path, run_memprof, program):
    recording = _recorded(run_memprof, tmp_path / "run.memprof", *map(str, program))
    for view in VIEWS:
        whole, folded = _whole_and_folded(run_memprof, recording, view)
        assert json.dumps(folded, sort_keys=True) == json.dumps(whole, sort_keys=True), view
        if view == "leaks" and program[-3:] == (str(TORCH_LEAK), "--steps", "20"):
            grows = [f for f in whole["findings"] if f["kind"] == "grows_per_step" and f["layer"] == "torch_cpu"]
            assert [round(f["slope_bytes_per_step"]) for f in grows] == [131072]
        if view == "leaks" and program[-3:] == (str(TRAIN), "--steps", "20"):
            assert whole["findings"] == []
    gates = [run_memprof("check", recording, "--fail-on-leak", "--max-peak", "1GiB", *extra, cwd=tmp_path)
             for extra in ((), FOLD)]
    assert gates[0].returncode == gates[1].returncode and gates[0].stdout == gates[1].stdout


@needs_torch
def test_reports_that_need_every_event_refuse_a_folded_recording(tmp_path, run_memprof):
    recording = _recorded(run_memprof, tmp_path / "run.memprof", sys.executable, TORCH_LEAK, "--steps", "10")
    for args in (("export", "--format", "csv"), ("export", "--format", "parquet")):
        result = run_memprof(*args, recording, *FOLD, cwd=tmp_path)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert "needs every event" in result.stderr and "--max-memory" in result.stderr
        assert "Traceback" not in result.stderr
    summary = run_memprof("report", recording, *FOLD, cwd=tmp_path)
    assert summary.returncode == 0 and "folded" in summary.stdout
    page = run_memprof("report", "html", recording, "-o", tmp_path / "folded.html", *FOLD, cwd=tmp_path)
    assert page.returncode == 0, page.stderr
    assert "folded: each layer" in (tmp_path / "folded.html").read_text()
    trace = run_memprof("export", "--format", "perfetto", recording, "-o", tmp_path / "folded.pftrace", *FOLD,
                        cwd=tmp_path)
    assert trace.returncode == 0 and "moments the fold kept" in trace.stderr, trace.stderr
    assert (tmp_path / "folded.pftrace").stat().st_size > 0
    # Growth by step reads what every fold keeps (each step mark's live set): the whole's fits.
    whole, folded = (_json(run_memprof, recording, "report", "growth", *extra) for extra in ((), FOLD))
    whole.pop("notes"), folded.pop("notes")
    assert folded["by_step"] and json.dumps(folded, sort_keys=True) == json.dumps(whole, sort_keys=True)
