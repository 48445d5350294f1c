"""Renderers of leak findings (memprof.analysis.leaks): JSON and the terminal. Render only."""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from memprof.analysis.caches import is_agent_file
from memprof.analysis.loss import name_processes
from memprof.model.schema import FRAME_KEYS
from memprof.report.labels import chain_name, frame_label, in_module
from memprof.report.safe_text import escape
from memprof.report.wording import (
    MODEL_STATE_HEADING, MODEL_STATE_WHY, counted, explain, finding_chain, kind_label, left_out_json, min_age_left_out,
    model_state_json, model_state_line, note_line, placement, short_duration, shown_of, target_exited, unrecorded_heap,
)
from memprof.units import format_bytes, format_relative_ns

if TYPE_CHECKING:
    from rich.console import Console

    from memprof.analysis.leaks import LeakFinding, LeakResult
    from memprof.analysis.views import LeaksView

MAX_FRAMES = 12


def to_json(view: LeaksView) -> dict:
    """JSON-ready dict: recording, lost_events, notes (what qualifies the whole recording:
    a fold, an unfinished recording, …), findings (leaks: held at the end or growing
    per step, each named in one line as every view names it, with stacks innermost frame
    first, the ranks and hosts its allocations came from in a distributed job (else []) and
    the younger allocations of its chain that --min-age left out), not_leaks
    (memory held on purpose, same keys), model_state (the model's own tensors live at the
    end, never findings: role, layer, device, count, live_bytes per role, layer and device),
    checkpoints (where trends were judged, or null),
    missed_frees, unconfirmed_frees, min_age_ns, end_ns, and left_out (what the filters cut:
    younger_count/younger_bytes live at the end but younger than min_age_ns, `top` and the
    findings_total/not_leaks_total it cut from), and heap_recorded (whether the C library's
    heap was recorded: without it a leak there is in no finding; null when unknown), and
    unseen_tasks (the processes no probe ran under: pid, comm, threads, switches; a finding's
    may_be_freed_unseen says it is kernel memory that outlived the target in such a
    recording, which the kernel may have freed unseen). Times
    are CLOCK_MONOTONIC ns, slopes bytes per step (or window) and bytes per second."""
    result, chains, about = view.result, view.chains, view.about
    recording_path, lost_events = about.path, about.lost_events
    return {
        "recording": str(recording_path),
        "lost_events": int(lost_events),
        "notes": [str(n) for n in about.notes],
        "checkpoints": _checkpoints_json(result),
        "findings": [_finding_json(f, chains, result) for f in result.findings],
        "not_leaks": [_finding_json(f, chains, result) for f in result.not_leaks],
        "model_state": model_state_json(result),
        "missed_frees": {str(k): int(v) for k, v in result.missed_frees.items()},
        "unconfirmed_frees": {str(k): int(v) for k, v in result.unconfirmed_frees.items()},
        "min_age_ns": int(result.min_age_ns),
        "end_ns": int(result.end_ns),
        "left_out": left_out_json(result),
        "heap_recorded": result.heap_recorded,
        "unseen_tasks": result.unseen_tasks,
    }


def _checkpoints_json(result: LeakResult) -> dict | None:
    checkpoints = result.checkpoints
    if checkpoints is None:
        return None
    return {"by": checkpoints.unit, "count": len(checkpoints.times_ns), "period_ns": int(checkpoints.period_ns)}


