"""`memprof doctor`."""
from __future__ import annotations

import click


@click.command()
@click.option("--python", "pythons", multiple=True, metavar="PATH",
              help="Also check that Python frames can be read from this interpreter (repeatable). "
                   "Run without sudo: it needs no privilege, and under sudo it is refused.")
def doctor(pythons):
    """Check every requirement of recording, and say how to fix what is missing.

    Exits 0 when recording can work, 4 when a required source cannot. An interpreter whose
    Python frames cannot be read is a warning: recording works, without those frames.
    """
    from rich.table import Table

    from memprof.cli import console
    from memprof.doctor import recording_possible, run_checks
    from memprof.errors import ExitCode
    from memprof.report.safe_text import escape

    _check_pythons_given(pythons)
    checks = run_checks(pythons)
    table = Table(title="memprof doctor", show_lines=False)
    for col in ("check", "status", "detail", "fix"):
        table.add_column(col, overflow="fold")
    for c in checks:
        colour = "green" if c.ok else ("red" if c.required else "yellow")
        status = f"[{colour}]{escape(c.status)}[/]"
        table.add_row(escape(c.name), status, escape(c.detail), "" if c.ok else escape(c.fix))
    console.out.print(table)
    if recording_possible(checks):
        console.out.print("Recording can work here.")
        return
    console.out.print("[red]Recording cannot work here[/]: fix the items in red above.")
    raise SystemExit(ExitCode.SOURCE_UNAVAILABLE)


def _check_pythons_given(pythons) -> None:
    """`--python` paths are the caller's to name: under sudo, root would open and inspect
    whatever they name (a device, a file only root may read, and say whether it exists), so
    it is refused there; otherwise each must be a file (UsageError, exit 2)."""
    if not pythons:
        return
    import os

    from memprof.capture.target import RunAs
    from memprof.errors import UsageError
    if RunAs.from_sudo() is not None:
        raise UsageError("doctor --python reads the interpreter as root under sudo: refused",
                         "run it as yourself, without sudo: memprof doctor --python PATH")
    for path in pythons:
        if not os.path.isfile(path):
            raise UsageError(f"--python {path}: no such file", "give the interpreter's path, e.g. --python $(which python3)")
