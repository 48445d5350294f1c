"""`memprof report top | peak | chains`: who held each layer's live bytes at one moment."""
from __future__ import annotations

import click

from memprof.cli.common import LAYER_CHOICES, REPORT_FORMATS, analysed, emit, native_frames_option, max_memory_option
from memprof.cli.report import report

BY_CHOICES = ("chain", "function", "layer", "category", "module", "rank")  # memprof.analysis.attribution.BY_CHOICES
_AT_HELP = ("When each layer is judged: end (the target began to exit, before its teardown frees), peak "
            "(each layer at its own high-water mark, first reached), or a time after the recording's "
            "start such as 12.5s or +1500ms.")
_LAYERS_NOTE = "Layers nest (a tensor lives in the heap, a slab in pages), so their bytes are never added up."


def _parse_at(ctx, param, value):
    """'end' | 'peak' | ns after the recording's start (range checked against the recording later)."""
    from memprof.errors import UsageError
    from memprof.units import parse_duration
    text = str(value).strip().lower()
    if text in ("end", "peak"):
        return text
    try:
        seconds = parse_duration(text[1:] if text.startswith("+") else text)
    except UsageError as e:
        raise click.BadParameter(f"{e.message}; give end, peak, or a time after the recording's start "
                                 "such as 12.5s or +1500ms") from None
    return int(round(seconds * 1e9))


def _common(fn):
    """PATH, --layer, --top, --format and --native-frames, shared by every command here."""
    for option in reversed([
        click.argument("path", required=False, type=click.Path(path_type=str)),
        click.option("--layer", "layers", multiple=True, type=click.Choice(LAYER_CHOICES),
                     help="Only these layers (repeatable)."),
        click.option("--top", default=10, show_default=True, type=click.IntRange(min=1), help="Rows shown per layer."),
        click.option("--format", "fmt", default=REPORT_FORMATS[0], show_default=True, type=click.Choice(REPORT_FORMATS),
                     help="table: for the terminal; json: every number, times in CLOCK_MONOTONIC ns, sizes in bytes."),
        native_frames_option,
    ]):
        fn = option(fn)
    return fn


def _at_option(fn):
    return click.option("--at", "at", default="end", show_default=True, metavar="end|peak|TIME",
                        callback=_parse_at, help=_AT_HELP)(fn)


def _attributed(path, *, by: str, at, layers, top, native_frames):
    """The AttributionView of the recording at `path` (memprof.api.Analysed.attribution)."""
    # A recording folded to fit in memory keeps what was live at a time only when asked.
    keep_at = () if isinstance(at, str) else (at,)
    return analysed(path, keep_at=keep_at).attribution(by=by, at=at, layers=layers, top=top,
                                                        native_frames=native_frames)


@report.command(epilog=_LAYERS_NOTE)
@_common
@click.option("--by", default="chain", show_default=True, type=click.Choice(BY_CHOICES),
              help="chain: allocation chains; function: self and total bytes per function; layer: each layer's "
                   "total side by side; category: tensor roles (parameter, activation, …; unknown where none "
                   "was recorded); module: the nn.Module instance path (transformer.h.3.attn) whose forward "
                   "was running on the allocating thread (the innermost; needs the torch agent); rank: the "
                   "rank of a distributed job's process (torchrun, Slurm, MPI), as its agent read it.")
@_at_option
@max_memory_option
def top(path, layers, top, fmt, native_frames, by, at):
    """Live bytes and allocations per layer at one moment, biggest first.

    \b
    By function, a function is (kind, name, and its library for native and kernel frames or
    its file for Python ones). Its total is the bytes of live allocations whose chain holds it
    (once per chain, even when recursive); its self is the bytes whose chain's innermost frame
    it is. Chains are read merged (the interpreter's eval-loop frames give way to the Python
    frames they ran) unless --native-frames all. In kernel chains the innermost frame is the
    allocator's call site as the tracepoint recorded it, so self bytes land there.
    Sampled allocations count by their weight (bytes and counts are estimates then).
    """
    emit(fmt, _attributed(path, by=by, at=at, layers=layers, top=top, native_frames=native_frames))


@report.command(epilog=_LAYERS_NOTE)
@_common
@max_memory_option
def peak(path, layers, top, fmt, native_frames):
    """For each layer: when its peak (high-water mark, first reached) happened and which
    allocation chains held it then. Each layer is judged at its own peak."""
    emit(fmt, _attributed(path, by="chain", at="peak", layers=layers, top=top, native_frames=native_frames))


@report.command(epilog=_LAYERS_NOTE)
@_common
@_at_option
@click.option("--flame", is_flag=True,
              help="Print folded stacks for flame-graph tools (flamegraph.pl, inferno, speedscope): one line "
                   "per chain, 'layer;outermost;…;innermost BYTES', every live chain (no --top).")
# readable=False: an output is not read, and whatever is at its name (a link too) is replaced.
@click.option("-o", "--output", type=click.Path(dir_okay=False, readable=False, path_type=str),
              help="With --flame: write the folded stacks to this file instead of stdout ('-': stdout).")
@max_memory_option
def chains(path, layers, top, fmt, native_frames, at, flame, output):
    """Allocation chains holding each layer's live bytes at one moment (the table of
    `report top --by chain`), or with --flame their folded stacks.

    \b
    Folded stacks hold kernel, native and Python frames in one chain, outermost first, as
    '[py] step (train.py:42)', '[n] at::empty (libtorch_cpu.so)', '[k] alloc_pipe_info'
    (a ';' in a name becomes ','); the root frame is the layer, and allocations recorded
    without a stack sit under 'LAYER;[no stack]'. Widths are live bytes (sampled weights
    applied). The layers nest, so widths of different layers must not be added: pick one
    with --layer to compare chains. With --at peak each layer is taken at its own peak.
    """
    from memprof.errors import UsageError
    if flame and fmt == "json":
        raise UsageError("--flame and --format json are two outputs", "choose one: folded stacks or JSON")
    if output and not flame:
        raise UsageError("-o/--output writes folded stacks", "add --flame, or redirect the table or JSON")
    view = _attributed(path, by="chain", at=at, layers=layers, top=None if flame else top,
                       native_frames=native_frames)
    if flame:
        _write_folded(view, output)
        return
    emit(fmt, view)


def _write_folded(view, output: str | None) -> None:
    from memprof.cli import output as out
    from memprof.report.attribution import folded_stacks

    text = "".join(line + "\n" for line in folded_stacks(view.result, view.chains))
    if output is None:
        click.echo(text, nl=False)
        return
    out.write(output, text, detail="folded stacks")  # '-': stdout; a link at `output` is replaced, never followed
