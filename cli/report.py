"""`memprof report …`: ask the analysed recording for one view, hand it to `emit`."""
from __future__ import annotations

import click

from memprof.cli.common import (
    LAYER_CHOICES, MIN_AGE_DEFAULT, REPORT_FORMATS, analysed, emit, max_memory_option, min_age_ns, native_frames_option,
)
from memprof.cli.typos import refuse_misspelt_command


class _SummaryByDefault(click.Group):
    """`memprof report [PATH] [--format json]` with no sub-report runs `summary`; a first word
    close to a sub-report's name that is no path is a typo (cli/typos.py)."""

    def parse_args(self, ctx, args):
        if not args or (args[0] not in self.commands and args[0] not in ("-h", "--help")):
            if args:
                refuse_misspelt_command(ctx, args[0], self.commands)  # `report leak`: not a path
            args = ["job" if report_job.is_job(args) else "summary", *args]  # several recordings: one job
        return super().parse_args(ctx, args)


@click.group(cls=_SummaryByDefault)
def report():
    """Analyse a recording (default: the newest in the current directory).

    `memprof report [PATH]` alone prints a one-screen summary: each layer's peak and end, the
    top leaks, what was lost, and which report to open next.
    """


@report.command()
@click.argument("path", required=False, type=click.Path(path_type=str))
@click.option("--top", default=3, show_default=True, type=click.IntRange(min=1), help="Leak findings shown.")
@click.option("--format", "fmt", default=REPORT_FORMATS[0], show_default=True, type=click.Choice(REPORT_FORMATS))
@max_memory_option
def summary(path, top, fmt):
    """One screen: per layer peak and end, RSS/GPU samples, the top leaks, lost events, and
    the commands that show more."""
    emit(fmt, analysed(path, advice=True).summary(top=top))


@report.command()
@click.argument("path", required=False, type=click.Path(path_type=str))
@click.option("--min-age", default=MIN_AGE_DEFAULT, show_default=True, callback=min_age_ns,
              help="Allocations younger than this at the end are in flight, not leaks.")
@click.option("--layer", "layers", multiple=True, type=click.Choice(LAYER_CHOICES), help="Only these layers (repeatable).")
@click.option("--top", default=10, show_default=True, type=click.IntRange(min=1), help="Show at most N findings.")
@click.option("--window", default=None, callback=lambda ctx, p, v: None if v is None else min_age_ns(ctx, p, v),
              help="Without step marks (and for a target still running at the end), judge growth at the ends of "
                   "windows this long (default: the run cut in 32).")
@click.option("--confidence", default=0.99, show_default=True, type=click.FloatRange(0.5, 0.999999),
              help="How sure the Mann–Kendall test must be that a chain rises before it is called growing.")
@click.option("--by", default="chain", show_default=True, type=click.Choice(("chain", "rank")),
              help="rank: judge each rank of a distributed job apart (a chain leaking on rank 2 only is rank 2's "
                   "finding).")
@click.option("--format", "fmt", default=REPORT_FORMATS[0], show_default=True, type=click.Choice(REPORT_FORMATS))
@native_frames_option
@max_memory_option
def leaks(path, min_age, layers, top, window, confidence, by, fmt, native_frames):
    """What grew and never came back, by allocation chain, biggest first. Three kinds:

    \b
    held at the end   live when the target began to exit, older than --min-age
    grows per step    live bytes at the start of each training step (from step marks; fixed
                      windows without them, when the target was still running at the end)
                      rise: a robust Theil–Sen slope in bytes/step and bytes/s, and a
                      Mann–Kendall confidence. For jobs that never exit.
    not a leak        shown apart: caches that filled and plateaued, sawtooth buffers, cached
                      CUDA segments, kernel caches (page cache, dentries, inodes), the slab
                      allocator's own pages, the process's page tables and memory areas

    For a command, "the end" is the moment its root process began to exit (exit_group, a
    fatal signal, or a Python interpreter starting to finalize), before the kernel's
    teardown frees what it held; each finding says whether the teardown released it or it
    outlived the process. For an attached process that did not exit, the end is the end of
    the recording.

    In a distributed job (torchrun, Slurm, MPI) each rank's growth is judged at its own step
    marks, and each finding names the ranks and hosts its allocations came from.
    """
    view = analysed(path, window_ns=window).leaks(min_age_ns=min_age, layers=layers, top=top, window_ns=window,
                                                  confidence=confidence, by=by, native_frames=native_frames)
    emit(fmt, view)


@report.command()
@click.argument("path", required=False, type=click.Path(path_type=str))
@click.option("--top", default=3, show_default=True, type=click.IntRange(min=1), help="Chains shown per layer, at its peak.")
@click.option("--format", "fmt", default=REPORT_FORMATS[0], show_default=True, type=click.Choice(REPORT_FORMATS))
@native_frames_option
@max_memory_option
def layers(path, top, fmt, native_frames):
    """Per layer: peak and final live bytes, allocations, and the chains holding most at the
    peak; RSS and GPU samples beside them. Layers nest, so their bytes are never added up."""
    emit(fmt, analysed(path).layers(top=top, native_frames=native_frames))


# Sub-reports defined in their own modules register on `report` when imported.
from memprof.cli import (  # noqa: E402,F401
    report_advice, report_attribution, report_gpu, report_html, report_job, report_modules, report_regions,
)
