"""Renderers of the per-layer summary (memprof.analysis.layers): JSON and the terminal. Render only."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.table import Table

from memprof.model.schema import FRAME_KEYS
from memprof.report.labels import one_line  # one chain in one line, allocator frames skipped
from memprof.report.safe_text import escape
from memprof.units import format_bytes, format_relative_ns

if TYPE_CHECKING:
    from rich.console import Console

    from memprof.analysis.layers import ChainBytes, LayerStats, MetricStats
    from memprof.analysis.views import LayersView


def to_json(view: LayersView) -> dict:
    """JSON-ready dict: recording, lost_events, notes, layers (each with top_chains and their
    stacks, innermost frame first) and metrics. Times are CLOCK_MONOTONIC ns, sizes bytes."""
    summary, chains, about = view.result, view.chains, view.about
    recording_path, lost_events, notes = about.path, about.lost_events, about.notes
    return {
        "recording": str(recording_path),
        "lost_events": int(lost_events),
        "notes": [str(n) for n in notes],
        "layers": [_layer_json(stats, chains) for stats in summary.layers],
        "metrics": [_metric_json(m) for m in summary.metrics],
    }


def _layer_json(stats: LayerStats, chains: dict[int, list[dict]]) -> dict[str, Any]:
    return {
        "layer": stats.layer,
        "peak_bytes": int(stats.peak_bytes),
        "peak_ns": int(stats.peak_ns),
        "final_bytes": int(stats.final_bytes),
        "alloc_count": int(stats.alloc_count),
        "top_chains": [{
            "stack_id": chain.stack_id,
            "live_bytes": int(chain.live_bytes),
            "live_count": int(chain.live_count),
            "stack": [{key: frame.get(key) for key in FRAME_KEYS} for frame in _frames(chain, chains)],
        } for chain in stats.top_chains],
    }


def _metric_json(metric: MetricStats) -> dict[str, Any]:
    return {"metric": metric.metric, "device": metric.device, "peak": float(metric.peak),
            "peak_ns": int(metric.peak_ns), "final": float(metric.final)}


def render(view: LayersView, console: Console) -> None:
    """Print one table per layer (peak, when, final, allocations), each followed by the chains
    that held the most at its peak, then one table of the sampled metrics. Times are shown
    relative to `start_ns` (recording start)."""
    summary, chains, about = view.result, view.chains, view.about
    start_ns, lost_events, notes = about.start_ns, about.lost_events, about.notes
    out = lambda text, **kw: console.print(text, highlight=False, **kw)  # noqa: E731
    if lost_events:
        out(f"[yellow]! {lost_events:,} events were lost while recording (ring buffer): the curves below "
            "miss them, so peaks and finals may be off by those allocations.[/]")
    for note in notes:
        out(f"[dim]note: {escape(str(note))}[/]")
    if not summary.layers:
        out("No allocations recorded.")
    for stats in summary.layers:
        console.print(_layer_table(stats, start_ns))
        for line in _chain_lines(stats.top_chains, chains):
            out(line, no_wrap=True, overflow="ellipsis")
        out("")
    if summary.metrics:
        console.print(_metrics_table(summary.metrics, start_ns))


def _layer_table(stats: LayerStats, start_ns: int) -> Table:
    table = Table(title=f"[bold]{escape(stats.layer)}[/]", title_justify="left", highlight=False)
    for name in ("peak", "at", "final", "allocations"):
        table.add_column(name, justify="right")
    table.add_row(format_bytes(stats.peak_bytes), format_relative_ns(stats.peak_ns, start_ns),
                  format_bytes(stats.final_bytes), f"{stats.alloc_count:,}")
    return table


def _chain_lines(top: list[ChainBytes], chains: dict[int, list[dict]]) -> list[str]:
    if not top:
        return []
    lines = ["  held most at the peak:"]
    for index, chain in enumerate(top, 1):
        count = f"{chain.live_count:,} allocation{'s' if chain.live_count != 1 else ''}"
        lines.append(f"  {index}. {format_bytes(chain.live_bytes)} in {count}  {one_line(_frames(chain, chains))}")
    return lines


def _metrics_table(metrics: list[MetricStats], start_ns: int) -> Table:
    table = Table(title="[bold]samples[/]", title_justify="left", highlight=False)
    for name, justify in (("metric", "left"), ("device", "left"), ("peak", "right"), ("at", "right"),
                          ("final", "right")):
        table.add_column(name, justify=justify)
    for m in metrics:
        table.add_row(escape(m.metric), escape(m.device), _value(m.metric, m.peak),
                      format_relative_ns(m.peak_ns, start_ns), _value(m.metric, m.final))
    return table


def _value(metric: str, value: float) -> str:
    """Bytes in binary units for `*_bytes` metrics; other metrics as plain numbers."""
    return format_bytes(value) if metric.endswith("_bytes") else f"{value:g}"


def _frames(chain: ChainBytes, chains: dict[int, list[dict]]) -> list[dict]:
    return [] if chain.stack_id is None else chains.get(chain.stack_id, [])
