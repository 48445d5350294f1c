"""Renderers of a diff between two recordings (memprof.analysis.diff): JSON and the terminal.
Render only."""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from rich import box
from rich.table import Table

from memprof.model.schema import FRAME_KEYS
from memprof.report.labels import callers
from memprof.report.safe_text import escape
from memprof.units import format_bytes, format_relative_ns

if TYPE_CHECKING:
    from rich.console import Console

    from memprof.analysis.diff import ChainDiff, LayerDiff
    from memprof.analysis.views import DiffView

_IDENTITY_KEYS = ("kind", "function", "module", "file")


def to_json(view: DiffView) -> dict:
    """JSON-ready dict: a and b (recording, end_ns, lost_events), then layers, outermost first,
    each with its numbers in A and B (bytes; peak_ns in each recording's CLOCK_MONOTONIC ns),
    deltas (B − A), percentages of A (null when A's is 0) and its changed chains. A chain
    has its `identity` (what matched it: frames without lines, innermost first) and its
    `stack` with lines, from B (from A for a gone chain)."""
    result, chains_a, chains_b, a, b = view.result, view.chains_a, view.chains_b, view.a, view.b
    recording_a, recording_b, lost_events = a.path, b.path, (a.lost_events, b.lost_events)
    return {
        "a": {"recording": str(recording_a), "end_ns": int(result.end_ns_a), "lost_events": int(lost_events[0])},
        "b": {"recording": str(recording_b), "end_ns": int(result.end_ns_b), "lost_events": int(lost_events[1])},
        "layers": [_layer_json(layer, chains_a, chains_b) for layer in result.layers],
    }


def _layer_json(layer: LayerDiff, chains_a: dict, chains_b: dict) -> dict[str, Any]:
    return {
        "layer": layer.layer,
        "peak_a": int(layer.peak_a), "peak_b": int(layer.peak_b), "peak_delta": int(layer.peak_delta),
        "peak_pct": layer.peak_pct, "peak_ns_a": layer.peak_ns_a, "peak_ns_b": layer.peak_ns_b,
        "end_a": int(layer.end_a), "end_b": int(layer.end_b), "end_delta": int(layer.end_delta),
        "end_pct": layer.end_pct,
        "changed": int(layer.changed), "new": int(layer.new), "gone": int(layer.gone),
        "chains": [_chain_json(chain, chains_a, chains_b) for chain in layer.chains],
    }


def _chain_json(chain: ChainDiff, chains_a: dict, chains_b: dict) -> dict[str, Any]:
    return {
        "status": chain.status,
        "end_a": int(chain.end_a), "end_b": int(chain.end_b), "end_delta": int(chain.end_delta),
        "peak_a": int(chain.peak_a), "peak_b": int(chain.peak_b), "peak_delta": int(chain.peak_delta),
        "stack_id_a": chain.stack_id_a, "stack_id_b": chain.stack_id_b,
        "identity": [dict(zip(_IDENTITY_KEYS, frame)) for frame in chain.frames],
        "stack": [{key: frame.get(key) for key in FRAME_KEYS} for frame in _frames(chain, chains_a, chains_b)],
    }


def render(view: DiffView, console: Console) -> None:
    """Print the per-layer table (peak and end in A and B, Δ and % of A), then, per layer with
    changed chains, its chains by biggest change. `names` label A and B; times are shown
    relative to each recording's start (`start_ns`)."""
    result, chains_a, chains_b, a, b = view.result, view.chains_a, view.chains_b, view.a, view.b
    names, start_ns, lost_events = (a.path, b.path), (a.start_ns, b.start_ns), (a.lost_events, b.lost_events)
    notes = (a.notes, b.notes)
    out = lambda text, **kw: console.print(text, highlight=False, **kw)  # noqa: E731
    out(f"[bold]Diff[/]  A: {escape(names[0])}  →  B: {escape(names[1])}")
    out(f"end (target began to exit, or end of recording): A {format_relative_ns(result.end_ns_a, start_ns[0])}, "
        f"B {format_relative_ns(result.end_ns_b, start_ns[1])}")
    for side, lost in zip("AB", lost_events):
        if lost:
            out(f"[yellow]! {side}: {lost:,} events were lost while recording: its numbers miss them.[/]")
    for side, side_notes in zip("AB", notes):
        for note in side_notes:
            out(f"[dim]note ({side}): {escape(str(note))}[/]")
    if not result.layers:
        out("No allocations recorded in either.")
        return
    console.print(_layers_table(result.layers))
    for layer in result.layers:
        if layer.chains:  # the table above ends in a blank line already
            out(_chains_heading(layer))
            console.print(_chains_table(layer, chains_a, chains_b, console.width))


