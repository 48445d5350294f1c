"""`memprof import`: PyTorch CUDA memory snapshots and torch.profiler traces → a recording."""
from __future__ import annotations

from pathlib import Path

import click

from memprof.cli.output import not_stdout


@click.command("import")
@click.argument("files", nargs=-1, required=True, metavar="FILE...", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path), callback=not_stdout("a recording"),
              help="Recording path (default ./STEM.memprof, after the first FILE).")
@click.option("-f", "--force", is_flag=True, help="Overwrite an existing recording at --output.")
def import_(files, output, force):
    """Turn PyTorch CUDA memory snapshots (and torch.profiler Chrome traces) into a recording
    that every report reads. No privileges needed.

    \b
      torch.cuda.memory._record_memory_history(max_entries=100000)   # in the job
      ...
      torch.cuda.memory._dump_snapshot("snap.pickle")                # in the job
      memprof import snap.pickle                                     # writes ./snap.memprof
      memprof report leaks snap.memprof

    Each FILE is a pickle written by torch.cuda.memory._dump_snapshot (gzip allowed). It is
    loaded without running anything it names: a pickle that names a function or class (a
    snapshot never does) is refused with exit status 5, as is a file that is not a snapshot,
    a damaged one, or one that would cost memory out of proportion to its size (a gzip FILE
    may decompress to 64 times its size, at least 64 MiB: gunzip a larger one first).
    The recording is written under a hidden temporary name beside -o and renamed when it is
    complete: a refused FILE or an interrupted import leaves nothing behind.

    A FILE whose content starts with `{` is a Chrome trace from torch.profiler's
    export_chrome_trace (profile_memory=True; with_stack=True adds Python frames): its
    [memory] events become torch_cpu and cuda_block events.

    Snapshot trace entries become cuda_block and cuda_segment events with their Python frames;
    allocations still held at the snapshot whose alloc the trace no longer has are shown as
    allocated at its first time. Times are the snapshot's own (CLOCK_REALTIME). Several FILEs
    are appended into one recording; of one process's snapshots, import only the latest (it
    holds the earlier ones' trace).
    """
    from memprof.cli import console
    from memprof.importer import import_snapshots

    result = import_snapshots(list(files), output, force=force)
    for warning in result.warnings:
        console.warning(warning)
    devices = f" on {', '.join(result.devices)}" if result.devices else ""
    files = "file" if result.files == 1 else "files"
    console.info(f"imported {result.events:,} events{devices} from {result.files} {files} to {result.path}; "
                 f"see `memprof report leaks {result.path}`")
