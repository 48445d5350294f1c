"""Environment settings memprof makes for its own process, and keeps out of the commands it
runs: a profiler must not change the program it measures (under `memprof record -- CMD`,
CMD gets the environment memprof was given, not memprof's own tuning).

Imports nothing heavy: `cli/main.py` applies the settings before numpy or pyarrow load.
"""
from __future__ import annotations

import os
from typing import Mapping

# Each is read once, by a library memprof itself uses, and a user's own setting wins.
SETTINGS = {
    # Before numpy is imported: an analysis touches each of its gigabyte of fresh arrays once
    # or twice, and on VMs with transparent huge pages on madvise (as here), numpy's huge-page
    # advice makes those first touches ~4x slower (measured: 800 MB in 1.5 s against 0.33 s;
    # a 10^7-event `report leaks` 0.8 s slower).
    "NUMPY_MADVISE_HUGEPAGE": "0",
    # Before pyarrow allocates (read at its first allocation): glibc's malloc, not pyarrow's
    # default mimalloc. Under mimalloc the recorder's first Parquet parts took 0.4-1.0 s of
    # CPU each under kernel churn, against 0.03-0.1 s with malloc, and a kill -9 loses one
    # flush interval plus one flush; `report leaks` of 1.7 M events also ran in 1.3 s and
    # 455 MB against 1.5-1.9 s and 493 MB (bench/RESULTS.md, "Arrow's allocator").
    "ARROW_DEFAULT_MEMORY_POOL": "system",
    # Before numpy is imported: no OpenBLAS worker threads. numpy's import starts one per
    # extra CPU, and each spins before it sleeps: the import took 90-182 ms of the process's
    # CPU with them and 51-56 ms without, and ~20 ms more in the half second after it (three
    # runs each), CPU that `record` spends while its program loads compete for both vCPUs.
    # memprof's linear algebra is a few 2x2 and 3x3 systems (analysis/growth_regime.py),
    # which threads would only slow.
    "OPENBLAS_NUM_THREADS": "1",
}
_set_here: set[str] = set()  # the names apply() set, because the environment had none


def apply() -> None:
    """Set each of SETTINGS that the environment does not set already."""
    for name, value in SETTINGS.items():
        if name not in os.environ:
            os.environ[name] = value
            _set_here.add(name)


def undo() -> None:
    """Remove the settings apply() made, for a process that goes on to start other programs
    as a user would: the test suite, whose modules import memprof's CLI (which applies them)
    in pytest's own process. Whatever it starts would inherit memprof's tuning as the user's
    own, which memprof then keeps for its commands (tests/conftest.py)."""
    for name in _set_here:
        os.environ.pop(name, None)
    _set_here.clear()


def for_commands(environ: Mapping[str, str], run_as=None) -> dict[str, str]:
    """`environ` without the settings apply() made: what a command memprof runs gets. Run as
    `run_as` (a capture.target.RunAs, the user sudo names; None: memprof's own user), it
    also gets that user's HOME, USER and LOGNAME where their passwd entry is known. One
    rule for the recorded command (capture/target.py) and for the user's program memprof
    asks before it (the interpreter's site-packages, sources/ebpf/uprobes.py)."""
    env = {name: value for name, value in environ.items() if name not in _set_here}
    if run_as is not None and run_as.home:
        env.update(HOME=run_as.home, USER=run_as.user or "", LOGNAME=run_as.user or "")
    return env
