"""The one owner of the consoles: reports on stdout, diagnostics on stderr."""
from __future__ import annotations

from rich.console import Console
from rich.markup import escape

out = Console(soft_wrap=False)
err = Console(stderr=True, soft_wrap=False)


def error(message: str, hint: str | None = None) -> None:
    err.print(f"[bold red]memprof: error:[/] {escape(message)}")
    if hint:
        err.print(f"[dim]hint:[/] {escape(hint)}")


def warning(message: str) -> None:
    err.print(f"[yellow]memprof: warning:[/] {escape(message)}")


def info(message: str) -> None:
    err.print(f"[dim]memprof:[/] {escape(message)}")
