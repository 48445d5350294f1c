"""memprof's LD_PRELOAD interposer for the libc heap (memprof_preload.c, built by
scripts/setup.sh): where it is, whether a command may be given it, and the environment
that loads it.

`record --sources +native` takes the libc heap through it when memprof starts the command:
one uprobe hit per recorded event instead of three traps per malloc/free pair, and none at
all for the allocations its byte sampling leaves out (bench/RESULTS.md). A process memprof
attaches to (`--pid`), or whose environment already preloads a library, is probed with
uprobes on libc instead (memprof/sources/ebpf/uprobes.py)."""
from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Callable, Mapping

LIBRARY_NAME = "libmemprof_preload.so"
SAMPLE_BYTES_VARIABLE = "MEMPROF_NATIVE_SAMPLE_BYTES"  # read by memprof_preload.c
ALLOC_MARKER, FREE_MARKER = "memprof_native_alloc", "memprof_native_free"

# record --native-probes
AUTO, PRELOAD, UPROBES = "auto", "preload", "uprobes"
NATIVE_PROBES = (AUTO, PRELOAD, UPROBES)


def library_path() -> Path:
    """Where scripts/setup.sh builds the interposer: beside this file."""
    return Path(__file__).resolve().with_name(LIBRARY_NAME)


def why_not(environ: Mapping[str, str], uid: int, library: Path | None = None,
            can_read: Callable[[Path], bool] | None = None) -> str | None:
    """Why a command with environment `environ`, run as `uid`, cannot be given the
    interposer, in words; None when it can. Root puts the library into the user's command,
    so it must be one only root (or that user) can change: the file and every folder above
    it (memprof/sources/agent_reader/folder.py's rule for the agent's code). `can_read`
    opens it with the user's credentials (the loader would silently skip a library the
    command cannot read, and its native layer would be empty)."""
    from memprof.sources.agent_reader.folder import unsafe_ancestor
    path = library or library_path()
    if environ.get("LD_PRELOAD", "").strip():
        return "the command's environment sets LD_PRELOAD already (its library may replace malloc itself)"
    try:
        info = os.stat(path)
    except FileNotFoundError:
        return f"{path} is not built (run `make setup`)"
    except OSError as e:
        return f"{path} cannot be read ({e.strerror})"
    if not stat.S_ISREG(info.st_mode):
        return f"{path} is not a file"
    if info.st_uid not in (0, uid) or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path} could be changed by another user (owner uid {info.st_uid}, mode {stat.filemode(info.st_mode)})"
    folder_why = unsafe_ancestor(path.parent, uid)
    if folder_why is not None:
        return f"another user could replace it: {folder_why}"
    if can_read is not None and not can_read(path):
        return f"the command's user (uid {uid}) cannot read {path}"
    return None


def opens(path: Path) -> bool:
    """Whether `path` opens for reading with the calling thread's credentials."""
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_CLOEXEC))
    except OSError:
        return False
    return True


def child_env(library: Path, sample_bytes: int) -> dict[str, str]:
    """What the command's environment gets: the interposer, and its byte sampling."""
    return {"LD_PRELOAD": str(library), SAMPLE_BYTES_VARIABLE: str(int(sample_bytes))}