def _finding_json(finding: LeakFinding, chains: dict[int, list[dict]], result: LeakResult) -> dict[str, Any]:
    return {
        "layer": finding.layer,
        "name": chain_name(finding_chain(finding, chains)),
        "kind": finding.kind,
        "reason": finding.reason,
        "explanation": explain(finding, result),
        "slope_bytes_per_step": finding.slope_bytes_per_step,
        "slope_bytes_per_s": finding.slope_bytes_per_s,
        "confidence": finding.confidence,
        "live_bytes": int(finding.live_bytes),
        "live_count": int(finding.live_count),
        "younger_count": int(finding.younger_count),
        "younger_bytes": int(finding.younger_bytes),
        "first_ns": int(finding.first_ns),
        "last_ns": int(finding.last_ns),
        "growth_bytes_per_s": float(finding.growth_bytes_per_s),
        "released_at_exit": bool(finding.released_at_exit),
        "released_before_end": bool(finding.released_before_end),
        "module": finding.module,
        "ranks": list(finding.ranks),
        "hosts": list(finding.hosts),
        "within_slope_bytes_per_step": finding.within_slope_bytes_per_step,
        "confirmed": bool(finding.confirmed),
        "chain_missed_frees": int(finding.chain_missed_frees),
        "may_be_freed_unseen": result.may_be_freed_unseen(finding),
        "stack": [{key: frame.get(key) for key in FRAME_KEYS} for frame in finding_chain(finding, chains)],
        # False: the chain has no Python frames (the eBPF sources record kernel and native
        # frames only), not that no Python code was involved.
        "python_frames": any(frame.get("kind") == "python" for frame in finding_chain(finding, chains)),
    }


def render(view: LeaksView, console: Console) -> None:
    """Print the findings: a heading, what loss means for them, one block per leak with its
    top MAX_FRAMES frames, then memory held on purpose (not leaks), apart. Times are shown
    relative to `start_ns` (recording start)."""
    result, chains, about = view.result, view.chains, view.about
    start_ns, lost_events, notes = about.start_ns, about.lost_events, about.notes
    out = lambda text, **kw: console.print(text, highlight=False, **kw)  # noqa: E731
    out(_heading(result, start_ns))
    younger = min_age_left_out(result)
    if younger:
        out(f"[dim]{younger}[/]")
    for warning, changes_results in _warnings(result, lost_events):
        out(f"[yellow]! {escape(warning)}[/]" if changes_results else f"[dim]note: {escape(warning)}[/]")
    if not result.findings:
        out(f"No leaks: nothing older than {short_duration(result.min_age_ns)} was live at the end"
            + (", and no chain grew from step to step." if result.checkpoints is not None else "."))
        if heap_line := unrecorded_heap(result):
            out(f"[dim]{heap_line}[/]")
    _render_blocks(out, result.findings, "#", result, chains, start_ns)
    _render_model_state(out, result)
    if result.not_leaks:
        out("")
        out(f"[bold]Not leaks[/]: memory held on purpose, "
            f"{shown_of(len(result.not_leaks), result.not_leaks_total, result.top, 'chain', 'chains')}")
        _render_blocks(out, result.not_leaks, "~", result, chains, start_ns)
    for note in notes:
        out(note_line(note))


def _render_model_state(out, result: LeakResult) -> None:
    """The model state totals, apart from the findings: one line per role, layer and device."""
    if not result.model_state:
        return
    out("")
    out(f"[bold]{MODEL_STATE_HEADING}[/]: {MODEL_STATE_WHY}")
    for total in result.model_state:
        out(f"    {escape(model_state_line(total))}")


def _render_blocks(out, findings, mark: str, result: LeakResult, chains, start_ns: int) -> None:
    for index, finding in enumerate(findings, 1):
        out("")
        for line in _finding_lines(f"{mark}{index}", finding, finding_chain(finding, chains), start_ns, result):
            out(line, no_wrap=True, overflow="ellipsis")


def _heading(result: LeakResult, start_ns: int) -> str:
    why = "the target began to exit" if target_exited(result) else "end of recording"
    count = shown_of(len(result.findings), result.findings_total, result.top, "finding", "findings")
    return (f"[bold]Leaks[/] at {format_relative_ns(result.end_ns, start_ns)} ({why}), allocations older than "
            f"{short_duration(result.min_age_ns)}{_trend_basis(result)}: {count}")


def _trend_basis(result: LeakResult) -> str:
    checkpoints = result.checkpoints
    if checkpoints is None:
        return ""
    if checkpoints.by_step:
        return f"; growth judged over {len(checkpoints.times_ns)} steps"
    return (f"; growth judged over {len(checkpoints.times_ns)} windows of "
            f"{short_duration(int(checkpoints.period_ns))} (no step marks)")


