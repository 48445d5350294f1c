"""Renderers of a budget check (memprof.analysis.budget): JSON and plain lines. Render only.

The lines are for CI logs: one `FAIL …` line per violated budget and layer, or one `ok: …`
line when every budget was met; nothing else but a loss note, so a pipeline can grep them.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from memprof.analysis.budget import ABSENT, ANY_LEAK, LEAK, PEAK
from memprof.report.safe_text import escape
from memprof.units import format_bytes, format_relative_ns

if TYPE_CHECKING:
    from rich.console import Console

    from memprof.analysis.budget import CheckResult, Violation
    from memprof.analysis.views import CheckView


def to_json(view: CheckView) -> dict:
    """JSON-ready dict: recording, passed, budgets (how many were checked), violations (each
    with budget, layer, actual_bytes, limit_bytes, at_ns — CLOCK_MONOTONIC ns, null but for
    peaks —, findings, and its `reason` line), skipped (the layer of each peak budget skipped
    as absent, --allow-absent-layer), lost_events."""
    result, about = view.result, view.about
    recording_path, start_ns, lost_events = about.path, about.start_ns, about.lost_events
    return {
        "recording": str(recording_path),
        "passed": result.passed,
        "budgets": int(result.budgets),
        "violations": [_violation_json(v, start_ns) for v in result.violations],
        "skipped": list(result.skipped),
        "lost_events": int(lost_events),
    }


def _violation_json(violation: Violation, start_ns: int) -> dict[str, Any]:
    return {
        "budget": violation.budget,
        "layer": violation.layer,
        "actual_bytes": int(violation.actual_bytes),
        "limit_bytes": int(violation.limit_bytes),
        "at_ns": None if violation.at_ns is None else int(violation.at_ns),
        "findings": int(violation.findings),
        "growing": int(violation.growing),
        "reason": violation_line(violation, start_ns),
    }


def render(view: CheckView, console: Console) -> None:
    """Print one line per violation, or `ok: N budgets met` (with how many were skipped as
    absent, and which layers); then a note when events were lost (the numbers judged miss
    them). Times relative to `start_ns` (recording start)."""
    result, start_ns, lost_events = view.result, view.about.start_ns, view.about.lost_events
    for violation in result.violations:
        console.print(f"[red]{escape(violation_line(violation, start_ns))}[/]", highlight=False, soft_wrap=True)
    if result.passed:
        console.print(escape(ok_line(result)), highlight=False, soft_wrap=True)
    if lost_events:
        console.print(f"[yellow]note: {lost_events:,} events were lost while recording: peaks and leaks "
                      "miss those allocations[/]", highlight=False, soft_wrap=True)


def ok_line(result: CheckResult) -> str:
    """'ok: 2 budgets met', or 'ok: 1 budget met, 1 skipped (no allocations in cuda_block)'. Not escaped."""
    text = f"ok: {_count(result.met, 'budget', 'budgets')} met"
    if result.skipped:
        layers = ", ".join(dict.fromkeys(result.skipped))
        text += f", {len(result.skipped)} skipped (no allocations in {layers})"
    return text


def violation_line(violation: Violation, start_ns: int) -> str:
    """'FAIL peak torch_cpu 1.2 GiB > budget 1.0 GiB (at +12.30s)',
    'FAIL peak cuda_block: no cuda_block allocations in this recording …',
    'FAIL leak native_heap 2.0 MiB in 3 findings > budget 1.0 MiB',
    'FAIL leak native_heap 2.0 MiB in 3 findings held at the end (--fail-on-leak)'. Not escaped."""
    if violation.budget == ABSENT:
        return (f"FAIL peak {violation.layer}: no {violation.layer} allocations in this recording, so its "
                f"budget {format_bytes(violation.limit_bytes)} cannot be judged (a typo, or a source that was "
                "not recorded?); --allow-absent-layer skips such a budget")
    actual, limit = _sizes(violation.actual_bytes, violation.limit_bytes)
    if violation.budget == PEAK:
        when = "" if violation.at_ns is None else f" (at {format_relative_ns(violation.at_ns, start_ns)})"
        return f"FAIL peak {violation.layer} {actual} > budget {limit}{when}"
    held = f"FAIL leak {violation.layer} {actual} in {_count(violation.findings, 'finding', 'findings')}"
    if violation.budget == LEAK:
        return f"{held} > budget {limit}"
    if violation.budget == ANY_LEAK:
        return f"{held} {_kinds(violation)} (--fail-on-leak)"
    raise ValueError(f"unknown budget {violation.budget!r}")


def _kinds(violation: Violation) -> str:
    """What the findings are: 'held at the end', 'growing per step', or both counted."""
    held = violation.findings - violation.growing
    if not violation.growing:
        return "held at the end"
    if not held:
        return "growing per step"
    return f"({violation.growing} growing per step, {held} held at the end)"


def _sizes(actual: int, limit: int) -> tuple[str, str]:
    """Both sizes in binary units, or in exact bytes where rounding would show them equal
    ('1.0 GiB > budget 1.0 GiB' says nothing)."""
    shown = format_bytes(actual), format_bytes(limit)
    return (f"{actual:,} B", f"{limit:,} B") if shown[0] == shown[1] else shown


def _count(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"
