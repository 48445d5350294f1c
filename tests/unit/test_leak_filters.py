"""Issue 20 point 4: every leak report says what its filters left out — the allocations and
bytes `--min-age` excluded (per finding and in total) and the findings `--top` cut."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from memprof.cli.main import cli
from tests.diff_factories import write_recording
from tests.factories import ev, events_frame, mark

S = 1_000_000_000
KiB = 1 << 10
TENSOR = 128 * KiB
EXIT_NS = 10 * S
CHAIN = [("native", "c10::alloc_cpu", "libc10.so", None, None), ("python", "keep", "train", "train.py", 7)]


def invoke(*args) -> str:
    result = CliRunner().invoke(cli, list(map(str, args)), catch_exceptions=False)
    assert result.exit_code == 0, result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def forty_tensors(tmp_path_factory):
    """40 tensors of 128 KiB kept by one chain until exit at 10 s: 20 made at 1-2 s, 20 in
    the last 400 ms (younger than the default --min-age of 500 ms)."""
    old = [ev(S + k * (S // 20), "alloc", 0x1000_0000 + k * 0x10_0000, TENSOR, 1) for k in range(20)]
    young = [ev(EXIT_NS - 400_000_000 + k * 10_000_000, "alloc", 0x4000_0000 + k * 0x10_0000, TENSOR, 1)
             for k in range(20)]
    rows = old + young + [mark(EXIT_NS, 100)]
    path = tmp_path_factory.mktemp("filters") / "forty.memprof"
    return write_recording(path, events_frame(rows, layer="torch_cpu"), {1: CHAIN}, end_ns=11 * S)


@pytest.fixture(scope="module")
def many_chains(tmp_path_factory):
    """21 chains, each keeping one allocation (1 KiB … 21 KiB) from 1 s until exit at 10 s."""
    rows = [ev(S + k, "alloc", 0x1000_0000 + k * 0x10_0000, (k + 1) * KiB, k + 1) for k in range(21)]
    chains = {k + 1: [("python", f"site{k + 1}", "m", "m.py", k + 1)] for k in range(21)}
    path = tmp_path_factory.mktemp("filters") / "many.memprof"
    return write_recording(path, events_frame(rows + [mark(EXIT_NS, 100)], layer="torch_cpu"), chains, end_ns=11 * S)


def test_leaks_table_says_what_min_age_left_out_per_finding_and_in_total(forty_tensors):
    text = invoke("report", "leaks", forty_tensors)
    assert "2.5 MiB in 20 allocations" in text  # the 20 old ones, as before
    assert "+ 20 younger allocations of this chain (2.5 MiB) not counted" in text
    assert "--min-age 500ms left out 20 allocations (2.5 MiB) live at the end" in text
    everything = invoke("report", "leaks", forty_tensors, "--min-age", "0")
    assert "5.0 MiB in 40 allocations" in everything and "left out" not in everything


def test_leaks_json_counts_what_min_age_left_out(forty_tensors):
    doc = json.loads(invoke("report", "leaks", forty_tensors, "--format", "json"))
    [finding] = doc["findings"]
    assert (finding["live_count"], finding["live_bytes"]) == (20, 20 * TENSOR)
    assert (finding["younger_count"], finding["younger_bytes"]) == (20, 20 * TENSOR)
    assert doc["left_out"] == {"younger_count": 20, "younger_bytes": 20 * TENSOR, "top": 10,
                               "findings_total": 1, "not_leaks_total": 0}


def test_leaks_header_says_top_cut_the_list(many_chains):
    text = invoke("report", "leaks", many_chains)
    assert "showing 10 of 21 findings (--top 10)" in text
    assert "site11" not in text and "site12" in text  # the biggest ten: 21 KiB … 12 KiB
    doc = json.loads(invoke("report", "leaks", many_chains, "--format", "json", "--top", "5"))
    assert len(doc["findings"]) == 5 and doc["left_out"]["findings_total"] == 21 and doc["left_out"]["top"] == 5
    assert "showing" not in invoke("report", "leaks", many_chains, "--top", "21")


def test_summary_says_how_many_findings_it_shows_and_what_min_age_left_out(many_chains, forty_tensors):
    assert "showing 3 of 21 findings (--top 3)" in invoke("report", many_chains)
    doc = json.loads(invoke("report", many_chains, "--format", "json"))
    assert len(doc["findings"]) == 3 and doc["left_out"]["findings_total"] == 21
    text = invoke("report", forty_tensors)
    assert "--min-age 500ms left out 20 allocations (2.5 MiB) live at the end" in text
    assert json.loads(invoke("report", forty_tensors, "--format", "json"))["findings"][0]["younger_count"] == 20


def test_html_data_carries_what_the_filters_left_out(many_chains, forty_tensors):
    doc = json.loads(invoke("report", "html", many_chains, "--format", "json", "--top", "10"))
    assert doc["leaks"]["left_out"]["findings_total"] == 21 and len(doc["leaks"]["findings"]) == 10
    doc = json.loads(invoke("report", "html", forty_tensors, "--format", "json"))
    assert doc["leaks"]["findings"][0]["younger_count"] == 20


def test_summary_counts_every_chain_held_on_purpose_not_only_the_top(tmp_path):
    """Five cached CUDA segments (no block inside: not leaks), the one-screen report at --top 3."""
    rows = [ev(S, "alloc", 0x1000_0000 + k * 0x100_0000, (k + 1) << 20, k + 1, layer="cuda_segment", device="cuda:0")
            for k in range(5)]
    path = write_recording(tmp_path / "seg.memprof", events_frame(rows + [mark(EXIT_NS, 100)]), end_ns=11 * S)
    assert "and 5 chains held on purpose" in invoke("report", path)
    assert json.loads(invoke("report", path, "--format", "json"))["not_leaks"] == 5
    assert "memory held on purpose, showing 3 of 5 chains (--top 3)" in invoke("report", "leaks", path, "--top", "3")
    page = json.loads(invoke("report", "html", path, "--format", "json", "--top", "3"))
    assert page["leaks_text"]["not_leaks"] == "showing 3 of 5 chains (--top 3)"
