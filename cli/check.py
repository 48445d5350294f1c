"""`memprof check`: hold a recording to memory budgets, for CI (exit 6 when one is broken)."""
from __future__ import annotations

import click

from memprof.cli.common import MIN_AGE_DEFAULT, REPORT_FORMATS, analysed, emit, min_age_ns, max_memory_option


def _size(text: str) -> int:
    """Bytes of a size with an optional unit; UsageError (exit 2, with a hint) when it is not one."""
    from memprof.units import parse_size
    return parse_size(text)


def _peak_budgets(ctx, param, values):
    """Each --max-peak 'SIZE' or 'SIZE:LAYER' as a PeakBudget; an unknown layer is a usage error."""
    from memprof.analysis.budget import PeakBudget
    from memprof.errors import UsageError
    from memprof.model.schema import LAYERS
    budgets = []
    for text in values:
        size, colon, layer = text.partition(":")
        if colon and layer not in LAYERS:
            raise UsageError(f"--max-peak {text!r}: unknown layer {layer!r}", f"layers are: {', '.join(LAYERS)}")
        budgets.append(PeakBudget(limit_bytes=_size(size), layer=layer or None))
    return tuple(budgets)


def _max_leak(ctx, param, value):
    return None if value is None else _size(value)


@click.command()
@click.argument("path", required=False, type=click.Path(path_type=str))
@click.option("--max-peak", "peaks", multiple=True, metavar="SIZE[:LAYER]", callback=_peak_budgets,
              help="Every layer's peak live bytes must be at most SIZE (512MiB, 2GB, …); with :LAYER, that "
                   "layer's only (repeatable).")
@click.option("--max-leak", metavar="SIZE", callback=_max_leak,
              help="The bytes of the leak findings (as `report leaks` finds them) must be at most SIZE in every layer.")
@click.option("--fail-on-leak", is_flag=True,
              help="Any leak finding of `report leaks` fails the check: a chain that grows per step (by 1 KiB or "
                   "more over the step marks, or over time windows for a target still running, at 99% "
                   "confidence), or one held at the end (any size, older than --min-age). Never what is not a "
                   "leak: what the program made once at start-up (imports, libraries, set-up before the first "
                   "step) and kept until exit, running threads, caches, memprof's own. For a size floor, use "
                   "--max-leak.")
@click.option("--allow-absent-layer", "allow_absent", is_flag=True,
              help="Skip a --max-peak SIZE:LAYER whose layer has no allocations in the recording, instead of "
                   "failing it (it is not counted as met either).")
@click.option("--min-age", default=MIN_AGE_DEFAULT, show_default=True, callback=min_age_ns,
              help="Allocations younger than this at the end are in flight, not leaks.")
@click.option("--format", "fmt", default=REPORT_FORMATS[0], show_default=True, type=click.Choice(REPORT_FORMATS),
              help="table: for people; json: every number, for scripts.")
@click.pass_context
@max_memory_option
def check(ctx, path, peaks, max_leak, fail_on_leak, allow_absent, min_age, fmt):
    """Hold a recording (default: the newest in the current directory) to memory budgets.

    Prints one `FAIL …` line per budget broken (per layer) and exits with status 6, or
    `ok: N budgets met` and exits 0. Budgets are judged per layer, since layers nest and
    their bytes never add up. A leak is a chain still holding memory when the target began
    to exit (`memprof report leaks`), whether its exit released it or not. A budget on a
    layer with no allocations in the recording fails (a typo, or a source not recorded),
    unless --allow-absent-layer skips it.

    \b
      memprof check run.memprof --max-peak 2GiB --max-peak 512MiB:cuda_block --fail-on-leak
    """
    from memprof.analysis.budget import Budgets
    from memprof.errors import ExitCode, UsageError

    budgets = Budgets(peaks=peaks, max_leak_bytes=max_leak, fail_on_leak=fail_on_leak, allow_absent=allow_absent)
    if not budgets.count:
        raise UsageError("no budget to check", "give --max-peak SIZE[:LAYER], --max-leak SIZE or --fail-on-leak")
    view = analysed(path).check(budgets, min_age_ns=min_age)
    emit(fmt, view)
    if not view.result.passed:
        ctx.exit(ExitCode.CHECK_FAILED)
