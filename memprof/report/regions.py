"""Renderers of the regions and the memory surface (memprof.analysis.regions): JSON and the
terminal. Render only."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich import box
from rich.table import Table
from rich.text import Text

from memprof.model.schema import FRAME_KEYS
from memprof.report.labels import NO_STACK, chain_name
from memprof.report.safe_text import escape
from memprof.units import format_bytes, format_duration_ns, format_relative_ns

if TYPE_CHECKING:
    from rich.console import Console

    from memprof.analysis.layers import ChainBytes
    from memprof.analysis.regions import Region, RegionPeak, Surface, SurfaceGrid
    from memprof.analysis.views import Chains, RegionsView

_CELL = 10  # a surface cell: '1023.9 MiB' is the widest size format_bytes gives below 1 TiB
_NO_CELL = "–"  # a (row, column) pair no region ran
_CHAIN_HEADER = "held most at the peak"
_CHAIN_MIN = 24  # the chain column's narrowest: past that the line is longer than the console


def to_json(view: RegionsView) -> dict:
    """JSON-ready dict: recording, lost_events, notes (the recording's), `empty` (why there
    are no regions, else None), quantities, regions (each with its peaks per layer and device
    and their top chains: stack innermost frame first, and `name`, the chain in one line as
    every report names it), the surface (None without one) and `surface_notes`. Times are
    CLOCK_MONOTONIC ns, sizes bytes; a quantity that is a whole number is an int."""
    result, about = view.result, view.about
    return {
        "recording": str(about.path),
        "lost_events": int(about.lost_events),
        "notes": [str(n) for n in about.notes],
        "empty": result.empty,
        "quantities": list(result.quantities),
        "regions": [_region_json(region, view.chains) for region in result.regions],
        "surface": None if result.surface is None else _surface_json(result.surface),
        "surface_notes": list(result.notes),
    }


def _number(value: float) -> int | float:
    """64.0 as 64: quantities are mostly counts."""
    return int(value) if float(value).is_integer() else float(value)


def _region_json(region: Region, chains: Chains) -> dict[str, Any]:
    return {
        "index": region.index, "label": region.label, "pid": region.pid,
        "start_ns": region.start_ns, "end_ns": region.end_ns,
        "quantities": {name: _number(value) for name, value in region.quantities.items()},
        "peaks": [{"layer": peak.layer, "device": peak.device, "peak_bytes": peak.peak_bytes, "peak_ns": peak.peak_ns,
                   "top_chains": [_chain_json(chain, chains) for chain in peak.top_chains]} for peak in region.peaks],
    }


def _chain_json(chain: ChainBytes, chains: Chains) -> dict[str, Any]:
    frames = _frames(chain, chains)
    return {"stack_id": chain.stack_id, "live_bytes": chain.live_bytes, "live_count": chain.live_count,
            "name": chain_name(frames), "stack": [{key: frame.get(key) for key in FRAME_KEYS} for frame in frames]}


def _surface_json(surface: Surface) -> dict[str, Any]:
    return {"rows": surface.rows, "columns": surface.columns,
            "row_values": [_number(v) for v in surface.row_values],
            "column_values": [_number(v) for v in surface.column_values],
            "grids": [{"layer": grid.layer, "device": grid.device, "bytes": grid.bytes} for grid in surface.grids]}


def _frames(chain: ChainBytes, chains: Chains) -> list[dict]:
    return [] if chain.stack_id is None else chains.get(chain.stack_id, [])


# ---- the terminal ------------------------------------------------------------------------------

def render(view: RegionsView, console: Console) -> None:
    """The recording's notes; then per region a heading (index, label, quantities, when and how
    long, relative to the recording's start) and a table of each layer and device's peak,
    when in the region it came and the chain holding the most then; then the surface, one
    grid per layer and device, cut into as many column groups as the console's width needs."""
    result, about = view.result, view.about
    out = lambda text, **kw: console.print(text, highlight=False, **kw)  # noqa: E731
    if about.lost_events:
        out(f"[yellow]! {about.lost_events:,} events were lost while recording (ring buffer): peaks may miss them.[/]")
    for note in about.notes:
        out(f"[dim]note: {escape(str(note))}[/]")
    if result.empty:
        out(escape(result.empty))
        return
    for region in result.regions:
        out(_heading(region, about.start_ns))
        console.print(_peaks_table(region, view.chains, console))
        out("")
    for note in result.notes:
        out(f"[dim]note: {escape(note)}[/]")
    if result.surface is not None:
        _render_surface(result.surface, console)


