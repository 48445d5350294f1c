"""bcc's compiled program kept across runs, so that a warm start compiles nothing (issue 24).

bcc compiles memprof's program on every run (1.3-2.9 s on the project's VM, and LLVM's
memory on top of the recorder's), and its Python API has no cache of the compiled object. What the compile produces is small
and plain: each program's instructions, whose only references are map file descriptors
(ld_imm64 with BPF_PSEUDO_MAP_FD), the maps' definitions, and the BTF the task-storage
maps need. `store` writes those, after a compile, to one JSON file (never a pickle) named
by a hash of everything that decides the compile's output: the program text and flags,
the kernel (release and build: tracepoint layouts and headers), the kernel headers bcc
compiled against, and bcc itself. `load` rebuilds from that file a `CachedBPF`: bcc's own
BPF class, its maps created and programs loaded by the bpf() system call instead of from a
compiled module. Everything memprof does with a BPF object (tables, load_func, the
attach_* calls, cleanup) works on it unchanged; bcc's tables and attach calls need only
the map and program file descriptors.

The cache is root's: /var/cache/memprof/bpf, with memprof/root_cache.py's rules (made 0700,
every folder on the way owned by root and writable by no one else, each file opened without
following links and used only when root owns it and no one else can write it). Nothing it holds is trusted beyond what
the kernel checks anyway: a program from the cache goes through the verifier like a
compiled one. Any problem with an entry (absent, foreign, corrupt, a map the kernel
refuses) makes `load` return None, and the caller compiles as before. MEMPROF_BPF_CACHE=0
turns the cache off (benches measure the first run after install with it).
"""
from __future__ import annotations

import base64
import ctypes
import functools
import json
import os
import struct

from memprof import root_cache
from memprof.sources.ebpf import bcc_import
from memprof.sources.ebpf.bpfinfo import btf_raw, map_info

CACHE_DIR = "/var/cache/memprof/bpf"
FORMAT = 1  # bump when what an entry holds, or how it is read, changes
KEEP_ENTRIES = 16  # a recording's options make one entry; older ones beyond this are removed
OFF_ENV = "MEMPROF_BPF_CACHE"

# What an instruction may name that the cache relocates, or refuses (include/uapi/linux/bpf.h).
_LD_IMM64 = 0x18
_PSEUDO_MAP_FD = 1
_CALL = 0x85
_PSEUDO_CALL = 1
# Programs bcc's __init__ attaches by their names' prefix: CachedBPF rebuilds only the
# tracepoint__ and raw_tracepoint__ ones, so an entry with any of these is not stored.
_OTHER_AUTOLOADED = (b"kprobe__", b"kretprobe__", b"kfunc__", b"kretfunc__", b"lsm__")


class NotCacheable(Exception):
    """A compiled program this cache cannot rebuild (say, a BPF-to-BPF call): it is not stored."""


def enabled() -> bool:
    """Whether to use the cache: as root, unless MEMPROF_BPF_CACHE=0."""
    return os.geteuid() == 0 and os.environ.get(OFF_ENV, "1") != "0"


def cache_key(text: str, cflags: list[str]) -> str:
    """The hash naming the entry for a compile of `text` with `cflags` on this machine."""
    return entry_key(text, "\0".join(cflags), *_machine_inputs())


def entry_key(*parts: str) -> str:
    """The name of an entry (a sha256) for what decides its content, `parts`, with FORMAT."""
    return root_cache.entry_name(FORMAT, *parts)


@functools.lru_cache(maxsize=1)
def _machine_inputs() -> tuple[str, ...]:
    """What, besides the text and flags, decides what bcc's compile produces here: read once
    per process (a cold start computes the key twice, to look the entry up and to store it)."""
    uname = os.uname()
    release = uname.release
    inputs = [release, uname.version]
    for path in (f"/lib/modules/{release}/build", f"/lib/modules/{release}/source", bcc_import.libbcc_path()):
        try:
            real = os.path.realpath(path)
            st = os.stat(real)
            inputs.append(f"{real}:{st.st_size}:{st.st_mtime_ns}")
        except OSError:
            inputs.append(f"{path}:absent")
    import bcc
    inputs.append(f"bcc {getattr(bcc, '__version__', '?')}")
    return tuple(inputs)


