"""The one owner of the consoles: reports on stdout, diagnostics on stderr. Neither writes a
control character that came from a recording (SafeConsole)."""
from __future__ import annotations

import sys
from contextlib import contextmanager

from rich.console import Console

from memprof.report.safe_text import escape, visible_segments


class SafeConsole(Console):
    """A rich Console that writes no control character it was not itself asked to: whatever
    a renderer forgot to escape (a name from the recording in a cell, a Text) still reaches
    the terminal as visible escapes (memprof.report.safe_text). Renderers escape names
    themselves first (`safe_text.escape`), so that widths are measured on what is shown."""

    def render(self, renderable, options=None):
        return visible_segments(super().render(renderable, options))


# Off a terminal (a pipe, a file, CI logs) nothing is wrapped: a long path or an error stays
# on one line, and tables get room instead of rich's default 80 columns.
out = SafeConsole(soft_wrap=False, width=None if sys.stdout.isatty() else 200)
err = SafeConsole(stderr=True, soft_wrap=not sys.stderr.isatty())


def error(message: str, hint: str | None = None) -> None:
    err.print(f"[bold red]memprof: error:[/] {escape(message)}")
    if hint:
        err.print(f"[dim]hint:[/] {escape(hint)}")


def warning(message: str) -> None:
    err.print(f"[yellow]memprof: warning:[/] {escape(message)}")


def info(message: str) -> None:
    err.print(f"[dim]memprof:[/] {escape(message)}")


@contextmanager
def progress(stages: int):
    """A progress bar on stderr while a long analysis runs, `stages` steps long: yields
    `stage(text)`, which names the step now running and fills the bar up to it. Only on a
    terminal; elsewhere (pipes, CI logs, tests) it prints nothing. The bar goes away when done."""
    if not err.is_terminal:
        yield lambda text: None
        return
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
    columns = (SpinnerColumn(), TextColumn("[dim]memprof:[/] {task.description}"), BarColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err, transient=True) as bar:
        task = bar.add_task("", total=stages)
        done = [-1]

        def stage(text: str) -> None:
            done[0] += 1
            bar.update(task, completed=done[0], description=escape(text) + "…")
        yield stage