def _layers_table(layers: list[LayerDiff]) -> Table:
    table = Table(highlight=False, box=box.SIMPLE_HEAD)
    table.add_column("layer")
    for name in ("peak A", "peak B", "Δ peak", "end A", "end B", "Δ end"):
        table.add_column(name, justify="right")
    for layer in layers:
        table.add_row(escape(layer.layer), format_bytes(layer.peak_a), format_bytes(layer.peak_b),
                      _change(layer.peak_delta, layer.peak_pct), format_bytes(layer.end_a), format_bytes(layer.end_b),
                      _change(layer.end_delta, layer.end_pct))
    return table


def _chains_heading(layer: LayerDiff) -> str:
    shown = len(layer.chains)
    which = f"top {shown} of {layer.changed}" if shown < layer.changed else f"{layer.changed}"
    return (f"[bold]{escape(layer.layer)}[/]: {which} changed chain{'s' if layer.changed != 1 else ''} "
            f"({layer.new} new, {layer.gone} gone), biggest change first")


def _chains_table(layer: LayerDiff, chains_a: dict, chains_b: dict, width: int) -> Table:
    """The numbers whole; the chain cut with an ellipsis to the `width` (the console's) they
    leave. Left to rich, a long C++ chain squeezed the numbers to "0…" or dropped them."""
    rows = [(_signed(chain.end_delta), _from_to(chain.end_a, chain.end_b), _signed(chain.peak_delta),
             _from_to(chain.peak_a, chain.peak_b), _status(chain), callers(_frames(chain, chains_a, chains_b)))
            for chain in layer.chains]
    names = ("Δ end", "end A → B", "Δ peak", "at peak A → B")
    widths = [max([len(name)] + [len(row[i]) for row in rows]) for i, name in enumerate(names)]
    left = max(12, width - sum(widths) - 3 * len(widths) - 2)  # each column's padding, the edges
    table = Table(highlight=False, box=box.SIMPLE_HEAD, pad_edge=False)
    for name, column_width in zip(names, widths):
        table.add_column(name, justify="right", no_wrap=True, width=column_width)
    table.add_column("chain", no_wrap=True, overflow="ellipsis", max_width=left)
    for *numbers, status, chain in rows:
        table.add_row(*numbers, status + escape(_cut(chain, left - len(_plain(status)))))
    return table


def _cut(text: str, width: int) -> str:
    """`text` in at most `width` characters, its end an ellipsis where it was cut."""
    return text if len(text) <= width else text[:max(0, width - 1)] + "…"


def _plain(markup: str) -> str:
    return re.sub(r"\[/?[a-z ]*\]", "", markup)


def _status(chain: ChainDiff) -> str:
    return {"new": "[green]new[/] ", "gone": "[dim]gone[/] "}.get(chain.status, "")


def _frames(chain: ChainDiff, chains_a: dict, chains_b: dict) -> list[dict]:
    """The chain's frames with lines: B's, or A's for a chain gone from B."""
    stack_id, chains = (chain.stack_id_a, chains_a) if chain.status == "gone" else (chain.stack_id_b, chains_b)
    return [] if stack_id is None else chains.get(stack_id, [])


def _change(delta: int, pct: float | None) -> str:
    """'+512.0 KiB (+50.0%)'; without a percentage when A had nothing or nothing changed."""
    return _signed(delta) + ("" if pct is None or not delta else f" ({pct:+.1f}%)")


def _signed(n: int) -> str:
    return ("+" if n > 0 else "") + format_bytes(n)


def _from_to(a: int, b: int) -> str:
    return f"{format_bytes(a)} → {format_bytes(b)}"