def _warnings(result: LeakResult, lost_events: int) -> list[tuple[str, bool]]:
    """(text, whether it changes the findings below) for each kind of loss."""
    warnings = []
    if lost_events > 0:
        warnings.append((f"{counted(lost_events, 'event was', 'events were')} lost while recording (ring buffer "
                         "full): some allocations below may have been freed, and some leaks may be missing.", True))
    skipped = sum(result.unconfirmed_frees.values())
    if skipped > 0:
        warnings.append((f"{counted(skipped, 'free was', 'frees were')} skipped by the kernel while recording"
                         f"{_by_layer(result.unconfirmed_frees)}; up to {skipped} of the allocations below "
                         "may have been freed.", True))
    missed = sum(result.missed_frees.values())
    if missed > 0:
        warnings.append(_unseen_frees(result, missed))
    return warnings


def _unseen_frees(result: LeakResult, missed: int) -> tuple[str, bool]:
    """What frees that were never seen mean for the findings, and whether to act."""
    whose = "its address was" if missed == 1 else "their addresses were"
    where = (", or on the time of a process no probe ran under (see the notes)," if result.unseen_tasks else "")
    what = (f"{counted(missed, 'free was', 'frees were')} never seen{_by_layer(result.missed_frees)}: {whose} "
            f"handed out again while still counted live (the kernel frees some memory in bulk{where} where its "
            "probes cannot see), so memprof closed those allocations itself.")
    unconfirmed = sum(1 for f in result.findings if not f.confirmed)
    unseen = sum(1 for f in result.findings if f.confirmed and result.may_be_freed_unseen(f))
    if not unconfirmed and not unseen:
        return f"{what} None of the findings below is affected: nothing to do.", False
    affected = []
    if unconfirmed:
        affected.append(f"{counted(unconfirmed, 'finding below is', 'findings below are')} marked unconfirmed: "
                        f"{'its size is' if unconfirmed == 1 else 'their sizes are'} an upper bound, as some of "
                        f"{'its' if unconfirmed == 1 else 'their'} allocations may already be free.")
    if unseen:
        affected.append(f"{counted(unseen, 'other finding is', 'other findings are')} kernel memory that outlived "
                        "the target where frees went unseen (marked 'may be freed unseen'): "
                        f"{'it' if unseen == 1 else 'they'} may already be free.")
    return (f"{what} {' '.join(affected)} This is not a fault of your program; trust such a finding once it also "
            "grows from step to step.", True)


def _finding_lines(label: str, finding: LeakFinding, chain: list[dict], start_ns: int, result: LeakResult) -> list[str]:
    if finding.released_at_exit:
        fate = "released at exit"
    elif finding.released_before_end:
        fate = "released before the end"
    else:
        fate = "outlived the process" if target_exited(result) else "still live when the recording stopped"
    kind = kind_label(finding, result)
    lines = [
        f"[bold]{label} {escape(finding.layer)}[/]  {kind}  {format_bytes(finding.live_bytes)} in "
        f"{counted(finding.live_count, 'allocation', 'allocations')}  ·  {fate}",
        f"    first seen {_seen(finding.first_ns, start_ns)}, last seen {_seen(finding.last_ns, start_ns)}"
        + _rate(finding, result),
        f"    [dim]why:[/] {escape(explain(finding, result))}",
    ]
    if finding.module is not None:
        lines.append(f"    allocated{escape(in_module(finding.module))}")
    if finding.ranks:
        lines.append(f"    {escape(placement(finding))}")
    if finding.younger_count:
        lines.append(f"    [dim]+ {counted(finding.younger_count, 'younger allocation', 'younger allocations')} of "
                     f"this chain ({format_bytes(finding.younger_bytes)}) not counted: made less than "
                     f"{short_duration(result.min_age_ns)} before the end (--min-age)[/]")
    if not finding.confirmed:
        lines.append(f"    [yellow]unconfirmed[/]: {counted(finding.chain_missed_frees, 'free', 'frees')} of this "
                     "chain went unseen (its address was handed out again), so some of these may already be free")
    if result.may_be_freed_unseen(finding):
        who = escape(name_processes(result.unseen_tasks))
        lines.append(f"    [yellow]may be freed unseen[/]: no probe ran while {who} had a CPU (see the notes)")
    if not chain:
        return lines + ["    (no stack recorded)"]
    for item in _visible(chain):
        text = f"… {counted(item, 'more frame', 'more frames')}" if isinstance(item, int) else escape(frame_label(item))
        lines.append(f"    {text}")
    if _through_interpreter(chain) and not any(frame.get("kind") == "python" for frame in chain):
        lines.append(f"    [dim](no Python frames: {_NO_PYTHON_FRAMES[result.python_frames]})[/]")
    return lines


