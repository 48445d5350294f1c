"""Renderers of the advice (memprof.analysis.advice): JSON and the terminal. Render only."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from memprof.model.schema import FRAME_KEYS
from memprof.report.labels import NO_STACK, chain_name
from memprof.report.safe_text import escape
from memprof.units import format_bytes

if TYPE_CHECKING:
    from rich.console import Console

    from memprof.analysis.advice import Advice, RuleOutcome, Threshold
    from memprof.analysis.views import AdviceView, Chains


def to_json(view: AdviceView) -> dict:
    """JSON-ready dict: recording, lost_events, notes (the recording's); `advice`, biggest
    expected saving first, each with its rule, title, evidence, change, saving (words and
    bytes, None where not computed), chains (stack innermost frame first, and `name`, the
    chain in one line), modules, layer, device, numbers and the thresholds of its rule; and
    `rules`: every rule of the table in order, with its trigger, evidence, advice, saving,
    thresholds, what it needs, whether it fired and, when not, why."""
    result, about = view.result, view.about
    by_id = {outcome.rule.id: outcome.rule for outcome in result.outcomes}
    return {
        "recording": str(about.path),
        "lost_events": int(about.lost_events),
        "notes": [str(n) for n in about.notes],
        "advice": [advice_json(advice, view.chains, by_id[advice.rule].thresholds) for advice in result.advice],
        "rules": [_rule_json(outcome) for outcome in result.outcomes],
    }


def advice_json(advice: Advice, chains: Chains, thresholds: tuple[Threshold, ...]) -> dict[str, Any]:
    """One piece of advice as JSON (also the summary's and the HTML page's)."""
    return {
        "rule": advice.rule, "title": advice.title, "evidence": list(advice.evidence), "change": advice.change,
        "saving": advice.saving, "saving_bytes": advice.saving_bytes,
        "chains": [_chain_json(stack_id, chains) for stack_id in advice.chains],
        "modules": list(advice.modules), "layer": advice.layer, "device": advice.device,
        "numbers": dict(advice.numbers), "thresholds": [_threshold_json(t) for t in thresholds],
    }


def _chain_json(stack_id: int | None, chains: Chains) -> dict[str, Any]:
    frames = [] if stack_id is None else chains.get(stack_id, [])
    return {"stack_id": stack_id, "name": chain_name(frames) if frames else NO_STACK,
            "stack": [{key: frame.get(key) for key in FRAME_KEYS} for frame in frames]}


def _threshold_json(threshold: Threshold) -> dict[str, Any]:
    return {"name": threshold.name, "value": threshold.value, "unit": threshold.unit, "meaning": threshold.meaning}


def _rule_json(outcome: RuleOutcome) -> dict[str, Any]:
    rule, verdict = outcome.rule, outcome.verdict
    return {"id": rule.id, "title": rule.title, "trigger": rule.trigger, "evidence": rule.evidence,
            "advice": rule.advice, "saving": rule.saving, "needs": rule.needs or None,
            "thresholds": [_threshold_json(t) for t in rule.thresholds],
            "fired": bool(verdict.advice), "why_not": verdict.why_not}


# ---- the terminal ------------------------------------------------------------------------------

def render(view: AdviceView, console: Console) -> None:
    """The recording's notes; each piece of advice (title, evidence, the chains it names, the
    change to try, the saving, its rule's thresholds); then one line per rule that gave none,
    with why."""
    result, about = view.result, view.about
    out = lambda text: console.print(text, highlight=False)  # noqa: E731
    if about.lost_events:
        out(f"[yellow]! {about.lost_events:,} events were lost while recording (ring buffer): figures may miss them.[/]")
    for note in about.notes:
        out(f"[dim]note: {escape(str(note))}[/]")
    by_id = {outcome.rule.id: outcome.rule for outcome in result.outcomes}
    if not result.advice:
        out(f"No advice: none of the {len(result.outcomes)} rules found its pattern in this recording.")
    for number, advice in enumerate(result.advice, 1):
        render_advice(advice, view.chains, by_id[advice.rule].thresholds, console, number)
    quiet = [outcome for outcome in result.outcomes if not outcome.verdict.advice]
    if quiet:
        out("[bold]Rules that gave no advice[/]")
        for outcome in quiet:
            out(f"  [dim]{escape(outcome.rule.id)}: {escape(outcome.verdict.why_not or '')}[/]")
        out("[dim]`memprof report advice --format json` lists every rule with its thresholds.[/]")


def render_advice(advice: Advice, chains: Chains, thresholds: tuple[Threshold, ...], console: Console,
                  number: int) -> None:
    """One piece of advice on the terminal (also the summary's section)."""
    out = lambda text: console.print(text, highlight=False)  # noqa: E731
    out(f"[bold]{number}. {escape(advice.title)}[/]  [dim]({escape(advice.rule)})[/]")
    for line in advice.evidence:
        out(f"   {escape(line)}")
    for stack_id in advice.chains:
        frames = [] if stack_id is None else chains.get(stack_id, [])
        out(f"   [dim]chain:[/] {escape(chain_name(frames) if frames else NO_STACK)}")
    for module in advice.modules:
        out(f"   [dim]module:[/] {escape(module)}")
    out(f"   [green]try:[/] {escape(advice.change)}")
    out(f"   [green]saving:[/] {escape(_saving_text(advice))}")
    if thresholds:
        out("   [dim]thresholds: " + escape("; ".join(_threshold_text(t) for t in thresholds)) + "[/]")
    out("")


def _saving_text(advice: Advice) -> str:
    """The saving in words, with its figure after them where the words do not give it
    already (appended to words that do, it read as the last clause's: "30.7 MiB if it is
    float32 (20.5 MiB)")."""
    if advice.saving_bytes is None or format_bytes(advice.saving_bytes) in advice.saving:
        return advice.saving
    return f"{advice.saving} ({format_bytes(advice.saving_bytes)})"


def _threshold_text(threshold: Threshold) -> str:
    value = format_bytes(int(threshold.value)) if threshold.unit == "bytes" else f"{threshold.value:g} {threshold.unit}"
    return f"{threshold.name} = {value} ({threshold.meaning})"
