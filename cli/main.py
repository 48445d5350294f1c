"""`memprof`: the click front end. Commands parse, call one library function, and hand the
result to one renderer; errors become one line and an exit code here, and only here."""
from __future__ import annotations

import os
import sys

from memprof import own_env, stdio  # light: before numpy and pyarrow load

stdio.reserve()  # before any file is opened: 0-2 closed at start must not go to memprof's files
own_env.apply()  # memprof's own tuning, kept out of the commands it runs (own_env.py)

import click  # noqa: E402

from memprof import __version__  # noqa: E402
from memprof.errors import ExitCode, MemprofError  # noqa: E402


class MemprofGroup(click.Group):
    """Maps MemprofError to its exit code and Ctrl-C to 130, never a traceback."""

    def invoke(self, ctx):
        # The console (rich: ~14 ms) is imported where a message is written, not before the
        # command runs: `record` begins bcc's compile first (issue 24: start-up).
        try:
            return super().invoke(ctx)
        except MemprofError as e:
            from memprof.cli import console
            console.error(e.message, e.hint)
            ctx.exit(e.exit_code)
        except KeyboardInterrupt:
            from memprof.cli import console
            console.error("interrupted")
            ctx.exit(ExitCode.INTERRUPTED)
        except BrokenPipeError:
            sys.stderr.close()
            ctx.exit(ExitCode.OK)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException, SystemExit):
            raise
        except Exception as e:  # a bug: one line for the user, the traceback in a file
            from memprof.cli import console
            console.error(f"internal error: {type(e).__name__}: {e}", f"please report it with {_save_traceback()}")
            ctx.exit(ExitCode.ERROR)


@click.group(cls=MemprofGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="memprof")
def cli():
    """memprof: the memory of a Linux ML job — kernel, native, PyTorch and CUDA — on one timeline.

    \b
      sudo memprof record -- python train.py    record a command (probes attach before it starts)
      sudo memprof record --pid 4242            attach to a running process and its children
      memprof report leaks                      what was still held at the end, and who allocated it
      memprof diff base.memprof head.memprof    what changed between two recordings, by layer and chain
      memprof check --max-peak 2GiB             memory budgets for CI (exit 6 when one is broken)
      memprof export --format perfetto          for other tools: Perfetto, speedscope, pprof, CSV, …
      memprof import snap.pickle                a PyTorch CUDA memory snapshot as a recording (no root)
      memprof doctor                            check that recording can work on this machine
    """


def _save_traceback() -> str:
    import tempfile
    import traceback
    with tempfile.NamedTemporaryFile("w", prefix="memprof-crash-", suffix=".txt", delete=False) as f:
        traceback.print_exc(file=f)
        return f.name


def _register() -> None:
    from memprof.cli.check import check
    from memprof.cli.diff import diff
    from memprof.cli.doctor import doctor
    from memprof.cli.export import export
    from memprof.cli.import_ import import_
    from memprof.cli.record import record
    from memprof.cli.report import report
    cli.add_command(record)
    cli.add_command(report)
    cli.add_command(doctor)
    cli.add_command(import_)
    cli.add_command(diff)
    cli.add_command(check)
    cli.add_command(export)


_register()


# Commands that leave without the interpreter's finalization once they are done. A recorder
# holds a heap of symbols, frames and Arrow buffers, and thread pools; freeing them one by one
# at exit took 0.12-0.15 s of `record -- python train.py` after the recording was finalized
# and the command waited for (bench/RESULTS.md), time the user waits for nothing. Their last
# step closes every file they write and waits for their threads, so nothing is left to do.
EXIT_WITHOUT_FINALIZING = frozenset({"record"})


def main() -> None:
    args = sys.argv[1:]
    _give_up_root(args)
    try:
        cli(prog_name="memprof")
    except SystemExit as e:
        if _command_name(args) in EXIT_WITHOUT_FINALIZING:
            _exit_without_finalizing(e.code)
        raise


def _command_name(args: list[str]) -> str | None:
    return next((arg for arg in args if not arg.startswith("-")), None)


def _exit_without_finalizing(code) -> None:
    """Leave the process as sys.exit(code) would, without finalizing the interpreter: stdout
    and stderr are flushed (a closed pipe is ignored: there is no one left to tell), then
    os._exit. Only here, in the process's entry point: tests run `cli` in their own process."""
    if code is None:
        status = 0
    elif isinstance(code, int):
        status = code
    else:
        print(code, file=sys.stderr)
        status = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe, a closed stream
            pass
    os._exit(status)


def _give_up_root(args: list[str]) -> None:
    """Run through sudo, only record and doctor keep root: any other command becomes the
    user for good before it reads or writes anything (memprof.privileges). Here, in the
    process's entry point, and not in the group's callback: tests run `cli` inside their
    own process, which must stay as it is. A failure is one line and exit 1."""
    from memprof.privileges import NEEDS_ROOT, drop_root_if_sudo
    if _command_name(args) in NEEDS_ROOT:
        return
    try:
        drop_root_if_sudo()
    except MemprofError as e:
        from memprof.cli import console
        console.error(e.message, e.hint)
        sys.exit(e.exit_code)
