"""`memprof report gpu` (what makes up each GPU's memory) and `memprof report growth` (how
each layer grows, and when it fills its device)."""
from __future__ import annotations

import click

from memprof.analysis.growth_forecast import forecast_bar  # light: the bar --help states
from memprof.cli.common import LAYER_CHOICES, REPORT_FORMATS, analysed, emit, native_frames_option, max_memory_option
from memprof.cli.report import report


@report.command()
@click.argument("path", required=False, type=click.Path(path_type=str))
@click.option("--points", default=20, show_default=True, type=click.IntRange(min=2),
              help="Times shown: evenly spaced over the GPU data's span, or, when the recording has step marks, at "
                   "most this many of them (first and last kept).")
@click.option("--format", "fmt", default=REPORT_FORMATS[0], show_default=True, type=click.Choice(REPORT_FORMATS))
@max_memory_option
def gpu(path, points, fmt):
    """Per GPU, what its memory is made of, at the peak and over time:

    \b
      NVML used = context and unseen + driver allocations (cuMemAlloc & co.)
      driver    = not PyTorch (NCCL, …) + reserved (the caching allocator's segments)
      reserved  = cached free + allocated (tensor blocks)

    with the fragmentation (cached free / reserved) and the amplification (peak reserved /
    peak requested). Works with whatever layers the recording has: a term it cannot compute
    is shown as "–", with the reason. NVML is sampled (10 Hz), so a difference with it may
    come out negative: shown as measured, with a note.
    """
    emit(fmt, analysed(path, gpu_points=points).gpu(points=points))


@report.command(epilog=f"{forecast_bar()} Otherwise the report says why there is none: too few points, a poor "
                        "fit (its R² below the bar), not growing, not within the horizon, or the capacity unknown.")
@click.argument("path", required=False, type=click.Path(path_type=str))
@click.option("--layer", "layers", multiple=True, type=click.Choice(LAYER_CHOICES),
              help="Only these layers (repeatable).")
@click.option("--top", default=3, show_default=True, type=click.IntRange(min=0),
              help="Chains fitted per layer and device: those holding the most bytes at the last point.")
@click.option("--points", default=50, show_default=True, type=click.IntRange(min=3),
              help="With fewer than 3 step marks: fit at this many evenly spaced times.")
@click.option("--against", metavar="NAME", default=None,
              help="Fit live bytes against this quantity instead of the step number: its value at each step "
                   "mark is x. The usual ones: tokens, seq_len, batch (the agent's sizes of each outermost "
                   "forward, or memprof.mark(label, tokens=…)), or any name given to memprof.mark; step is the "
                   "default. Slopes are then bytes per unit of NAME (\"per token\"), and the forecast is the "
                   "NAME at which the device fills.")
@click.option("--format", "fmt", default=REPORT_FORMATS[0], show_default=True, type=click.Choice(REPORT_FORMATS))
@native_frames_option
@max_memory_option
def growth(path, layers, top, points, against, fmt, native_frames):
    """How each layer's live bytes grow per training step (per second when the recording has
    fewer than 3 step marks; per token, or any quantity, with --against), per device and for
    its biggest chains: a linear fit (bytes per step) and a power law (bytes = a·step^b), each
    with R²; where the growth changes regime (one line bent once fits far better than one
    line); and, where the device's size is known (NVML for a GPU, MemTotal for the machine's
    RAM), when the better fit fills it at this rate.
    """
    emit(fmt, analysed(path).growth(layers=layers, top=top, points=points, native_frames=native_frames,
                                    against=against))
