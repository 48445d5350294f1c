"""What every command with `-o` shares: `-o -` is stdout, a file is written through
memprof.safe_output (a planted link is replaced, never followed: docs/SECURITY.md), and each
file written is announced once, on stderr, as `memprof: wrote PATH (what it is)`."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import click

STDOUT = "-"


def to_stdout(output) -> bool:
    """Whether `-o` names stdout."""
    return output is not None and os.fspath(output) == STDOUT


def not_stdout(what: str):
    """A click callback for the `-o` of a command whose output is a directory (`what`, e.g.
    "a recording"): `-o -` is refused, not taken as a folder named '-'."""
    def check(ctx, param, value):
        if to_stdout(value):
            raise click.BadParameter(f"{what} is a directory and cannot go to stdout; give a path")
        return value
    return check


def write(output, data: bytes | str, *, detail: str, binary: bool = False) -> None:
    """Write `data` (str as UTF-8) to the file `output`, or to stdout for '-'; a file is
    announced (`wrote`). `binary`: data a terminal cannot show (a protobuf, gzip), refused
    with UsageError when stdout is a terminal. MemprofError when the file cannot be written."""
    if to_stdout(output):
        _to_stdout(data, binary)
        return
    from memprof.errors import MemprofError
    from memprof.safe_output import write_output
    try:
        write_output(output, data)
    except OSError as e:  # memprof.safe_output.UnsafeOutputError (a link on the way) passes as it is
        raise MemprofError(f"cannot write {output}: {e.strerror or e}", "choose a writable path with -o") from None
    wrote(output, detail)


def check_stdout(output, *, binary: bool) -> None:
    """UsageError when `output` is stdout, `binary` and stdout a terminal (called before the
    work, so that the refusal comes at once)."""
    from memprof.errors import UsageError
    if to_stdout(output) and binary and stdout_is_terminal():
        raise UsageError("this format is binary and stdout is a terminal",
                         "redirect it (-o - > FILE, or into a pipe), or give -o a file")


def _to_stdout(data: bytes | str, binary: bool) -> None:
    check_stdout(STDOUT, binary=binary)
    with click.open_file(STDOUT, "wb") as stream:  # stdout is left open
        stream.write(data.encode("utf-8") if isinstance(data, str) else data)


def stdout_is_terminal() -> bool:
    return sys.stdout.isatty()


def wrote(path: Path | str, detail: str) -> None:
    """The one line that says a file (or a directory of files) was written: on stderr,
    `memprof: wrote PATH (DETAIL)`."""
    from memprof.cli import console
    console.info(f"wrote {path} ({detail})")
