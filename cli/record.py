"""`memprof record`."""
from __future__ import annotations

import os
import platform
import re
from pathlib import Path
from typing import NamedTuple

import click

from memprof.cli.output import not_stdout
from memprof.proc_text import process_began_monotonic
from memprof.cli.typos import CommandAfterOptions

DEFAULT_SOURCES = ("kmem", "torch", "cuda")
KNOWN_SOURCES = ("kmem", "torch", "cuda", "native")


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


class ChosenSources(NamedTuple):
    """What --sources chose: the families probed, and those of the defaults this host
    cannot use, with why (EbpfOptions.left_out)."""
    families: tuple[str, ...]
    left_out: dict[str, str]


def _sources(ctx, param, value) -> ChosenSources:
    """'kmem,torch' replaces the defaults; '+native' (or 'kmem,+native') adds to them. cuda
    from the defaults is left out where no NVIDIA driver is loaded; named, it is kept."""
    from memprof.sources.ebpf.options import families_for_this_host
    if value is None:  # not given: the defaults, none of them named
        return ChosenSources(*families_for_this_host(DEFAULT_SOURCES, named=()))
    names = [s.strip() for s in value.split(",") if s.strip()]
    if not names or any(n in ("", "+") for n in names):
        raise click.BadParameter(f"name at least one source: {', '.join(KNOWN_SOURCES)} (or +NAME to add one)")
    added = [n[1:] for n in names if n.startswith("+")]
    chosen = [n for n in names if not n.startswith("+")]
    result = list(chosen or DEFAULT_SOURCES) + added
    unknown = [s for s in result if s not in KNOWN_SOURCES]
    if unknown:
        raise click.BadParameter(f"unknown source {', '.join(unknown)}; available: {', '.join(KNOWN_SOURCES)}")
    return ChosenSources(*families_for_this_host(tuple(dict.fromkeys(result)), named={*chosen, *added}))


def _size(value: str) -> int:
    from memprof.errors import UsageError
    from memprof.units import parse_size
    try:
        return parse_size(value)
    except UsageError as e:
        raise click.BadParameter(e.message) from None


MAX_KERNEL_SAMPLE_BYTES = 1 << 30  # bpf/kmem.bpf.c's draw multiplies it by a 32-bit random number


def _kernel_sample_bytes(ctx, param, value: str) -> int:
    """--kernel-sample-bytes: 0 (every allocation) or 1 byte to 1 GiB."""
    size = _size(value)
    if size > MAX_KERNEL_SAMPLE_BYTES:
        raise click.BadParameter(f"{value} is more than 1GiB: at most 1GiB, or 0 to take every allocation")
    return size


MIN_MAX_SIZE = 16 << 20  # below this, folding would run at nearly every flush


def _max_size(ctx, param, value: str) -> int | None:
    """--max-size: bytes, None for 0 (no limit)."""
    size = _size(value)
    if size == 0:
        return None
    if size < MIN_MAX_SIZE:
        raise click.BadParameter(f"{value} is below the smallest limit, 16MiB (0: no limit)")
    return size


def _power_of_two(ctx, param, value):
    if value < 1 or value & (value - 1):
        raise click.BadParameter(f"must be a power of two (1, 2, 4, …), got {value}")
    return value


MIN_RING_BUFFER, MAX_RING_BUFFER = 1 << 20, 1 << 30


def _ring_buffer(ctx, param, value: str) -> int:
    """--ring-buffer: bytes, a power of two the kernel's BPF ring buffer accepts."""
    size = _size(value)
    if size & (size - 1) or not MIN_RING_BUFFER <= size <= MAX_RING_BUFFER:
        raise click.BadParameter(f"must be a power of two from 1MiB to 1GiB (e.g. 32MiB), got {value}"
                                 f"{_binary_unit_meant(value)}")
    return size


def _binary_unit_meant(value: str) -> str:
    """', which is 512,000,000 bytes: did you mean 512MiB?' where `value` has a decimal unit
    (K, M, G, KB, MB, GB: powers of 1000 in memprof's sizes) whose binary twin (KiB, MiB,
    GiB) is a ring size the kernel accepts; '' otherwise."""
    match = re.fullmatch(r"\s*([0-9]+)\s*([kmgKMG])[bB]?\s*", value)
    if not match:
        return ""
    meant = f"{match[1]}{match[2].upper()}iB"
    binary = _size(meant)
    if binary & (binary - 1) or not MIN_RING_BUFFER <= binary <= MAX_RING_BUFFER:
        return ""
    return f", which is {_size(value):,} bytes: did you mean {meant}?"


