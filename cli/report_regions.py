"""`memprof report regions`: each configuration's peaks, between marks with numbers, and the
memory surface of two quantities."""
from __future__ import annotations

import click

from memprof.cli.common import LAYER_CHOICES, REPORT_FORMATS, analysed, emit, native_frames_option, max_memory_option
from memprof.cli.report import report


@report.command(epilog="With two quantities that vary (seq_len and batch), the surface follows: a grid per layer "
                       "of peaks, the first-named quantity's values as rows and the second's as columns; `memprof "
                       "report html` draws it as a heatmap.")
@click.argument("path", required=False, type=click.Path(path_type=str))
@click.option("--layer", "layers", multiple=True, type=click.Choice(LAYER_CHOICES), help="Only these layers (repeatable).")
@click.option("--top", default=3, show_default=True, type=click.IntRange(min=1),
              help="Chains kept per layer at each region's peak (the table shows the first; JSON all).")
@click.option("--format", "fmt", default=REPORT_FORMATS[0], show_default=True, type=click.Choice(REPORT_FORMATS))
@native_frames_option
@max_memory_option
def regions(path, layers, top, fmt, native_frames):
    """Per region, each layer's peak and what held it. A region runs from one mark of yours
    that carries numbers to the next (the last one to the target's end), so a sweep that
    marks each configuration before running it gets one region per configuration:

    \b
      import memprof
      for seq_len in (512, 1024, 2048):
          for batch in (1, 8):
              memprof.mark("config", seq_len=seq_len, batch=batch)
              model(inputs(seq_len, batch))

    Marks without numbers and step marks do not begin regions, nor do the sizes memprof
    records for each forward. A peak is the whole process's live bytes of that layer and
    device within the region (what was live as it began counts), with the chain holding the
    most at that moment.
    """
    emit(fmt, analysed(path, regions=True).regions(layers=layers, top=top, native_frames=native_frames))
