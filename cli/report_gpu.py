"""`memprof report gpu` (what makes up each GPU's memory) and `memprof report growth` (how
each layer grows, and when it fills its device)."""
from __future__ import annotations

import json

import click

from memprof.analysis.growth_forecast import forecast_bar  # light: the bar --help states
from memprof.cli.common import LAYER_CHOICES, analysed, native_frames_option
from memprof.cli.report import report


@report.command()
@click.argument("path", required=False, type=click.Path(path_type=str))
@click.option("--points", default=20, show_default=True, type=click.IntRange(min=2),
              help="Times shown: evenly spaced over the GPU data's span, or, when the recording has step marks, at "
                   "most this many of them (first and last kept).")
@click.option("--format", "fmt", default="table", show_default=True, type=click.Choice(("table", "json")))
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
    from memprof.analysis.gpu import gpu_breakdown
    from memprof.analysis.loss import recording_notes
    from memprof.cli import console
    from memprof.report.gpu import gpu_to_json, render_gpu_table

    rec, events, lifetimes, _ = analysed(path)
    result = gpu_breakdown(lifetimes, events, rec.samples, meta=rec.meta, points=points)
    loss = dict(lost_events=rec.meta.lost_events, notes=recording_notes(rec.meta))
    if fmt == "json":
        click.echo(json.dumps(gpu_to_json(result, rec.path, **loss), indent=2))
        return
    render_gpu_table(result, console.out, start_ns=rec.meta.start_ns, **loss)


@report.command(epilog=f"{forecast_bar()} Otherwise the report says why there is none: too few points, a poor "
                        "fit (its R² below the bar), not growing, not within the horizon, or the capacity unknown.")
@click.argument("path", required=False, type=click.Path(path_type=str))
@click.option("--layer", "layers", multiple=True, type=click.Choice(LAYER_CHOICES),
              help="Only these layers (repeatable).")
@click.option("--top", default=3, show_default=True, type=click.IntRange(min=0),
              help="Chains fitted per layer and device: those holding the most bytes at the last point.")
@click.option("--points", default=50, show_default=True, type=click.IntRange(min=3),
              help="Without step marks: fit at this many evenly spaced times.")
@click.option("--format", "fmt", default="table", show_default=True, type=click.Choice(("table", "json")))
@native_frames_option
def growth(path, layers, top, points, fmt, native_frames):
    """How each layer's live bytes grow per training step (per second when the recording has
    no step marks), per device and for its biggest chains: a linear fit (bytes per step) and
    a power law (bytes = a·step^b), each with R²; and, where the device's size is known (NVML
    for a GPU, MemTotal for the machine's RAM), when the better fit fills it at this rate.
    """
    from memprof.analysis.growth import growth as fit_growth
    from memprof.analysis.leaks import chain_frames
    from memprof.analysis.loss import recording_notes
    from memprof.cli import console
    from memprof.report.growth import growth_to_json, render_growth_table

    rec, events, lifetimes, canonical = analysed(path)
    result = fit_growth(lifetimes, events, rec.samples, origin_ns=rec.meta.start_ns, points=points, top=top,
                        layers=layers or None, canonical_stack=canonical)
    chains = chain_frames(rec.stacks, rec.frames, [s.stack_id for s in result.series if s.chain], native_frames)
    loss = dict(lost_events=rec.meta.lost_events, notes=recording_notes(rec.meta))
    if fmt == "json":
        click.echo(json.dumps(growth_to_json(result, chains, rec.path, **loss), indent=2))
        return
    render_growth_table(result, chains, console.out, **loss)