def _step_range(ctx, param, value):
    """"A-B" (steps, 1-based, inclusive) → (A, B); None stays None."""
    if value is None:
        return None
    first, sep, last = value.partition("-")
    try:
        a, b = int(first), int(last if sep else first)
    except ValueError:
        raise click.BadParameter(f"expected A-B (e.g. 10-12), got {value!r}") from None
    if a < 1 or b < a:
        raise click.BadParameter(f"expected 1 <= A <= B, got {value!r}")
    return a, b


def job_tag(command: list[str], environ, host: str) -> str:
    """JOB-HOST for the default output name of one machine's recording of a multi-machine
    job, "" for anything else. JOB: "slurm" + SLURM_JOB_ID under Slurm; under a torchrun of
    more than one node (--nnodes N or MIN:MAX, or PET_NNODES), its --rdzv-id (PET_RDZV_ID),
    else "torchrun" and its --node-rank."""
    if environ.get("SLURM_JOB_ID"):
        return f"slurm{environ['SLURM_JOB_ID']}-{host}"
    args = _torchrun_args(command)
    if args is None:
        return ""
    nnodes = args.get("nnodes", environ.get("PET_NNODES", "1"))
    if nnodes.split(":")[-1] in ("", "1"):
        return ""
    run = args.get("rdzv_id", environ.get("PET_RDZV_ID", ""))
    if not run or run == "none":
        run = f"torchrun-node{args.get('node_rank', environ.get('PET_NODE_RANK', '0'))}"
    return f"{run}-{host}"


def _torchrun_args(command: list[str]) -> dict[str, str] | None:
    """The launcher's own --name value options (dashes as underscores) when `command` is
    torchrun (or python -m torch.distributed.run); None when it is not."""
    words = [str(word) for word in command]
    module = words.index("-m") + 1 if "-m" in words else 0  # where `python -m`'s module name is
    if words and Path(words[0]).name == "torchrun":
        rest = words[1:]
    elif module and words[module:module + 1] == ["torch.distributed.run"]:
        rest = words[module + 1:]
    else:
        return None
    found: dict[str, str] = {}
    index = 0
    while index < len(rest) and rest[index].startswith("--"):  # then the script: its options are its own
        name, sep, value = rest[index][2:].partition("=")
        index += 1
        if not sep and index < len(rest) and not rest[index].startswith("-") and not rest[index].endswith(".py"):
            value, index = rest[index], index + 1
        found[name.replace("-", "_")] = value
    return found


@click.command(cls=CommandAfterOptions, context_settings={"ignore_unknown_options": False})
@click.option("-o", "--output", type=click.Path(path_type=Path), callback=not_stdout("a recording"),
              help="Recording path (default ./memprof-NAME-PID.memprof; under Slurm or a multi-node torchrun "
                   "./memprof-JOB-HOST-NAME-PID.memprof).")
@click.option("--host-label", metavar="NAME",
              help="The host this recording stands for in a job's report (meta.json's host; default: this "
                   "machine's name).")
@click.option("-p", "--pid", type=int, help="Attach to this running process and its descendants.")
@click.option("-d", "--duration", callback=_duration, help="Stop after this long (e.g. 60, 90s, 500ms, 5m).")
@click.option("--max-size", default="1GiB", show_default=True, metavar="SIZE", callback=_max_size,
              help="Keep the recording under SIZE on disk. Past 3/4 of it, the oldest events are folded: "
                   "allocations made and freed within the same second become one per chain and second, with "
                   "their count and bytes; what outlives its second, and what was live at each layer's peak, is "
                   "kept as recorded, and the newest quarter of SIZE is never folded. So leaks, growth and peaks "
                   "come out as on a full recording; live bytes inside a second miss what was folded there. "
                   "What stays live is never folded: where it alone passes SIZE, the recording grows past it, "
                   "and its notes say so and what SIZE would hold it. At least 16MiB; 0: no limit. Units: 512MiB, 4GiB.")
@click.option("--sources", default=None, show_default=",".join(DEFAULT_SOURCES), callback=_sources,
              help="Capture sources: kmem (kernel slab and pages), torch (PyTorch CPU allocator), cuda (CUDA "
                   "driver; left out of the default where no NVIDIA driver is loaded, +cuda keeps it), native "
                   "(libc heap, sampled by size; off by default: on the PyTorch benches it added about 0.5 s and "
                   "7-35 % of loop time to the default sources, bench/RESULTS.md). A list "
                   "replaces the default; +NAME adds to it (--sources +native).")
@click.option("-f", "--force", is_flag=True,
              help="Replace an existing memprof recording of yours at --output (never a file, a link or any "
                   "other folder).")
@click.option("--stack-every", default=64, show_default=True, callback=_power_of_two,
              help="Take a full stack for one slab allocation in N (1 = every one); the others share their call site's "
                   "latest stack, or where one call site is reached through several kernel paths, their path's.")
@click.option("--page-stack-every", default=8, show_default=True, callback=_power_of_two,
              help="The same for page allocations.")
