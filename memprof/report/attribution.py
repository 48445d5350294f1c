"""Renderers of attribution results (memprof.analysis.attribution): JSON, the terminal and
folded stacks for flame-graph tools. Render only: every number comes from the analysis."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.table import Table

from memprof.model.schema import FRAME_KEYS, LAYERS
from memprof.report.labels import NO_STACK_FRAME, frame_label, module_label, one_line  # one place for every view
from memprof.report.safe_text import escape, visible
from memprof.report.wording import MODULES_NOT_TRACKED
from memprof.units import format_bytes, format_relative_ns

if TYPE_CHECKING:
    from rich.console import Console

    from memprof.analysis.attribution import Attribution, CategoryRow, FunctionRow, LayerLive, ModuleRow, RankRow
    from memprof.analysis.layers import ChainBytes
    from memprof.analysis.views import AttributionView

_NOUNS = {"chain": ("chain", "chains"), "function": ("function", "functions"), "category": ("category", "categories"),
          "module": ("module", "modules"), "rank": ("rank", "ranks")}


# --- JSON -------------------------------------------------------------------------------------

def to_json(view: AttributionView) -> dict:
    """JSON-ready dict: recording, by, at, the span (start_ns, end_ns, recording_end_ns,
    target_exited), lost_events, notes, and per layer ts_ns, live_bytes, live_count, rows
    (chains carry their stack, innermost frame first) and rows_left_out. Times are
    CLOCK_MONOTONIC ns, sizes bytes; layers are never summed."""
    result, chains, about = view.result, view.chains, view.about
    recording_path, lost_events, notes = about.path, about.lost_events, about.notes
    span = result.span
    return {
        "recording": str(recording_path), "by": result.by, "at": result.at,
        "start_ns": int(span.start_ns), "end_ns": int(span.end_ns), "recording_end_ns": int(span.recording_end_ns),
        "target_exited": bool(span.target_exited), "lost_events": int(lost_events), "notes": [str(n) for n in notes],
        "layers": [_layer_json(layer, result.by, chains) for layer in result.layers],
        **({"modules_tracked": modules_tracked(result)} if result.by == "module" else {}),
    }


def modules_tracked(result: Attribution) -> bool:
    """By module: whether any row names a module (else the recording has no module
    boundaries: record --torch-modules was not asked for)."""
    return any(getattr(row, "module", None) is not None for layer in result.layers for row in layer.rows)


def _layer_json(layer: LayerLive, by: str, chains: dict[int, list[dict]]) -> dict[str, Any]:
    row_json = {"chain": lambda row: _chain_json(row, chains), "function": _function_json,
                "category": _category_json, "module": _module_json, "rank": _rank_json}.get(by)
    return {"layer": layer.layer, "ts_ns": int(layer.ts_ns), "live_bytes": int(layer.live_bytes),
            "live_count": int(layer.live_count), "rows": [row_json(row) for row in layer.rows] if row_json else [],
            "rows_left_out": int(layer.rows_left_out)}


def _chain_json(row: ChainBytes, chains: dict[int, list[dict]]) -> dict[str, Any]:
    return {"stack_id": row.stack_id, "live_bytes": int(row.live_bytes), "live_count": int(row.live_count),
            "stack": [{key: frame.get(key) for key in FRAME_KEYS} for frame in _frames(row.stack_id, chains)]}


def _function_json(row: FunctionRow) -> dict[str, Any]:
    return {"kind": row.kind, "function": row.function, "module": row.module, "file": row.file,
            "self_bytes": int(row.self_bytes), "self_count": int(row.self_count),
            "total_bytes": int(row.total_bytes), "total_count": int(row.total_count)}


def _category_json(row: CategoryRow) -> dict[str, Any]:
    return {"category": row.category, "live_bytes": int(row.live_bytes), "live_count": int(row.live_count)}


def _module_json(row: ModuleRow) -> dict[str, Any]:
    return {"module": row.module, "live_bytes": int(row.live_bytes), "live_count": int(row.live_count)}


# --- the terminal -------------------------------------------------------------------------------

def render(view: AttributionView, console: Console) -> None:
    """Print a heading saying when each layer is judged, then one table per layer (or, by
    layer, one table of every layer side by side). Times relative to the recording's start."""
    result, chains, lost_events, notes = view.result, view.chains, view.about.lost_events, view.about.notes
    out = lambda text, **kw: console.print(text, highlight=False, **kw)  # noqa: E731
    out(_heading(result))
    out("[dim]Layers nest (a tensor lives in the heap, a slab in pages): their bytes are never added.[/]")
    if lost_events:
        out(f"[yellow]! {lost_events:,} events were lost while recording (ring buffer): some allocations "
            "shown live may have been freed, and some may be missing.[/]")
    if result.by == "module" and not modules_tracked(result):
        out(f"[yellow]! {escape(MODULES_NOT_TRACKED)}[/]")
    if not result.layers:
        out("No allocations recorded.")
    elif result.by == "layer":
        console.print(_layers_table(result))
    else:
        for layer in result.layers:
            out("")
            out(_layer_title(result, layer), no_wrap=True, overflow="ellipsis")
            console.print(_rows_table(result, layer, chains))
            for line in _left_out(result, layer):
                out(line)
    for note in notes:
        out(f"[dim]note: {escape(str(note))}[/]")


