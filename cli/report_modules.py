"""`memprof report modules`: per nn.Module instance path, its calls, bytes per call, and what
it held at each layer's peak and at the end."""
from __future__ import annotations

import click

from memprof.cli.common import LAYER_CHOICES, REPORT_FORMATS, analysed, emit, max_memory_option
from memprof.cli.report import report


@report.command()
@click.argument("path", required=False, type=click.Path(path_type=str))
@click.option("--layer", "layers", multiple=True, type=click.Choice(LAYER_CHOICES), help="Only these layers (repeatable).")
@click.option("--top", default=10, show_default=True, type=click.IntRange(min=1), help="Modules shown per layer.")
@click.option("--format", "fmt", default=REPORT_FORMATS[0], show_default=True, type=click.Choice(REPORT_FORMATS))
@max_memory_option
def modules(path, layers, top, fmt):
    """Per nn.Module instance path (transformer.h.3.attn), in each layer: how many forwards
    it ran, the bytes allocated inside it (in all, and per call), and what of that was still
    live at the layer's peak and at the end. A module's allocations are those made while it
    was the innermost module running on the allocating thread, so a parent's numbers leave
    out its children's. Needs a recording made with `memprof record --torch-modules`.
    """
    emit(fmt, analysed(path).modules(layers=layers, top=top))
