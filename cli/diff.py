"""`memprof diff A B`: what changed between two recordings, by layer and chain."""
from __future__ import annotations

import click

from memprof.cli.common import LAYER_CHOICES, REPORT_FORMATS, analysed, emit, native_frames_option, max_memory_option


@click.command()
@click.argument("a", type=click.Path(path_type=str))
@click.argument("b", type=click.Path(path_type=str))
@click.option("--top", default=10, show_default=True, type=click.IntRange(min=1), help="Chains shown per layer.")
@click.option("--layer", "layers", multiple=True, type=click.Choice(LAYER_CHOICES), help="Only these layers (repeatable).")
@click.option("--format", "fmt", default=REPORT_FORMATS[0], show_default=True, type=click.Choice(REPORT_FORMATS),
              help="table: for people; json: every number, for scripts.")
@native_frames_option
@max_memory_option
def diff(a, b, top, layers, fmt, native_frames):
    """What changed from recording A (the baseline) to B, e.g. between two commits.

    Per layer: its peak and the bytes held at the end in A and B, and the change. Per layer
    and allocation chain: the bytes held at the end and at the layer's peak, biggest change
    first; chains only in B are new, only in A gone. Chains are matched by their frames
    without line numbers, so a chain still matches after a commit moved its lines. "The end"
    is when the target began to exit (or the end of the recording, when it did not).

    \b
      memprof diff base.memprof head.memprof --layer cuda_block --top 5
    """
    from memprof.api import diff as diff_view

    emit(fmt, diff_view(analysed(a), analysed(b), layers=layers, top=top, native_frames=native_frames))