def state() -> tuple[bool, str, str]:
    """(usable, in words, the remedy) for `memprof doctor`: whether a warm start can take
    bcc's compiled program from the cache, and if not, why not and what to do."""
    return root_cache.folder_state(CACHE_DIR, OFF_ENV, ".json", "compiled program(s) kept (a record with the "
                                   "same options compiles nothing)", "every record compiles")


# -- the folder and its files -------------------------------------------------------------

def read_entry(key: str) -> dict | None:
    """The entry named `key` (a dict holding this FORMAT and that key), read only from a
    regular file root owns and no one else may write, in a folder the same holds for; None
    for anything else (absent, foreign, spoiled). Also used by btf_answers.py."""
    try:
        entry = root_cache.read(CACHE_DIR, f"{key}.json", lambda f: json.loads(f.read()))
    except (OSError, ValueError):
        return None
    return entry if isinstance(entry, dict) and entry.get("format") == FORMAT and entry.get("key") == key else None


def has_entry(text: str, cflags: list[str]) -> bool:
    """Whether the cache is on and has a file for a compile of `text` with `cflags` (its
    content is checked only when `load` reads it)."""
    if not enabled():
        return False
    try:
        return os.path.isfile(os.path.join(CACHE_DIR, f"{cache_key(text, cflags)}.json"))
    except Exception:  # the key's inputs: bcc not importable, say; the load then says no as well
        return False


def write_entry(key: str, entry: dict) -> None:
    """Write `entry` as the file for `key`, whole or not at all (a temporary file renamed)."""
    root_cache.keep(CACHE_DIR, f"{key}.json", lambda f: f.write(json.dumps(entry).encode()), ".json", KEEP_ENTRIES)


# -- what a compile produced, as an entry ------------------------------------------------

def store(bpf, text: str, cflags: list[str]) -> None:
    """Keep what bcc compiled into `bpf` for the next run with the same `text` and `cflags`.
    Never raises: a program the cache cannot rebuild, or a folder it may not use, is
    simply not kept."""
    if not enabled() or getattr(bpf, "module", None) is None:
        return
    try:
        store_entry(exported(bpf)[0], text, cflags)
    except Exception:  # NotCacheable, or anything bcc's module queries raise: the recording goes on
        pass


def store_entry(entry: dict, text: str, cflags: list[str]) -> None:
    """Keep `entry` (as `exported` makes it: compile_child.py's joined halves) for the next run
    with the same `text` and `cflags`. Never raises: a folder it may not use keeps nothing."""
    if not enabled():
        return
    try:
        key = cache_key(text, cflags)
        write_entry(key, {"format": FORMAT, "key": key, **entry})
    except Exception:  # OSError, or the key's inputs (bcc not importable): the recording goes on
        pass


def exported(bpf) -> tuple[dict, list[int]]:
    """(what bcc compiled into `bpf`, as an entry without its format and key; the maps'
    descriptors, in the entry's order of maps). NotCacheable for what CachedBPF cannot rebuild."""
    lib = _libbcc()
    module = bpf.module
    maps, index_of_fd, btf_ids, fds = [], {}, set(), []
    for map_id in range(lib.bpf_num_tables(module)):
        name = lib.bpf_table_name(module, map_id)
        fd = lib.bpf_table_fd_id(module, map_id)
        fds.append(fd)
        info = map_info(fd)
        if info.btf_key_type_id or info.btf_value_type_id:
            btf_ids.add(info.btf_id)
        index_of_fd[fd] = map_id
        maps.append({"name": name.decode(), "type": info.type, "key_size": info.key_size,
                     "value_size": info.value_size, "max_entries": info.max_entries, "flags": info.map_flags,
                     "btf_key_type_id": info.btf_key_type_id, "btf_value_type_id": info.btf_value_type_id,
                     "key_desc": lib.bpf_table_key_desc(module, name).decode(),
                     "leaf_desc": lib.bpf_table_leaf_desc(module, name).decode()})
    if len(btf_ids) > 1:
        raise NotCacheable("maps typed by more than one BTF object")
    functions = []
    for i in range(lib.bpf_num_functions(module)):
        name = lib.bpf_function_name(module, i)
        if name.startswith(_OTHER_AUTOLOADED):
            raise NotCacheable(f"{name!r} is attached by a prefix the cache does not rebuild")
        insns = bpf.dump_func(name)
        functions.append({"name": name.decode(), "insns": base64.b64encode(insns).decode(),
                          "map_refs": _map_references(insns, index_of_fd)})
    return {"license": lib.bpf_module_license(module).decode(), "kern_version": lib.bpf_module_kern_version(module),
            "btf": base64.b64encode(btf_raw(btf_ids.pop())).decode() if btf_ids else None,
            "maps": maps, "functions": functions}, fds