def _quantities_text(quantities: dict[str, float]) -> str:
    return " ".join(f"{name}={_number(value)}" for name, value in quantities.items())


def _heading(region: Region, start_ns: int) -> str:
    when = (f"{format_relative_ns(region.start_ns, start_ns)} for "
            f"{format_duration_ns(region.end_ns - region.start_ns)}")
    return (f"[bold]region {region.index}[/] {escape(region.label)}  "
            f"[bold]{escape(_quantities_text(region.quantities))}[/]  [dim]{when}[/]")


def _peaks_table(region: Region, chains: Chains, console: Console) -> Table:
    """Layer, device, peak and when keep their full width (rich would crush them first); the
    chain column takes what is left of the console's width, at least _CHAIN_MIN, and ends in
    "…" where its name is longer."""
    rows = [[escape(peak.layer), escape(peak.device), format_bytes(peak.peak_bytes),
             "+" + format_duration_ns(peak.peak_ns - region.start_ns)] for peak in region.peaks]
    names = [_top_chain(peak, chains) for peak in region.peaks]
    table = Table(highlight=False, box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False, collapse_padding=True,
                  show_edge=False)
    for i, (header, justify) in enumerate((("layer", "left"), ("device", "left"), ("peak", "right"), ("at", "right"))):
        table.add_column(header, justify=justify, no_wrap=True, width=_widest(header, [row[i] for row in rows]))
    table.add_column(_CHAIN_HEADER, no_wrap=True, overflow="ellipsis", width=_widest(_CHAIN_HEADER, names))
    for row, name in zip(rows, names):
        table.add_row(*row, name)
    if not region.peaks:
        table.add_row("(no allocations)", "", "", "", "")
    return _narrowed(table, console)


def _widest(header: str, cells: list[str]) -> int:
    """Cells (rich markup) of the widest of a column's header and cells."""
    return max([len(header)] + [Text.from_markup(cell).cell_len for cell in cells])


def _narrowed(table: Table, console: Console) -> Table:
    """Narrow the last column (the chain) by what the table is wider than the console."""
    chain = table.columns[-1]
    natural = console.measure(table, options=console.options.update_width(1 << 16)).maximum
    excess = natural - console.width
    if excess > 0:
        chain.width = max(min(_CHAIN_MIN, chain.width), chain.width - excess)
    return table


def _top_chain(peak: RegionPeak, chains: Chains) -> str:
    if not peak.top_chains:
        return ""
    chain = peak.top_chains[0]
    name = chain_name(_frames(chain, chains)) if chain.stack_id is not None else NO_STACK
    return f"{format_bytes(chain.live_bytes)}  {escape(name)}"


def _render_surface(surface: Surface, console: Console) -> None:
    console.print(f"[bold]memory surface[/]: each layer's peak by {escape(surface.rows)} (rows) × "
                  f"{escape(surface.columns)} (columns)", highlight=False)
    for grid in surface.grids:
        for table in _grid_tables(surface, grid, console.width):
            console.print(table)


def _grid_tables(surface: Surface, grid: SurfaceGrid, width: int) -> list[Table]:
    """The grid as tables of at most as many columns as fit `width` (a wide sweep is cut into
    column groups, each with the row labels, rather than squeezed until cells wrap)."""
    corner = f"{surface.rows} \\ {surface.columns}"
    labels = [str(_number(v)) for v in surface.row_values]
    label_width = max(len(corner), *(len(text) for text in labels))
    per_table = max(1, (width - label_width - 1) // (_CELL + 2))
    tables = []
    for first in range(0, len(surface.column_values), per_table):
        columns = range(first, min(first + per_table, len(surface.column_values)))
        title = f"{grid.layer} {grid.device}".strip()
        if len(surface.column_values) > per_table:
            title += f" ({surface.columns} {_number(surface.column_values[columns[0]])}"
            title += f"–{_number(surface.column_values[columns[-1]])})"
        table = Table(title=escape(title), title_justify="left", highlight=False, box=box.SIMPLE_HEAD,
                      padding=(0, 1), pad_edge=False, show_edge=False)
        table.add_column(escape(corner), justify="right", no_wrap=True, min_width=label_width)
        for j in columns:
            table.add_column(str(_number(surface.column_values[j])), justify="right", no_wrap=True, min_width=_CELL)
        for i, label in enumerate(labels):
            cells = [_NO_CELL if grid.bytes[i][j] is None else format_bytes(grid.bytes[i][j]) for j in columns]
            table.add_row(escape(label), *cells)
        tables.append(table)
    return tables
