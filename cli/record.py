"""`memprof record`."""
from __future__ import annotations

from pathlib import Path

import click

KNOWN_SOURCES = ("kmem",)


def _duration(ctx, param, value):
    if value is None:
        return None
    from memprof.units import parse_duration
    from memprof.errors import UsageError
    try:
        seconds = parse_duration(value)
    except UsageError as e:
        raise click.BadParameter(e.message) from None
    if seconds <= 0:
        raise click.BadParameter("must be positive")
    return seconds


def _sources(ctx, param, value):
    names = tuple(s.strip() for s in value.split(",") if s.strip())
    unknown = [s for s in names if s not in KNOWN_SOURCES]
    if unknown or not names:
        raise click.BadParameter(f"unknown source {', '.join(unknown) or '(none)'}; available: {', '.join(KNOWN_SOURCES)}")
    return names


def _power_of_two(ctx, param, value):
    if value < 1 or value & (value - 1):
        raise click.BadParameter(f"must be a power of two (1, 2, 4, …), got {value}")
    return value


@click.command(context_settings={"ignore_unknown_options": False})
@click.option("-o", "--output", type=click.Path(path_type=Path), help="Recording path (default ./memprof-NAME-PID.memprof).")
@click.option("-p", "--pid", type=int, help="Attach to this running process and its descendants.")
@click.option("-d", "--duration", callback=_duration, help="Stop after this long (e.g. 60, 90s, 500ms, 5m).")
@click.option("--sources", default="kmem", show_default=True, callback=_sources, help="Comma-separated capture sources.")
@click.option("-f", "--force", is_flag=True, help="Overwrite an existing recording at --output.")
@click.option("--stack-every", default=64, show_default=True, callback=_power_of_two,
              help="Take a full stack for one slab allocation in N (1 = every one); the others share their call site's latest stack.")
@click.option("--page-stack-every", default=8, show_default=True, callback=_power_of_two,
              help="The same for page allocations.")
@click.option("--user-pages", is_flag=True, help="Also record user and page-cache pages (movable) in kernel_page.")
@click.option("-q", "--quiet", is_flag=True, help="No live status line.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def record(output, pid, duration, sources, force, stack_every, page_stack_every, user_pages, quiet, command):
    """Record a command, or attach to a running process, until it exits.

    \b
      sudo memprof record -- python train.py
      sudo memprof record -o run.memprof --duration 60 --pid 4242

    Probes attach before COMMAND starts, and follow it through fork and exec. Under sudo the
    command runs as the invoking user, who also owns the recording. Signals are passed on to
    the command, and memprof exits with its exit status. Recording stops when the command's
    process tree has exited, at --duration, or on Ctrl-C; each finalizes the recording.
    """
    from memprof.cli import console
    from memprof.cli.status import StatusLine
    from memprof.record.session import RecordRequest, Session
    from memprof.sources.kmem import KmemOptions

    if pid is not None and command:
        raise click.UsageError("give either --pid or a command, not both")
    if pid is None and not command:
        raise click.UsageError("nothing to record: give a command after --, or --pid")
    request = RecordRequest(
        command=list(command) or None, pid=pid, output=output, duration_s=duration, sources=sources, force=force,
        kmem=KmemOptions(slab_stack_every=stack_every, page_stack_every=page_stack_every, include_user_pages=user_pages),
    )
    status = StatusLine(console.err, enabled=not quiet)
    try:
        result = Session(request, on_status=status.update if status.enabled else None).run()
    finally:
        status.close()
    console.info(_summary(result))
    if result.exit_status is not None:
        raise SystemExit(result.exit_status)


def _summary(result) -> str:
    loss = f", {result.lost} lost" if result.lost else ""
    missed = f", {result.missed} skipped by the kernel" if result.missed else ""
    return f"recorded {result.events:,} events{loss}{missed} to {result.path}; see `memprof report leaks {result.path}`"
