"""`memprof report html`: the whole analysis as one self-contained page for a browser."""
from __future__ import annotations

import click

from memprof.cli.common import MIN_AGE_DEFAULT, analysed, emit, min_age_ns, native_frames_option, max_memory_option
from memprof.cli.report import report


@report.command()
@click.argument("path", required=False, type=click.Path(path_type=str))
# readable=False: an output is not read, and whatever is at its name (a link too) is replaced.
@click.option("-o", "--output", "output", default=None,
              type=click.Path(dir_okay=False, readable=False, path_type=str),
              help="Where to write the page (default: the recording's name with .html, in the current directory; "
                   "'-': stdout).")
@click.option("--top", default=20, show_default=True, type=click.IntRange(min=1),
              help="Findings shown, and chains kept per layer in the flame graphs (the rest is one 'other' box).")
@click.option("--points", default=2000, show_default=True, type=click.IntRange(min=10, max=100_000),
              help="Points kept per curve: the highest of each time slice, so peaks survive.")
@click.option("--min-age", default=MIN_AGE_DEFAULT, show_default=True, callback=min_age_ns,
              help="Allocations younger than this at the end are in flight, not leaks (as report leaks).")
@click.option("--format", "fmt", default="html", show_default=True, type=click.Choice(("html", "json")),
              help="html: the page; json: only its data blob, on stdout unless -o is given "
                   "(times in CLOCK_MONOTONIC ns, sizes in bytes).")
@native_frames_option
@max_memory_option
def html(path, output, top, points, min_age, fmt, native_frames):
    """Write one HTML file that opens offline, from disk (scripts, styles and data inline):

    \b
      timeline      live bytes per layer, one chart per layer family (layers nest: never
                    stacked), with RSS and NVML samples, step marks and OOMs; drag or wheel
                    to zoom, hover for values
      leaks         what `memprof report leaks` finds, each expandable to its chain
      flame graph   who holds each layer's bytes at the end and at its peak, frames coloured
                    kernel / native / Python
      GPU           the equation of `memprof report gpu` at each GPU's peak
      recording     its metadata, and a warning when events were lost or sampled

    Curves are downsampled to --points per series, so the page stays small (a few MB at most)
    for any recording. An empty recording gives a page that says so.
    """
    import json
    from pathlib import Path

    from memprof.cli.output import write
    from memprof.report.html import page

    view = analysed(path, advice=True, curves=True).html(top=top, points=points, min_age_ns=min_age, native_frames=native_frames)
    if fmt == "json" and not output:
        emit(fmt, view)
        return
    text = json.dumps(page.to_json(view), indent=1) if fmt == "json" else page.html_page(view)
    target = output or f"{Path(view.about.path).name.removesuffix('.memprof')}.{fmt}"
    write(target, text, detail=f"{len(text.encode()) / 1e6:.1f} MB")  # '-': stdout

