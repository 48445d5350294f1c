"""`memprof check` and memprof.analysis.budget: exit codes and exact reason lines."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from rich.console import Console

from memprof.analysis.budget import ANY_LEAK, LEAK, PEAK, Budgets, CheckResult, LeakTotal, Violation, leak_totals
from memprof.analysis.leaks import LeakResult
from memprof.cli.main import cli
from memprof.analysis.views import About, CheckView
from memprof.report.budget import render
from tests.diff_factories import KiB, MiB, S, write_recording
from tests.factories import ev, events_frame, mark

START = S // 2  # the recording starts at 0.5 s: reason lines show times from there
# torch_cpu: 1 MiB + 1 B from 2 s to 2.5 s. native_heap: 1 MiB (chain 1) and 256 KiB (chain 2)
# held to the end, 1.75 MiB (chain 1) from 3 s to 4 s: a 3 MiB peak at 3 s. kernel_slab: 4 KiB
# (chain 3) never freed. The target begins to exit at 9 s.
EVENTS = events_frame([
    ev(2 * S, "alloc", 0x70, MiB + 1, 5, layer="torch_cpu"), ev(int(2.5 * S), "free", 0x70, layer="torch_cpu"),
    (1 * S, "alloc", 0xA0, MiB, 1), (int(1.2 * S), "alloc", 0xB0, 256 * KiB, 2),
    (3 * S, "alloc", 0xC0, 7 * MiB // 4, 1), (4 * S, "free", 0xC0),
    ev(1 * S, "alloc", 0x10, 4 * KiB, 3, layer="kernel_slab"), mark(9 * S, pid=100),
])
NATIVE_PEAK = "FAIL peak native_heap 3.0 MiB > budget 1.0 MiB (at +2.50s)"


@pytest.fixture
def recording(tmp_path):
    return write_recording(tmp_path / "run.memprof", EVENTS, start_ns=START)


def invoke(*args):
    result = CliRunner().invoke(cli, ["check", *map(str, args)], catch_exceptions=False)
    return result.exit_code, result.stdout.splitlines(), result.stderr


def test_max_peak_holds_every_layer(recording):
    assert invoke(recording, "--max-peak", "1MiB") == (6, [
        # Rounding would show 1.0 MiB > 1.0 MiB: exact bytes instead.
        "FAIL peak torch_cpu 1,048,577 B > budget 1,048,576 B (at +1.50s)",
        NATIVE_PEAK,
    ], "")
    assert invoke(recording, "--max-peak", "3MiB")[:2] == (0, ["ok: 1 budget met"])  # a peak at the budget is within it


def test_max_peak_of_one_layer(recording):
    assert invoke(recording, "--max-peak", "1MiB:native_heap", "--max-peak", "2MiB:torch_cpu")[:2] == (6, [NATIVE_PEAK])
    assert invoke(recording, "--max-peak", "3MiB:native_heap", "--max-peak", "2MiB:torch_cpu")[:2] == \
        (0, ["ok: 2 budgets met"])


ABSENT_CUDA = ("FAIL peak cuda_block: no cuda_block allocations in this recording, so its budget 512.0 MiB cannot be "
               "judged (a typo, or a source that was not recorded?); --allow-absent-layer skips such a budget")


def test_budget_on_an_absent_layer_fails_unless_allowed(recording):
    """Issue 20, point 9: a budget on a layer the recording has no allocations in is neither
    met nor silently passed: it fails (exit 6) and says why, or, with --allow-absent-layer,
    is skipped and counted apart."""
    assert invoke(recording, "--max-peak", "512MiB:cuda_block")[:2] == (6, [ABSENT_CUDA])
    assert invoke(recording, "--max-peak", "3MiB:native_heap", "--max-peak", "512MiB:cuda_block",
                  "--allow-absent-layer")[:2] == (0, ["ok: 1 budget met, 1 skipped (no allocations in cuda_block)"])
    # A broken budget still fails beside a skipped one.
    assert invoke(recording, "--max-peak", "1MiB:native_heap", "--max-peak", "512MiB:cuda_block",
                  "--allow-absent-layer")[:2] == (6, [NATIVE_PEAK])
    code, lines, _ = invoke(recording, "--max-peak", "512MiB:cuda_block", "--format", "json")
    report = json.loads("\n".join(lines))
    assert (code, report["passed"], report["skipped"]) == (6, False, [])
    assert [(v["budget"], v["layer"], v["limit_bytes"], v["reason"]) for v in report["violations"]] == \
        [("absent_layer", "cuda_block", 512 * MiB, ABSENT_CUDA)]
    code, lines, _ = invoke(recording, "--max-peak", "512MiB:cuda_block", "--allow-absent-layer", "--format", "json")
    report = json.loads("\n".join(lines))
    assert (code, report["passed"], report["violations"], report["skipped"]) == (0, True, [], ["cuda_block"])


def test_sizes_take_decimal_and_binary_units(recording):
    assert invoke(recording, "--max-peak", "3.2MB:native_heap")[0] == 0  # 3,200,000 B ≥ 3 MiB
    assert invoke(recording, "--max-peak", "3MB:native_heap")[:2] == \
        (6, ["FAIL peak native_heap 3.0 MiB > budget 2.9 MiB (at +2.50s)"])  # 3,000,000 B < 3 MiB
    assert invoke(recording, "--max-peak", "3145727:native_heap")[0] == 6  # plain bytes: 1 B short


def test_max_leak_per_layer(recording):
    # native_heap: two findings, 1.25 MiB in all; kernel_slab: 4 KiB.
    assert invoke(recording, "--max-leak", "1MiB")[:2] == (6, ["FAIL leak native_heap 1.2 MiB in 2 findings > budget 1.0 MiB"])
    assert invoke(recording, "--max-leak", "1280KiB")[:2] == (0, ["ok: 1 budget met"])
    assert invoke(recording, "--max-leak", "4000")[:2] == (6, [
        "FAIL leak native_heap 1.2 MiB in 2 findings > budget 3.9 KiB",
        "FAIL leak kernel_slab 4.0 KiB in 1 finding > budget 3.9 KiB",
    ])


def test_fail_on_leak_and_min_age(recording):
    assert invoke(recording, "--fail-on-leak")[:2] == (6, [
        "FAIL leak native_heap 1.2 MiB in 2 findings held at the end (--fail-on-leak)",
        "FAIL leak kernel_slab 4.0 KiB in 1 finding held at the end (--fail-on-leak)",
    ])
    # Nothing is 20 s old at the end (9 s): no findings.
    assert invoke(recording, "--fail-on-leak", "--min-age", "20s")[:2] == (0, ["ok: 1 budget met"])


def test_all_budgets_met(recording):
    assert invoke(recording, "--max-peak", "4MiB", "--max-peak", "2MiB:torch_cpu", "--max-leak", "2MiB")[:2] == \
        (0, ["ok: 3 budgets met"])


def test_json_has_passed_and_violations(recording):
    result = CliRunner().invoke(cli, ["check", str(recording), "--max-peak", "2MiB", "--fail-on-leak",
                                      "--format", "json"], catch_exceptions=False)
    assert result.exit_code == 6
    doc = json.loads(result.stdout)
    assert (doc["recording"], doc["passed"], doc["budgets"], doc["lost_events"]) == (str(recording), False, 2, 0)
    assert doc["violations"][0] == {"budget": "peak", "layer": "native_heap", "actual_bytes": 3 * MiB,
                                    "limit_bytes": 2 * MiB, "at_ns": 3 * S, "findings": 0, "growing": 0,
                                    "reason": "FAIL peak native_heap 3.0 MiB > budget 2.0 MiB (at +2.50s)"}
    assert [(v["budget"], v["layer"], v["actual_bytes"], v["findings"]) for v in doc["violations"][1:]] == \
        [("fail_on_leak", "native_heap", 1280 * KiB, 2), ("fail_on_leak", "kernel_slab", 4 * KiB, 1)]
    passed = CliRunner().invoke(cli, ["check", str(recording), "--max-peak", "4MiB", "--format", "json"])
    assert passed.exit_code == 0 and json.loads(passed.stdout)["violations"] == []


@pytest.mark.parametrize("args, message", [
    ((), "no budget to check"),
    (("--max-peak", "1GiB:gpu"), "unknown layer 'gpu'"),
    (("--max-peak", "1GiB:"), "unknown layer ''"),
    (("--max-peak", "12parsecs"), "unknown size unit 'parsecs'"),
    (("--max-leak", "lots"), "not a size"),
])
def test_bad_budgets_are_usage_errors(recording, args, message):
    code, out, err = invoke(recording, *args)
    assert (code, out) == (2, [])
    assert message in err and "hint:" in err


def test_missing_recording_exits_5(tmp_path):
    code, out, err = invoke(tmp_path / "nope.memprof", "--fail-on-leak")
    assert (code, out) == (5, []) and "nope.memprof" in err


def test_lost_events_are_noted(tmp_path):
    path = write_recording(tmp_path / "lossy.memprof", EVENTS, lost=47)
    assert invoke(path, "--max-peak", "4MiB")[:2] == (0, [
        "ok: 1 budget met", "note: 47 events were lost while recording: peaks and leaks miss those allocations"])


def test_findings_that_are_not_leaks_do_not_count():
    """find_leaks may classify findings (kind); "not_a_leak" ones are left out, the rest count."""
    findings = [SimpleNamespace(layer="native_heap", live_bytes=100, kind="held_at_end"),
                SimpleNamespace(layer="native_heap", live_bytes=1000, kind="not_a_leak"),
                SimpleNamespace(layer="native_heap", live_bytes=10, kind="grows_per_step"),
                SimpleNamespace(layer="cuda_block", live_bytes=7)]  # no kind: held at the end
    result = LeakResult(findings=findings, end_ns=0, min_age_ns=0, recording_end_ns=0)
    assert leak_totals(result) == [LeakTotal("cuda_block", 7, 1), LeakTotal("native_heap", 110, 2, growing=1)]


def test_budgets_count_and_rendered_lines_at_fixed_width():
    assert Budgets().count == 0 and Budgets(max_leak_bytes=0, fail_on_leak=True).count == 2
    result = CheckResult(budgets=2, violations=[
        Violation(PEAK, "kernel_slab[x]", 2 * MiB, MiB, at_ns=3 * S),
        Violation(LEAK, "native_heap", 5 * KiB, KiB, findings=1),
        Violation(ANY_LEAK, "native_heap", 5 * KiB, 0, findings=1),
        Violation(ANY_LEAK, "torch_cpu", 234 * MiB, 0, findings=1, growing=1),
        Violation(ANY_LEAK, "kernel_slab", 3 * KiB, 0, findings=3, growing=1),
    ])
    console = Console(width=40, record=True, color_system=None)
    render(CheckView(result, About("r", start_ns=S)), console)
    # One line each however narrow the terminal, so CI logs can be grepped; "[x]" not markup.
    assert console.export_text().splitlines() == [
        "FAIL peak kernel_slab[x] 2.0 MiB > budget 1.0 MiB (at +2.00s)",
        "FAIL leak native_heap 5.0 KiB in 1 finding > budget 1.0 KiB",
        "FAIL leak native_heap 5.0 KiB in 1 finding held at the end (--fail-on-leak)",
        # a training loop's kept logits grow per step: not "held at the end" (2026-12-07)
        "FAIL leak torch_cpu 234.0 MiB in 1 finding growing per step (--fail-on-leak)",
        "FAIL leak kernel_slab 3.0 KiB in 3 findings (1 growing per step, 2 held at the end) (--fail-on-leak)",
    ]
