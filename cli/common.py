"""What every command that reads a recording shares: opening and analysing it, handing its
view to the reporter (`emit`), and the options whose meaning must be the same everywhere
(--min-age, --native-frames, layers)."""
from __future__ import annotations

import click

# The library's closed sets and defaults, spelled here so --help imports no numpy, pandas or
# pyarrow; tests/unit/test_cli_choices.py pins each equal to its one definition.
LAYER_CHOICES = ("cuda_block", "cuda_segment", "cuda_driver", "torch_cpu", "native_heap", "kernel_slab", "kernel_page")
MIN_AGE_DEFAULT = "500ms"  # memprof.analysis.leaks.DEFAULT_MIN_AGE_NS
NATIVE_FRAMES_CHOICES = ("merged", "all")  # memprof.analysis.chains.NATIVE_FRAMES, the first the default
# What emit() gives for --format: the view rendered for a terminal, or its JSON (the first the default).
REPORT_FORMATS = ("table", "json")


def min_age_ns(ctx, param, value):
    """click callback: a duration with a unit ('500ms') as non-negative ns."""
    from memprof.errors import UsageError
    from memprof.units import parse_duration
    try:
        seconds = parse_duration(value)
    except UsageError as e:
        raise click.BadParameter(e.message) from None
    if seconds < 0:
        raise click.BadParameter("must not be negative")
    return int(seconds * 1e9)


def analysed(path: str | None, keep_at: tuple[int, ...] = (), window_ns: int | None = None,
             gpu_points: int | None = None, regions: bool = False, advice: bool = False, curves: bool = False):
    """The recording at `path` (default: the newest in the current directory), opened and
    analysed by the library's one entry point (memprof.api.analyse) as a memprof.api.Analysed,
    within the command's --max-memory (max_memory_option); `keep_at`, `window_ns`, `gpu_points`,
    `regions`, `advice` and `curves` as analyse takes them (the times, ns after the start, the windows,
    the number of `report gpu` points, `report regions`' regions, and what the advice rules
    read, that a command reads the live allocations at). On a terminal, each stage shows on stderr while it runs (a
    10^7-event recording takes seconds)."""
    from memprof.api import STAGES, analyse
    from memprof.cli import console

    with console.progress(stages=STAGES) as stage:
        return analyse(path, stage=stage, max_memory=max_memory(), keep_at=keep_at, window_ns=window_ns,
                       gpu_points=gpu_points, regions=regions, advice=advice, curves=curves)


_MAX_MEMORY = "memprof.max_memory"  # where max_memory_option leaves its value (click's ctx.meta)


def max_memory() -> int | None:
    """The running command's --max-memory in bytes (None: the default, most of the memory available)."""
    context = click.get_current_context(silent=True)
    return None if context is None else context.meta.get(_MAX_MEMORY)


def _set_max_memory(ctx, param, value):
    if value is None:
        return None
    from memprof.errors import UsageError
    from memprof.units import parse_size
    try:
        ctx.meta[_MAX_MEMORY] = parse_size(value)
    except UsageError as e:
        raise click.BadParameter(e.message) from None
    return None


def max_memory_option(fn):
    """The --max-memory option of every command that analyses a recording (also
    MEMPROF_MAX_MEMORY): above it, a recording is folded (memprof.bounded)."""
    return click.option(
        "--max-memory", envvar="MEMPROF_MAX_MEMORY", default=None, expose_value=False, callback=_set_max_memory,
        metavar="SIZE",
        help="Memory the analysis may take (default: 3/4 of what is available). A recording whose whole analysis "
             "needs more is folded: read part by part, keeping the allocations live at a step, an exit, the end "
             "or a layer's peak. The summary, advice, leaks, layers, top/peak at the end or peak, growth, "
             "modules, gpu, regions, check and a job's report read a folded recording; html, perfetto and "
             "chrome-trace draw its curves through the moments the fold kept; export refuses csv and parquet "
             "(every event) of it.")(fn)


def emit(fmt: str, view) -> None:
    """The one place a report leaves a command: `fmt` "json" prints the view's JSON on stdout,
    any other format its terminal rendering on the report console (memprof.report.reporters)."""
    import json

    from memprof.cli import console
    from memprof.report import reporters

    if fmt == "json":
        click.echo(json.dumps(reporters.to_json(view), indent=2))
        return
    reporters.render(view, console.out)


def native_frames_option(fn):
    """The --native-frames option of every command that shows chains."""
    return click.option(
        "--native-frames", "native_frames", default=NATIVE_FRAMES_CHOICES[0], show_default=True,
        type=click.Choice(NATIVE_FRAMES_CHOICES),
        help="merged: the interpreter's eval-loop frames are replaced by the Python frames they ran; "
             "all: keep every native frame too.")(fn)
