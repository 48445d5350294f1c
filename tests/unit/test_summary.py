"""`memprof report` with no sub-report: the one-screen summary, golden at a fixed width."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest
from click.testing import CliRunner
from rich.console import Console

from memprof.api import analyse
from memprof.cli.main import cli
from memprof.report.reporters import render
from tests.diff_factories import write_recording
from tests.factories import events_frame
from tests.report_factories import KiB, S, known_recording


@pytest.fixture
def recording(tmp_path):
    return known_recording(tmp_path / "run.memprof")


def test_summary_knows_the_layers_and_the_leak(recording):
    result = analyse(recording).summary().result
    [layer] = result.layers.layers
    assert (layer.layer, layer.peak_bytes, layer.final_bytes, layer.alloc_count) == (
        "torch_cpu", (1 << 20) + 20 * 128 * KiB, (1 << 20) + 20 * 128 * KiB, 21)
    assert [(f.kind, f.stack_id, f.live_bytes, f.slope_bytes_per_step) for f in result.leaks.findings] == [
        ("grows_per_step", 1, 20 * 128 * KiB, 128 * KiB), ("held_at_end", 2, 1 << 20, None)]
    assert (result.steps, result.duration_ns, result.events) == (20, 22 * S, 42)


def test_summary_table_golden(recording):
    view = analyse(recording).summary()
    assert view.about.start_ns == 0
    console = Console(width=100, record=True, color_system=None)
    render(replace(view, about=replace(view.about, path="run.memprof")), console)
    lines = [line.rstrip() for line in console.export_text().splitlines()]
    assert lines == [
        'memprof run.memprof · 22.00s · 42 events · 20 steps',
        'Layers (they nest: bytes are never added across them)',
        '┏━━━━━━━━━━━┳━━━━━━━━━┳━━━━━━━━━┳━━━━━━━━━┳━━━━━━━━━━━━━┓',
        '┃ layer     ┃    peak ┃      at ┃     end ┃ allocations ┃',
        '┡━━━━━━━━━━━╇━━━━━━━━━╇━━━━━━━━━╇━━━━━━━━━╇━━━━━━━━━━━━━┩',
        '│ torch_cpu │ 3.5 MiB │ +20.25s │ 3.5 MiB │          21 │',
        '└───────────┴─────────┴─────────┴─────────┴─────────────┘',
        'Top leaks: 2 findings (`memprof report leaks` for all, with chains)',
        '  1. torch_cpu grows per step: 2.5 MiB in 20, +128.0 KiB/step  train_step (train.py:34) ← main (tra…',
        '  2. torch_cpu held at the end: 1.0 MiB in 1  build[model] (model.py:9)',
        '',
        'Next',
        '  memprof report leaks run.memprof                  every finding, with its whole chain',
        '  memprof report top run.memprof --by function      bytes by function, self and total',
        '  memprof report growth run.memprof                 growth fits, and when memory runs out',
        '  memprof report html run.memprof -o report.html    timeline and flame graph, one page',
        '  memprof export run.memprof --format perfetto      a trace for ui.perfetto.dev',
    ]


def test_report_without_a_sub_report_is_the_summary_and_has_json(recording):
    runner = CliRunner()
    table = runner.invoke(cli, ["report", str(recording)])
    assert table.exit_code == 0, table.output
    assert "Top leaks: 2 findings" in table.output and "grows per step" in table.output
    doc = json.loads(runner.invoke(cli, ["report", str(recording), "--format", "json"]).output)
    assert [(f["kind"], f["live_bytes"], f["chain"]) for f in doc["findings"]] == [
        ("grows_per_step", 20 * 128 * KiB, "train_step (train.py:34) ← main (train.py:56)"),
        ("held_at_end", 1 << 20, "build[model] (model.py:9)")]
    assert doc["layers"][0]["final_bytes"] == (1 << 20) + 20 * 128 * KiB and doc["steps"] == 20
    assert f"memprof report leaks {recording}" in doc["next"]
    assert runner.invoke(cli, ["report", "summary", str(recording), "--format", "json"]).output == \
        runner.invoke(cli, ["report", str(recording), "--format", "json"]).output


def test_summary_of_a_missing_recording_exits_5(tmp_path):
    result = CliRunner().invoke(cli, ["report", str(tmp_path / "nope.memprof")])
    assert result.exit_code == 5, result.output


def test_summary_of_an_empty_recording_says_so(tmp_path):
    path = write_recording(tmp_path / "empty.memprof", events_frame([], layer="torch_cpu"), end_ns=S)
    result = CliRunner().invoke(cli, ["report", str(path)])
    assert result.exit_code == 0, result.output
    assert "No allocations recorded." in result.output and "No leaks found" in result.output
