"""Symbol tables kept across runs, so that a warm recorder does not read them again (issue 24).

Reading libtorch_cpu.so's symbol table (342,000 functions among 84 MB of names, sorted and
ranked) takes ~0.28 s of CPU, and the recorder does it in every recording of a torch
command, beside the command's own start on a 2-vCPU machine. What the read produces is a few
numpy arrays (8 MB for libtorch_cpu.so): this cache keeps them in one `.npz` entry per
file, named by a hash of what tells that file from any other (device, inode, size, mtime
and ctime: the kernel sets ctime on any change and no user can set it back) and FORMAT.
Names are not kept: they are read from the file itself when an address needs one. The
folder also keeps small entries of other kinds, counted apart: records of plain values, as
JSON (`store_record`): libc10's allocation call site (sources/ebpf/callsite.py), what an
interpreter file links and its confirmed layout (sources/cpython/interp.py).

The cache is root's: /var/cache/memprof/symbols, with memprof/root_cache.py's rules. An
entry is loaded with allow_pickle=False and used only when its arrays have the types and
shapes a read would give (`load` checks them); anything else reads as no entry, and the
caller reads the file. MEMPROF_SYMBOL_CACHE=0 turns it off (the benches' first run after
install turns it off with the BPF cache).
"""
from __future__ import annotations

import json
import os
import zipfile
from typing import Mapping

from memprof import root_cache
from memprof.lazy_import import numpy as np

CACHE_DIR = "/var/cache/memprof/symbols"
FORMAT = 1  # bump when what an entry holds, or how the arrays are computed, changes
KEEP_ENTRIES = 32  # one per large file; the oldest beyond this are removed
KEEP_SMALL_ENTRIES = 64  # of each kind of small entry (store_record)
OFF_ENV = "MEMPROF_SYMBOL_CACHE"
_SUFFIX = ".npz"
_MAX_RECORD_BYTES = 1 << 16  # a record is a few hundred bytes


def enabled() -> bool:
    """Whether to use the cache: as root, unless MEMPROF_SYMBOL_CACHE=0."""
    return os.geteuid() == 0 and os.environ.get(OFF_ENV, "1") != "0"


def state() -> tuple[bool, str, str]:
    """(usable, in words, the remedy) for `memprof doctor`."""
    return root_cache.folder_state(CACHE_DIR, OFF_ENV, _SUFFIX, "symbol table(s) kept (a record reads them "
                                   "there, not in the files)",
                                   "every record reads libtorch's and the kernel's symbols again (~0.45 s of CPU)")


def key(kind: str, *parts: object) -> str:
    """An entry's name: a sha256 of FORMAT, `kind` and `parts` (what decides its content)."""
    return root_cache.entry_name(FORMAT, kind, *parts)


def file_key(st: os.stat_result, *also: object, kind: str = "elf") -> str:
    """The entry's name for what is kept of the file `st` describes (fstat of the descriptor
    the caller reads, so the entry and what is read later are of one file): its symbols, or
    an entry of another `kind` named by `also` too."""
    return key(kind, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, *also)


def load(name: str, expected: Mapping[str, str]) -> dict[str, np.ndarray] | None:
    """The arrays of entry `name`, when it holds exactly the 1-D arrays `expected` names, of
    those dtypes (numpy's names: "uint64"); None otherwise (absent, foreign, off, spoiled)."""
    if not enabled():
        return None
    try:
        arrays = root_cache.read(CACHE_DIR, name + _SUFFIX, lambda f: _arrays(f, expected))
    except (OSError, ValueError, zipfile.BadZipFile, EOFError):
        return None
    if arrays is None or any(a.dtype != expected[field] or a.ndim != 1 for field, a in arrays.items()):
        return None
    return arrays


def _arrays(f, expected: Mapping[str, str]) -> dict[str, np.ndarray] | None:
    with np.load(f, allow_pickle=False) as npz:
        if set(npz.files) != set(expected):
            return None
        return {field: npz[field] for field in expected}


def store(name: str, arrays: Mapping[str, np.ndarray]) -> None:
    """Keep `arrays` as entry `name` (never raises: a folder it may not use keeps nothing)."""
    if enabled():
        root_cache.keep(CACHE_DIR, name + _SUFFIX, lambda f: np.savez(f, **arrays), _SUFFIX, KEEP_ENTRIES)


def load_record(name: str, suffix: str) -> dict | None:
    """The JSON object of the small entry `name` (store_record, with the same `suffix`);
    None where absent, off, or not a JSON object of at most _MAX_RECORD_BYTES. What its
    values mean is the caller's to check, as a read would give them."""
    if not enabled():
        return None
    try:
        record = root_cache.read(CACHE_DIR, name + suffix, lambda f: json.loads(f.read(_MAX_RECORD_BYTES + 1)))
    except (OSError, ValueError):  # json's errors are ValueErrors, a cut entry's too
        return None
    return record if isinstance(record, dict) else None


def store_record(name: str, record: Mapping[str, object], suffix: str) -> None:
    """Keep `record` (plain values: what json writes) as the small entry `name`; never raises,
    as store(). Counted apart from the symbol tables: KEEP_SMALL_ENTRIES of `suffix`."""
    if enabled():
        text = json.dumps(record).encode()
        if len(text) <= _MAX_RECORD_BYTES:
            root_cache.keep(CACHE_DIR, name + suffix, lambda f: f.write(text), suffix, KEEP_SMALL_ENTRIES)