@click.option("--user-stack-every", default=16, show_default=True, callback=_power_of_two,
              help="The same for user-space allocators (torch, cuda, native): one in N unwinds its native "
                   "stack, the others share their call site's (Python frames are read for every one).")
@click.option("--ring-buffer", default="128MiB", show_default=True, metavar="SIZE", callback=_ring_buffer,
              help="Kernel memory for events on their way to memprof (a power of two). A burst that outruns "
                   "memprof's reading waits there; once it is full, events are lost and counted (the summary "
                   "and meta.json say how many). memprof's resident size counts it once: 32MiB makes memprof "
                   "about 96 MB smaller, but with two kernel-heavy processes on "
                   "two CPUs it lost up to 4 % of their events, and 64MiB up to 1 %, where the default lost "
                   "none (bench/RESULTS.md).")
@click.option("--user-pages", is_flag=True, help="Also record user and page-cache pages (movable) in kernel_page.")
@click.option("--kernel-sample-bytes", default="0", show_default=True, metavar="SIZE", callback=_kernel_sample_bytes,
              help="kmem: take each kernel allocation with probability min(1, size/SIZE) and weight it by "
                   "SIZE/size, so that byte and count totals stay unbiased estimates. For long jobs heavy in "
                   "system calls: at 64KiB, a loop of nothing but pipes and socketpairs ran 1.52x slower "
                   "recorded instead of 2.04x (bench/RESULTS.md), but a leak of a few small objects may be "
                   "missed or over-counted. 0 takes every one (exact counts). Units allowed: 64KiB.")
@click.option("--native-sample-bytes", default="64KiB", show_default=True, callback=lambda c, p, v: _size(v),
              help="native: take each libc allocation with probability min(1, size/N) and weight it by "
                   "N/size, as heap profilers such as tcmalloc's sample: unbiased totals at a fraction of the "
                   "cost, but a chain of a few small allocations may be missed or over-counted. 0 takes every "
                   "one (exact counts; costs more). Units allowed: 64KiB.")
@click.option("--native-probes", type=click.Choice(["auto", "preload", "uprobes"]), default="auto", show_default=True,
              help="native: how the libc heap is taken. preload puts memprof's interposer into the command "
                   "(LD_PRELOAD): one uprobe hit per recorded event, none for allocations the sampling leaves "
                   "out. uprobes traps every malloc, its return and every free (several times the cost; "
                   "bench/RESULTS.md). auto: preload for a command memprof starts, unless its environment "
                   "sets LD_PRELOAD already or the interposer is not built; uprobes for --pid.")
@click.option("--allocator-prefix", default="", metavar="PREFIX",
              help="native: probe PREFIXmalloc, PREFIXfree, … (e.g. je_ for a jemalloc built with a prefix).")
@click.option("--alloc-probes", type=click.Choice(["call-site", "entry-return"]), default="call-site",
              show_default=True,
              help="torch: call-site takes each c10::alloc_cpu in one uprobe, on its call to "
                   "c10::NUMAMove(data, nbytes), where that call is found in libc10 (else it falls back, "
                   "and meta.json says why); entry-return always uses a uprobe at entry and a "
                   "uretprobe at return (one more trap per tensor).")
@click.option("--python-frames/--no-python-frames", default=True, show_default=True,
              help="Read the allocating thread's Python frames (CPython 3.10-3.13) at each event, so "
                   "chains read Python → native → kernel.")
@click.option("--agent/--no-agent", default=True, show_default=True,
              help="Start memprof's agent in the command's Python processes that import torch (through "
                   "PYTHONPATH): training steps, memprof.mark(), CUDA caching-allocator history.")
@click.option("--torch-profile-steps", callback=_step_range, metavar="A-B",
              help="Run a torch.profiler window (memory, shapes, Python stacks) over steps A to B only.")
@click.option("--torch-modules", is_flag=True,
              help="Have the agent record every nn.Module forward on each thread, so that `report top --by "
                   "module` and leak and growth chains name the module instance (transformer.h.3.attn) that "
                   "allocated. Off by default: it costs a small CPU training step about 3% (bench/RESULTS.md); "
                   "without it only outermost forwards are seen (steps, input sizes).")