# Why a chain through the interpreter has no Python frames, by LeakResult.python_frames: the
# frames were read (as `memprof doctor` says), they were not for some interpreter, unknown.
_NO_PYTHON_FRAMES = {
    True: "its thread ran no Python code then",
    False: "not read for every interpreter in this recording; see the notes",
    None: "its thread ran no Python code then, or its frames were not read",
}


def _seen(ts_ns: int, start_ns: int) -> str:
    """A time relative to the recording's start ('+1.25s'), or 'before the recording began'
    (an attached process's allocations made before the probes were placed, seen since)."""
    return "before the recording began" if ts_ns < start_ns else format_relative_ns(ts_ns, start_ns)


def _rate(finding: LeakFinding, result: LeakResult) -> str:
    if finding.kind == "grows_per_step" and finding.slope_bytes_per_step is not None:
        unit = result.checkpoints.unit if result.checkpoints is not None else "step"
        per_s = f" ({format_bytes(finding.slope_bytes_per_s)}/s)" if finding.slope_bytes_per_s is not None else ""
        return f", growing {format_bytes(finding.slope_bytes_per_step)}/{unit}{per_s}"
    if finding.kind == "held_at_end":
        return f", growing {format_bytes(finding.growth_bytes_per_s)}/s"
    return ""


def _visible(chain: list[dict]) -> list[dict | int]:
    """At most MAX_FRAMES frames, in order, with the count of frames left out where a gap is
    (an int). A long chain keeps its innermost frames and up to MAX_FRAMES // 2 of its
    Python frames (what the user acts on): the program's own first (`_is_programs_own`: a
    GPT-2 chain's 30 frames of torch and transformers hid the one line of the user's that
    called `generate`), then the innermost others."""
    if len(chain) <= MAX_FRAMES:
        return list(chain)
    python = [i for i, frame in enumerate(chain) if frame.get("kind") == "python"]
    own = [i for i in python if _is_programs_own(chain[i].get("file"))]
    tail: list[int] = []
    for i in own + python:
        if len(tail) == MAX_FRAMES // 2:
            break
        if i >= MAX_FRAMES - MAX_FRAMES // 2 and i not in tail:
            tail.append(i)
    head = MAX_FRAMES - len(tail)  # one innermost frame less for each Python frame kept from further out
    kept = list(range(head)) + sorted(i for i in tail if i >= head)
    out: list[dict | int] = []
    for before, index in zip([-1] + kept, kept):
        if index - before > 1:
            out.append(index - before - 1)
        out.append(chain[index])
    if kept[-1] < len(chain) - 1:
        out.append(len(chain) - 1 - kept[-1])
    return out


def _is_programs_own(file: str | None) -> bool:
    """A Python frame's file is the program's own: not an installed package's or the standard
    library's (under a lib/python3.X/ folder: site-packages, dist-packages, the stdlib), not
    frozen, and not memprof's agent (whose hook around `import torch` is in every chain of
    that import)."""
    return bool(file) and not file.startswith("<") and re.search(r"/lib/python3\.\d+/", file) is None \
        and not is_agent_file(file)


def _through_interpreter(chain: list[dict]) -> bool:
    """The chain ran through a Python interpreter (its native frames are in python3.X or
    libpython3.X), or is one of torch's (stopped inside libtorch, which Python drives)."""
    modules = (str(frame.get("module") or "") for frame in chain if frame.get("kind") == "native")
    return any(m.startswith(("python", "libpython", "libtorch", "libc10")) for m in modules)


def _by_layer(counts: dict[str, int]) -> str:
    nonzero = {k: v for k, v in counts.items() if v}
    if len(nonzero) < 2:
        return f" ({next(iter(nonzero))})" if nonzero else ""
    return " (" + ", ".join(f"{layer} {n}" for layer, n in nonzero.items()) + ")"
