"""Typos on the command line, caught where click would misread them: a misspelt sub-report
taken for a recording's path, a command's own option taken for one of memprof's."""
from __future__ import annotations

import difflib
import os
from typing import Iterable

import click


def refuse_misspelt_command(ctx: click.Context, word: str, commands: Iterable[str]) -> None:
    """Raise click.UsageError (exit 2) naming the closest of `commands` when `word`, which
    the caller would take for a path, is no path at all but is close to a command name
    ('leak' for 'leaks'). A word that names something on disk, or resembles no command,
    passes: it is a path, and opening it says what is wrong with it."""
    if word.startswith("-") or os.path.lexists(word):
        return
    close = difflib.get_close_matches(word, sorted(commands), n=1, cutoff=0.6)
    if close:
        raise click.UsageError(f"no such report {word!r} (and no recording at that path); did you mean "
                               f"`{ctx.command_path} {close[0]}`?", ctx)


class CommandAfterOptions(click.Command):
    """A command whose arguments are a command line to run (`record -- CMD ARGS`): an unknown
    option is most often the command's own, given without `--` before the command
    (`memprof record python -c …`); the error then says so."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        given = list(args)  # click's parser consumes the list it is given
        try:
            return super().parse_args(ctx, args)
        except click.NoSuchOption as e:
            args = given
            start = self.command_start(args)
            if start is None or e.option_name not in args[start:]:
                raise
            raise click.UsageError(
                f"{e.format_message()} If it is an option of {args[start]!r}, put `--` before the command: "
                f"`{ctx.command_path} [OPTIONS] -- {args[start]} {e.option_name} …`", ctx) from None

    def command_start(self, args: list[str]) -> int | None:
        """Index of the first word of `args` that is neither an option nor an option's value
        (where the command to run begins); None when there is none, or `--` comes first."""
        takes_value = {opt for p in self.params if isinstance(p, click.Option) and not p.is_flag
                       and not p.count for opt in p.opts}
        i = 0
        while i < len(args):
            word = args[i]
            if word == "--":
                return None
            if not word.startswith("-") or word == "-":
                return i
            i += 2 if word in takes_value else 1
        return None
