"""`memprof report DIR_OR_RECORDINGS…`: several recordings of one job (one `memprof record`
per machine), or a folder holding them, reported as one job. Registers `report job` on the
`report` group; `memprof report A B` and `memprof report DIR` come here (cli/report.py)."""
from __future__ import annotations

import os

import click

from memprof.cli.common import (
    MIN_AGE_DEFAULT, REPORT_FORMATS, emit, max_memory, max_memory_option, min_age_ns, native_frames_option,
)
from memprof.cli.report import report


_VALUED = ("--format", "--top", "--min-age", "--native-frames", "--max-memory")  # options of `report` that take a value


def is_job(args: list[str]) -> bool:
    """Whether `memprof report ARGS` names a job: two or more paths (one missing is said by
    the job's report, exit 5), or one folder that is not itself a recording (no meta.json)."""
    paths = [a for i, a in enumerate(args) if not a.startswith("-") and (i == 0 or args[i - 1] not in _VALUED)]
    if len(paths) >= 2:
        return True
    return len(paths) == 1 and os.path.isdir(paths[0]) and not os.path.isfile(os.path.join(paths[0], "meta.json"))


@report.command(name="job")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=str))
@click.option("--min-age", default=MIN_AGE_DEFAULT, show_default=True, callback=min_age_ns,
              help="Allocations younger than this at the end are in flight, not leaks.")
@click.option("--format", "fmt", default=REPORT_FORMATS[0], show_default=True, type=click.Choice(REPORT_FORMATS))
@native_frames_option
@max_memory_option
def job(paths, min_age, fmt, native_frames):
    """Several recordings of one job as one: per host and per rank, the ranks that differ
    from the others across the whole job, one leak list with host and rank on each finding,
    and one clock (CLOCK_REALTIME, through each recording's clock anchors) with its skew.

    \b
      memprof report job-991/                     # every *.memprof in the folder
      memprof report a.memprof b.memprof --format json

    Recordings are analysed one at a time; only their small results are kept."""
    from memprof.api import analyse_job
    from memprof.cli import console

    with console.progress(stages=len(paths) + 1) as stage:
        view = analyse_job(paths, stage=stage, min_age_ns=min_age, native_frames=native_frames,
                           max_memory=max_memory())
    emit(fmt, view)