def _map_references(insns: bytes, index_of_fd: dict[int, int]) -> list[list[int]]:
    """[instruction index, map index] of every map reference in `insns`; NotCacheable for
    anything else that names a loading-time object (a BPF-to-BPF call, a map value)."""
    refs = []
    for i in range(0, len(insns) // 8):
        code, regs, _off, imm = struct.unpack_from("<BBhi", insns, i * 8)
        source = regs >> 4
        if code == _LD_IMM64 and source == _PSEUDO_MAP_FD:
            if imm not in index_of_fd:
                raise NotCacheable(f"instruction {i} names fd {imm}, not one of the program's maps")
            refs.append([i, index_of_fd[imm]])
        elif code == _LD_IMM64 and source != 0:
            raise NotCacheable(f"instruction {i} is a pseudo load of kind {source}")
        elif code == _CALL and source == _PSEUDO_CALL:
            raise NotCacheable("a BPF-to-BPF call")
    return refs


def load(text: str, cflags: list[str]):
    """bcc's BPF object for `text` and `cflags` rebuilt from the cache (its maps created, the
    programs bcc attaches on creation loaded and attached); None when there is no usable
    entry or the kernel refuses any part of it: then compile."""
    if not enabled():
        return None
    entry = read_entry(cache_key(text, cflags))
    if entry is None:
        return None
    from memprof.sources.ebpf.cached_bpf import CachedBPF  # bcc's BPF subclassed: imports bcc
    try:
        return CachedBPF(entry)  # which closes what it made when it fails
    except Exception:  # a malformed entry, or bcc's bare Exception from an attach or a refusal
        return None


_lib = None


def _libbcc():
    """libbcc's module queries, declared on a handle of our own (bcc's declares fewer)."""
    global _lib
    if _lib is None:
        lib = ctypes.CDLL(bcc_import.libbcc_path())
        for fn, res, args in (("bpf_num_tables", ctypes.c_ulonglong, [ctypes.c_void_p]),
                              ("bpf_table_name", ctypes.c_char_p, [ctypes.c_void_p, ctypes.c_ulonglong]),
                              ("bpf_table_fd_id", ctypes.c_int, [ctypes.c_void_p, ctypes.c_ulonglong]),
                              ("bpf_table_key_desc", ctypes.c_char_p, [ctypes.c_void_p, ctypes.c_char_p]),
                              ("bpf_table_leaf_desc", ctypes.c_char_p, [ctypes.c_void_p, ctypes.c_char_p]),
                              ("bpf_num_functions", ctypes.c_ulonglong, [ctypes.c_void_p]),
                              ("bpf_function_name", ctypes.c_char_p, [ctypes.c_void_p, ctypes.c_ulonglong]),
                              ("bpf_module_license", ctypes.c_char_p, [ctypes.c_void_p]),
                              ("bpf_module_kern_version", ctypes.c_uint, [ctypes.c_void_p])):
            getattr(lib, fn).restype, getattr(lib, fn).argtypes = res, args
        _lib = lib
    return _lib
