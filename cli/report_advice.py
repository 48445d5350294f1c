"""`memprof report advice`: what to change, with the evidence from the recording."""
from __future__ import annotations

import click

from memprof.cli.common import REPORT_FORMATS, analysed, emit, native_frames_option, max_memory_option
from memprof.cli.report import report


@report.command(epilog="Each rule is one module of memprof/analysis/advice, listed in its table.py; "
                       "`--format json` gives every rule with its trigger and thresholds, and why it said nothing.")
@click.argument("path", required=False, type=click.Path(path_type=str))
@click.option("--format", "fmt", default=REPORT_FORMATS[0], show_default=True, type=click.Choice(REPORT_FORMATS))
@native_frames_option
@max_memory_option
def advice(path, fmt, native_frames):
    """What to change, computed from this recording: each rule that finds its pattern (the
    autograd graph kept across steps, a KV cache that dominates the peak, attention scores
    of L × L, a fragmented caching allocator, activations at the peak, optimizer state,
    DataLoader workers copying their dataset, memory growing outside PyTorch) gives its
    evidence (numbers, chains, steps, module paths), the change to try and the saving to
    expect. Rules whose thresholds the recording does not cross say nothing; the report
    lists them and why.
    """
    emit(fmt, analysed(path, advice=True).advice(native_frames=native_frames))
