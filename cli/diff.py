"""`memprof diff A B`: what changed between two recordings, by layer and chain."""
from __future__ import annotations

import json

import click

from memprof.cli.common import LAYER_CHOICES, analysed, native_frames_option


def _side(path: str):
    """(recording, analysis.diff.Recorded) of the recording at `path`, judged at its target's end."""
    from memprof.analysis.diff import Recorded
    from memprof.analysis.leaks import end_of_target
    from memprof.analysis.overview import recording_end_ns

    rec, events, lifetimes, _ = analysed(path)
    end_ns = end_of_target(events, rec.meta.pid, recording_end_ns(rec.meta, events))
    return rec, Recorded(lifetimes=lifetimes, stacks=rec.stacks, frames=rec.frames, end_ns=end_ns)


@click.command()
@click.argument("a", type=click.Path(path_type=str))
@click.argument("b", type=click.Path(path_type=str))
@click.option("--top", default=10, show_default=True, type=click.IntRange(min=1), help="Chains shown per layer.")
@click.option("--layer", "layers", multiple=True, type=click.Choice(LAYER_CHOICES), help="Only these layers (repeatable).")
@click.option("--format", "fmt", default="table", show_default=True, type=click.Choice(("table", "json")),
              help="table: for people; json: every number, for scripts.")
@native_frames_option
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
    from memprof.analysis.diff import diff_recordings
    from memprof.analysis.leaks import chain_frames
    from memprof.analysis.loss import recording_notes
    from memprof.cli import console
    from memprof.report.diff import diff_to_json, render_diff_table

    (rec_a, side_a), (rec_b, side_b) = _side(a), _side(b)
    result = diff_recordings(side_a, side_b, layers=layers or None, top=top)
    shown = [chain for layer in result.layers for chain in layer.chains]
    chains_a = chain_frames(rec_a.stacks, rec_a.frames, [c.stack_id_a for c in shown], native_frames)
    chains_b = chain_frames(rec_b.stacks, rec_b.frames, [c.stack_id_b for c in shown], native_frames)
    lost = (rec_a.meta.lost_events, rec_b.meta.lost_events)
    if fmt == "json":
        doc = diff_to_json(result, chains_a, chains_b, recording_a=rec_a.path, recording_b=rec_b.path, lost_events=lost)
        click.echo(json.dumps(doc, indent=2))
        return
    render_diff_table(result, chains_a, chains_b, console.out, names=(str(rec_a.path), str(rec_b.path)),
                      start_ns=(rec_a.meta.start_ns, rec_b.meta.start_ns), lost_events=lost,
                      notes=(recording_notes(rec_a.meta), recording_notes(rec_b.meta)))