@click.option("-q", "--quiet", is_flag=True,
              help="Only the final line: no phases (loading probes, recording, finalizing), no live status line.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def record(output, host_label, pid, duration, max_size, sources, force, stack_every, page_stack_every, user_stack_every,
           ring_buffer, user_pages, kernel_sample_bytes,
           native_sample_bytes, native_probes,
           allocator_prefix, alloc_probes, python_frames, agent, torch_profile_steps, torch_modules, quiet,
           command):
    """Record a command, or attach to a running process, until it exits.

    \b
      sudo memprof record -- python train.py
      sudo memprof record -o run.memprof --duration 60 --pid 4242

    Probes attach before COMMAND starts, and follow it through fork and exec. Under sudo the
    command runs as the invoking user, who also owns the recording: it is created and written
    with that user's permissions, and --pid reaches only their own processes (see
    docs/SECURITY.md). Signals are passed on to
    the command, and memprof exits with its exit status. Recording stops when the command's
    process tree has exited, at --duration, or on Ctrl-C; each finalizes the recording.
    memprof's own threads run at SCHED_BATCH once it records: they never preempt the command.
    """
    from memprof.heap import share_one_arena
    share_one_arena()  # before the recorder's first thread: its garbage in one arena, trimmable
    from memprof.sources.ebpf import early
    from memprof.sources.ebpf.options import EbpfOptions
    from memprof.sources.ebpf.kmem import KmemOptions
    from memprof.sources.cpython.options import PythonOptions

    if pid is not None and command:
        raise click.UsageError("give either --pid or a command, not both")
    if pid is None and not command:
        raise click.UsageError("nothing to record: give a command after --, or --pid")
    if pid is not None and native_probes == "preload":
        raise click.UsageError("--native-probes preload needs a command memprof starts: a running process "
                               "(--pid) has its libraries loaded; use --native-probes uprobes (or auto)")
    if allocator_prefix and native_probes == "preload":
        raise click.UsageError("--allocator-prefix names an allocator's own functions, which only uprobes reach; "
                               "drop --native-probes preload")
    kmem = KmemOptions(slab_stack_every=stack_every, page_stack_every=page_stack_every, include_user_pages=user_pages,
                       sample_bytes=kernel_sample_bytes)
    ebpf = EbpfOptions(families=sources.families, left_out=sources.left_out, kmem=kmem,
                       native_sample_bytes=native_sample_bytes, native_probes=native_probes,
                       user_stack_every=user_stack_every, allocator_prefix=allocator_prefix, alloc_probes=alloc_probes,
                       ringbuf_bytes=ring_buffer, python=PythonOptions(enabled=python_frames))
    early.begin(ebpf)  # bcc compiles on a thread while the recorder below is imported and checks its input
    # numpy and pyarrow, before the command starts, though the recorder's modules would
    # import them at its first poll (memprof/lazy_import.py): imported after the start,
    # their loads (dlopen and module setup hold the GIL for tens of milliseconds at a time)
    # held up the recorder's first RSS sample and its first drain while the command began,
    # and a 64 MiB allocation in a Python command's first moments went unseen (CI,
    # bench/RESULTS.md, 2026-12-05).
    import numpy  # noqa: F401
    import pyarrow  # noqa: F401
    from memprof.lazy_import import without_cloud_filesystems
    without_cloud_filesystems()  # the recording is local files: no S3 library loaded at the first flush

    from memprof.cli import console
    from memprof.cli.status import StatusLine
    from memprof.capture.session import RecordRequest, Session
    from memprof.sources.agent_reader.source import AgentOptions
    request = RecordRequest(
        command=list(command) or None, pid=pid, output=output, duration_s=duration, force=force, host=host_label,
        max_size_bytes=max_size,
        output_tag=job_tag(list(command), os.environ, host_label or platform.node()),
        ebpf=ebpf,
        agent=AgentOptions(enabled=agent, profile_steps=torch_profile_steps, torch_modules=torch_modules),
    )
    status = StatusLine(console.err, enabled=not quiet, began_at=process_began_monotonic())
    try:
        result = Session(request, on_status=status.update if status.enabled else None,
                         on_notice=console.warning, on_phase=status.phase).run()
    finally:
        status.close()
    console.info(_summary(result))
    if result.exit_status is not None:
        raise SystemExit(result.exit_status)


def _summary(result) -> str:
    from memprof.units import format_bytes
    loss = f", {result.lost:,} lost" if result.lost else ""
    missed = f", {result.missed:,} frees skipped by the kernel" if result.missed else ""
    folded = (f"; its oldest events were folded {result.folds} times to stay under --max-size"
              if result.folds else "")
    if result.max_size_bytes and result.size_bytes > result.max_size_bytes:
        folded = (f"; it takes {format_bytes(result.size_bytes)}, over --max-size {format_bytes(result.max_size_bytes)}"
                  f"{f' after {result.folds} folds' if result.folds else ''}: what it must keep took it, its notes say "
                  "what and the limit that would hold it")
    elif result.passed_limit:
        folded = (f"; it takes {format_bytes(result.size_bytes)} after {result.folds} folds, but passed --max-size "
                  f"{format_bytes(result.max_size_bytes)} while it ran: its notes say why and the limit that would "
                  "hold it")
    return (f"recorded {result.events:,} events{loss}{missed} to {result.path}{folded}; "
            f"see `memprof report leaks {result.path}`")
