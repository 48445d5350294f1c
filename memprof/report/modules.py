"""Renderers of `report modules` (memprof.analysis.module_use): JSON and the terminal.
Render only: every number comes from the analysis."""
from __future__ import annotations

from typing import TYPE_CHECKING

from rich import box
from rich.table import Table

from memprof.report.labels import module_label
from memprof.report.safe_text import escape
from memprof.report.wording import MODULES_NOT_TRACKED
from memprof.units import format_bytes, format_relative_ns

if TYPE_CHECKING:
    from rich.console import Console

    from memprof.analysis.module_use import LayerModules, ModuleUse
    from memprof.analysis.views import ModulesView


def to_json(view: ModulesView) -> dict:
    """JSON-ready dict: recording, lost_events, notes, tracked, and per layer peak_ns, end_ns
    (CLOCK_MONOTONIC ns), peak_bytes and its modules (module: the path, "" the outermost
    module, null no module; calls; allocated_bytes, allocated_count, bytes_per_call;
    peak_bytes, end_bytes) and modules_left_out."""
    result, about = view.result, view.about
    return {"recording": str(about.path), "lost_events": int(about.lost_events), "notes": [str(n) for n in about.notes],
            "tracked": bool(result.tracked), "layers": [_layer_json(layer) for layer in result.layers]}


def _layer_json(layer: LayerModules) -> dict:
    return {"layer": layer.layer, "peak_ns": int(layer.peak_ns), "end_ns": int(layer.end_ns),
            "peak_bytes": int(layer.peak_bytes), "modules": [_module_json(m) for m in layer.modules],
            "modules_left_out": int(layer.left_out)}


def _module_json(row: ModuleUse) -> dict:
    return {"module": row.module, "calls": row.calls, "allocated_bytes": int(row.allocated_bytes),
            "allocated_count": int(row.allocated_count), "bytes_per_call": row.bytes_per_call,
            "peak_bytes": int(row.peak_bytes), "end_bytes": int(row.end_bytes)}


def render(view: ModulesView, console: Console) -> None:
    """One table per layer: its modules, most held at the layer's peak first."""
    result, about = view.result, view.about
    out = lambda text: console.print(text, highlight=False)  # noqa: E731
    out("Per nn.Module (the innermost running on the allocating thread), per layer: its calls, what it "
        "allocated, and what of that was live at the layer's peak and at the end")
    if not result.tracked:
        out(f"[yellow]! {escape(MODULES_NOT_TRACKED)}[/]")
    for layer in result.layers:
        out("")
        out(f"[bold]{escape(layer.layer)}[/]  peak {format_bytes(layer.peak_bytes)} at "
            f"{format_relative_ns(layer.peak_ns, about.start_ns)}, end at {format_relative_ns(layer.end_ns, about.start_ns)}")
        console.print(_table(layer))
        if layer.left_out:
            out(f"  … and {layer.left_out:,} more modules")
    for note in about.notes:
        out(f"[dim]note: {escape(str(note))}[/]")


def _table(layer: LayerModules) -> Table:
    table = Table(highlight=False, box=box.SIMPLE_HEAD)
    for name in ("at peak", "at end", "allocated", "calls", "per call"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("module", no_wrap=True, overflow="ellipsis")
    for row in layer.modules:
        table.add_row(format_bytes(row.peak_bytes), format_bytes(row.end_bytes), format_bytes(row.allocated_bytes),
                      "–" if row.calls is None else f"{row.calls:,}",
                      "–" if row.bytes_per_call is None else format_bytes(int(round(row.bytes_per_call))),
                      escape(module_label(row.module)))
    return table
