"""Renderer of the one-screen summary (memprof.analysis.overview.Summary): JSON and the
terminal. Render only."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.table import Table

from memprof.report.labels import chain_name
from memprof.report.wording import (
    MODEL_STATE_HEADING, diverging_line, explain, finding_chain, kind_label, left_out_json, min_age_left_out,
    model_state_json, model_state_line, note_line, placement, rank_json, shown_of, unrecorded_heap,
)
from memprof.report.safe_text import escape
from memprof.units import format_bytes, format_duration_ns, format_relative_ns

if TYPE_CHECKING:
    from rich.console import Console

    from memprof.analysis.leaks import LeakFinding
    from memprof.analysis.overview import Summary
    from memprof.analysis.views import SummaryView

_GPU_LAYERS = {"cuda_block", "cuda_segment", "cuda_driver"}


def to_json(view: SummaryView) -> dict:
    """JSON-ready dict: recording, duration_ns, events, steps, lost_events, layers (peak_bytes,
    peak_ns, final_bytes, alloc_count), metrics (peak, final), findings (kind, layer,
    live_bytes, live_count, younger_count, younger_bytes, slope_bytes_per_step, confidence,
    explanation, chain: its one-line name, ranks and hosts of a distributed job's processes), not_leaks (how many, before --top), model_state (the
    model's own tensors, never findings, as `report leaks` totals them), left_out (what --min-age and
    --top left out, as `report leaks` gives it), notes (severity: "info" or "caveat", text),
    ranks (a distributed job's, each with its peak, growth per step and whether it diverges),
    advice (rule, title, change, saving, saving_bytes; `report advice` gives the evidence),
    next (command → what it shows)."""
    summary, chains, recording_path = view.result, view.chains, view.about.path
    return {
        "recording": str(recording_path),
        "duration_ns": int(summary.duration_ns),
        "events": int(summary.events),
        "steps": int(summary.steps),
        "lost_events": int(summary.lost_events),
        "layers": [{"layer": s.layer, "peak_bytes": s.peak_bytes, "peak_ns": s.peak_ns, "final_bytes": s.final_bytes,
                    "alloc_count": s.alloc_count} for s in summary.layers.layers],
        "metrics": [{"metric": m.metric, "device": m.device, "peak": m.peak, "final": m.final}
                    for m in summary.layers.metrics],
        "findings": [_finding_json(f, chains, summary) for f in summary.leaks.findings],
        "not_leaks": int(summary.leaks.not_leaks_total),
        "model_state": model_state_json(summary.leaks),
        "left_out": left_out_json(summary.leaks),
        "notes": [{"severity": getattr(note, "severity", "caveat"), "text": str(note)} for note in summary.notes],
        "ranks": _ranks_json(summary.ranks),
        "advice": [{"rule": a.rule, "title": a.title, "change": a.change, "saving": a.saving,
                    "saving_bytes": a.saving_bytes} for a in summary.advice],
        "next": dict(next_commands(summary, recording_path)),
    }


def _finding_json(finding: LeakFinding, chains: dict[int, list[dict]], summary: Summary) -> dict[str, Any]:
    return {"kind": finding.kind, "layer": finding.layer, "live_bytes": finding.live_bytes,
            "live_count": finding.live_count, "younger_count": finding.younger_count,
            "younger_bytes": finding.younger_bytes, "slope_bytes_per_step": finding.slope_bytes_per_step,
            "confidence": finding.confidence, "explanation": explain(finding, summary.leaks),
            "chain": chain_name(finding_chain(finding, chains)), "ranks": list(finding.ranks),
            "hosts": list(finding.hosts)}


def next_commands(summary: Summary, path) -> list[tuple[str, str]]:
    """(command, what it shows) for the views worth opening next on this recording."""
    where = f" {path}"
    rows = [(f"memprof report advice{where}", "the advice above, with its evidence")] if summary.advice else []
    rows += [(f"memprof report leaks{where}", "every finding, with its whole chain"),
            (f"memprof report top{where} --by function", "bytes by function, self and total")]
    if summary.steps or len(summary.layers.layers):
        rows.append((f"memprof report growth{where}", "growth fits, and when memory runs out"))
    if any(s.layer in _GPU_LAYERS for s in summary.layers.layers) or any(
            m.metric.startswith("gpu_") for m in summary.layers.metrics):
        rows.append((f"memprof report gpu{where}", "GPU memory, term by term"))
    rows += [(f"memprof report html{where} -o report.html", "timeline and flame graph, one page"),
             (f"memprof export{where} --format perfetto", "a trace for ui.perfetto.dev")]
    return rows


def render(view: SummaryView, console: Console) -> None:
    """Heading, loss warnings, one table of layers, the top findings in one line each, the
    notes, and the commands to run next. Times relative to `start_ns`."""
    summary, chains, start_ns, path = view.result, view.chains, view.about.start_ns, view.about.path
    out = lambda text, **kw: console.print(text, highlight=False, **kw)  # noqa: E731
    steps = f" · {summary.steps:,} steps" if summary.steps else ""
    out(f"[bold]memprof[/] {escape(str(path))} · {format_duration_ns(summary.duration_ns)} · "
        f"{summary.events:,} events{steps}")
    if summary.lost_events:
        out(f"[yellow]! {summary.lost_events:,} events were lost while recording (ring buffer full): "
            "peaks, ends and findings may be off by those allocations.[/]")
    if summary.layers.layers:
        console.print(_layers_table(summary, start_ns))
    else:
        out("No allocations recorded.")
    _render_findings(out, summary, chains)
    _render_ranks(out, summary)
    _render_advice(out, summary)
    for note in summary.notes:
        out(note_line(note), overflow="ellipsis", no_wrap=True)
    out("")
    out("[bold]Next[/]")
    table = Table(show_header=False, box=None, padding=(0, 2, 0, 2), highlight=False)
    table.add_column(no_wrap=True)
    table.add_column()
    for command, what in next_commands(summary, path):
        table.add_row(escape(command), escape(what))
    console.print(table)


def _layers_table(summary: Summary, start_ns: int) -> Table:
    table = Table(title="Layers (they nest: bytes are never added across them)", title_justify="left",
                  highlight=False)
    for name, justify in (("layer", "left"), ("peak", "right"), ("at", "right"), ("end", "right"),
                          ("allocations", "right")):
        table.add_column(name, justify=justify, no_wrap=True)
    for s in summary.layers.layers:
        table.add_row(escape(s.layer), format_bytes(s.peak_bytes), format_relative_ns(s.peak_ns, start_ns),
                      format_bytes(s.final_bytes), f"{s.alloc_count:,}")
    for m in summary.layers.metrics:
        # One screen: the tree's RSS/PSS, not each process's (`report layers` and JSON have those).
        if m.metric.endswith("_bytes") and m.metric != "host_memory_total_bytes" and not m.device.startswith("pid:"):
            table.add_row(f"[dim]{escape(m.metric)} {escape(m.device)}[/]", format_bytes(m.peak),
                          format_relative_ns(m.peak_ns, start_ns), format_bytes(m.final), "")
    return table


def _ranks_json(ranks) -> list[dict[str, Any]]:
    """Per rank of a distributed job: rank, host, pids, layer, peak_bytes, end_bytes,
    growth_bytes_per_step (None: too few steps), steps, diverges (why it differs from the
    others; None when it does not)."""
    if ranks is None:
        return []
    return [rank_json(rank) for rank in ranks.ranks]


def _render_ranks(out, summary: Summary) -> None:
    """A distributed job's ranks in one line, and one line per rank that differs from the others."""
    ranks = summary.ranks
    if ranks is None or len(ranks.ranks) < 2:
        return
    size = f" of {ranks.world_size}" if ranks.world_size else ""
    if len(ranks.ranks) < 3:  # of two, neither is the odd one (ranks.with_divergence): side by side
        out(f"[bold]Ranks[/]: {len(ranks.ranks)}{size}, in {escape(ranks.layer or '')}: "
            + "; ".join(_rank_use(rank, len({r.host for r in ranks.ranks}) > 1) for rank in ranks.ranks))
        return
    if not ranks.diverging:
        out(f"[bold]Ranks[/]: {len(ranks.ranks)}{size}, alike in {escape(ranks.layer or '')} (peak and growth per step); "
            "`memprof report top --by rank` for each one's bytes")
        return
    out(f"[bold]Ranks[/]: {len(ranks.ranks)}{size}; [yellow]{len(ranks.diverging)} differ from the others[/] "
        f"in {escape(ranks.layer or '')}:")
    for rank in ranks.diverging:
        out(diverging_line(rank))


def _rank_use(rank, with_host: bool) -> str:
    """'rank 1 peaks at 15.4 MiB, grows 512.0 KiB per step' (markup; 'rank 1 on node-a …'
    `with_host`)."""
    where = f" on {escape(rank.host)}" if with_host and rank.host else ""
    growth = ("" if rank.growth_bytes_per_step is None
              else f", grows {format_bytes(max(rank.growth_bytes_per_step, 0.0))} per step")
    return f"rank {rank.rank}{where} peaks at {format_bytes(rank.peak_bytes)}{growth}"


def _render_advice(out, summary: Summary) -> None:
    """One line per piece of advice: what was found, what to try, the saving."""
    if not summary.advice:
        return
    out(f"[bold]Advice[/]: {len(summary.advice)} (`memprof report advice` for the evidence)")
    for index, advice in enumerate(summary.advice, 1):
        saving = f" — {format_bytes(advice.saving_bytes)} less" if advice.saving_bytes else ""
        out(f"  {index}. {escape(advice.title)}{saving}: {escape(advice.change)}", no_wrap=True, overflow="ellipsis")


def _render_findings(out, summary: Summary, chains: dict[int, list[dict]]) -> None:
    leaks = summary.leaks
    if not leaks.findings:
        out("[green]No leaks found[/] (held at the end, or growing from step to step).")
        if heap_line := unrecorded_heap(leaks):
            out(f"[dim]{heap_line}[/]")
    else:
        shown = shown_of(len(leaks.findings), leaks.findings_total, leaks.top, "finding", "findings")
        out(f"[bold]Top leaks[/]: {shown} (`memprof report leaks` for all, with chains)")
    for index, finding in enumerate(leaks.findings, 1):
        rate = ""
        if finding.kind == "grows_per_step" and finding.slope_bytes_per_step is not None:
            unit = leaks.checkpoints.unit if leaks.checkpoints is not None else "step"
            rate = f", +{format_bytes(finding.slope_bytes_per_step)}/{unit}"
        where = f" {placement(finding)}" if finding.ranks else ""
        out(f"  {index}. {escape(finding.layer)} {kind_label(finding, leaks)}{escape(where)}: "
            f"{format_bytes(finding.live_bytes)} in {finding.live_count:,}{rate}  "
            f"{escape(chain_name(finding_chain(finding, chains)))}", no_wrap=True, overflow="ellipsis")
    if min_age_left_out(leaks):
        out(f"  [dim]{min_age_left_out(leaks)}[/]")
    if leaks.model_state:
        totals = "; ".join(model_state_line(total) for total in leaks.model_state)
        out(f"  [dim]{MODEL_STATE_HEADING.lower()}: {escape(totals)}[/]")
    if leaks.not_leaks:
        out(f"  [dim]and {leaks.not_leaks_total} chains held on purpose (caches, pools, buffers): not leaks[/]")
