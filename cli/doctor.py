"""`memprof doctor`."""
from __future__ import annotations

import click


@click.command()
@click.option("--python", "pythons", multiple=True, metavar="PATH",
              type=click.Path(exists=True, dir_okay=False),
              help="Also check that Python frames can be read from this interpreter (repeatable).")
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