def _heading(result: Attribution) -> str:
    span = result.span
    if result.at == "peak":
        when = "each layer's own peak (first reached)"
    elif result.at == "end":
        why = "the target began to exit" if span.target_exited else "end of recording"
        when = f"the end, {format_relative_ns(span.end_ns, span.start_ns)} ({why})"
    else:
        when = format_relative_ns(result.layers[0].ts_ns, span.start_ns) if result.layers else "the given time"
    what = "Live bytes per layer" if result.by == "layer" else f"Live bytes by {result.by}"
    return f"[bold]{what}[/] at {when}"


def _layers_table(result: Attribution) -> Table:
    table = Table(highlight=False)
    for name, justify in (("layer", "left"), ("at", "right"), ("live", "right"), ("allocations", "right")):
        table.add_column(name, justify=justify)
    for layer in result.layers:
        table.add_row(escape(layer.layer), format_relative_ns(layer.ts_ns, result.span.start_ns),
                      format_bytes(layer.live_bytes), f"{layer.live_count:,}")
    return table


def _layer_title(result: Attribution, layer: LayerLive) -> str:
    peak = " (its peak)" if result.at == "peak" else ""
    return (f"[bold]{escape(layer.layer)}[/]  {format_bytes(layer.live_bytes)} in "
            f"{_count(layer.live_count, 'allocation', 'allocations')} at "
            f"{format_relative_ns(layer.ts_ns, result.span.start_ns)}{peak}")


def _left_out(result: Attribution, layer: LayerLive) -> list[str]:
    one, many = _NOUNS[result.by]
    return [f"  … and {_count(layer.rows_left_out, 'more ' + one, 'more ' + many)}"] if layer.rows_left_out else []


def _rows_table(result: Attribution, layer: LayerLive, chains: dict[int, list[dict]]) -> Table:
    table = Table(highlight=False)
    columns, cells = _VIEWS[result.by]
    for name, justify in columns:
        table.add_column(name, justify=justify, no_wrap=name in ("chain", "function"), overflow="ellipsis")
    for index, row in enumerate(layer.rows, 1):
        table.add_row(str(index), *cells(row, layer, chains))
    if not layer.rows:
        table.add_row("", *["" for _ in columns[1:-1]], "(nothing live)")
    return table


def _chain_cells(row: ChainBytes, layer: LayerLive, chains: dict[int, list[dict]]) -> list[str]:
    return [format_bytes(row.live_bytes), f"{row.live_count:,}", _share(row.live_bytes, layer.live_bytes),
            one_line(_frames(row.stack_id, chains))]


def _function_cells(row: FunctionRow, layer: LayerLive, chains: dict[int, list[dict]]) -> list[str]:
    name = "(no stack recorded)" if row.kind is None else escape(frame_label(
        {"kind": row.kind, "function": row.function, "module": row.module, "file": row.file}))
    return [format_bytes(row.self_bytes), format_bytes(row.total_bytes), _share(row.total_bytes, layer.live_bytes),
            f"{row.total_count:,}", name]


def _category_cells(row: CategoryRow, layer: LayerLive, chains: dict[int, list[dict]]) -> list[str]:
    return [format_bytes(row.live_bytes), f"{row.live_count:,}", _share(row.live_bytes, layer.live_bytes),
            escape(row.category)]


def _rank_json(row: RankRow) -> dict[str, Any]:
    return {"rank": row.rank, "live_bytes": int(row.live_bytes), "live_count": int(row.live_count)}


def _rank_cells(row: RankRow, layer: LayerLive, chains: dict[int, list[dict]]) -> list[str]:
    return [format_bytes(row.live_bytes), f"{row.live_count:,}", _share(row.live_bytes, layer.live_bytes),
            escape(row.rank)]


def _module_cells(row: ModuleRow, layer: LayerLive, chains: dict[int, list[dict]]) -> list[str]:
    return [format_bytes(row.live_bytes), f"{row.live_count:,}", _share(row.live_bytes, layer.live_bytes),
            escape(module_label(row.module))]


_R, _L = "right", "left"
_VIEWS = {
    "chain": ((("#", _R), ("live", _R), ("allocations", _R), ("share", _R), ("chain", _L)), _chain_cells),
    "function": ((("#", _R), ("self", _R), ("total", _R), ("share", _R), ("allocations", _R), ("function", _L)),
                 _function_cells),
    "category": ((("#", _R), ("live", _R), ("allocations", _R), ("share", _R), ("category", _L)), _category_cells),
    "module": ((("#", _R), ("live", _R), ("allocations", _R), ("share", _R), ("module", _L)), _module_cells),
    "rank": ((("#", _R), ("live", _R), ("allocations", _R), ("share", _R), ("rank", _L)), _rank_cells),
}


# --- folded stacks ------------------------------------------------------------------------------

def folded_stacks(result: Attribution, chains: dict[int, list[dict]]) -> list[str]:
    """Lines `layer;outermost;…;innermost BYTES` for flame-graph tools (flamegraph.pl, inferno,
    speedscope), from a by-chain result: the layer is the root frame, chains without frames
    read `layer;[no stack]`, chains with no live bytes are left out. Chains that read the same
    once rendered make one line. Layers in schema order, then biggest first."""
    weights: dict[tuple[str, str], int] = {}
    for layer in result.layers:
        for row in layer.rows:
            if row.live_bytes > 0:
                key = (layer.layer, _folded_line(layer.layer, _frames(row.stack_id, chains)))
                weights[key] = weights.get(key, 0) + int(row.live_bytes)
    rank = {name: i for i, name in enumerate(LAYERS)}
    def order(item):  # layers in schema order, then biggest first
        (layer, text), weight = item
        return rank.get(layer, len(rank)), layer, -weight, text
    ordered = sorted(weights.items(), key=order)
    return [f"{text} {weight}" for (_, text), weight in ordered]


def _folded_line(layer: str, frames: list[dict]) -> str:
    names = [frame_label(frame) for frame in reversed(frames)] or [NO_STACK_FRAME]  # outermost first
    return ";".join(_folded_name(name) for name in [layer, *names])


def _folded_name(name: str) -> str:
    """';' separates frames and a line is one stack: neither may appear inside a name (line
    breaks become spaces), nor any other control character (safe_text.visible)."""
    return visible(name.replace(";", ",").replace("\r", " ").replace("\n", " "))


# --- shared -----------------------------------------------------------------------------------

def _frames(stack_id: int | None, chains: dict[int, list[dict]]) -> list[dict]:
    return [] if stack_id is None else chains.get(stack_id, [])


def _share(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole > 0 else "-"


def _count(n: int, one: str, many: str) -> str:
    return f"{n:,} {one if n == 1 else many}"
