"""Turn raw instruction addresses from BPF stack maps into frames, after the fact.

Kernel addresses resolve against `/proc/kallsyms`; user addresses against a snapshot of the
target's `/proc/PID/maps` and the ELF symbol tables of the mapped files. Both are nearest
symbol at or below the address, vectorized with `np.searchsorted` over sorted start addresses.

Addresses are taken as given. A stack's non-leaf entries are return addresses (the instruction
after a call); a caller that wants the call site subtracts 1 before resolving, so that a call
ending a function (a `noreturn` call) is not charged to the next function.

Unresolved frames keep what is known: function is `"[unknown]"`, module is the file's basename
(or `"[unknown]"` when no mapping holds the address) and `offset` is the module-relative address
(the ELF virtual address where the file could be read, else the file offset, else the raw
address) so they can still be symbolized later with `addr2line -e`. File and line are out of
scope here: the frames table keeps them nullable (DESIGN.md §3).
"""
from __future__ import annotations

import functools
import os
import threading
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Callable, Sequence

from memprof.errors import NoPrivilegeError
from memprof.lazy_import import numpy as np
from memprof.quiet_threads import start_quiet
from memprof.sources.symbols import symbol_cache
from memprof.sources.symbols.elfsyms import ElfSymbols
from memprof.sources.symbols.kallsyms import TRANSIENT_MODULE, UNKNOWN, KernelSymbols, as_addresses
from memprof.sources.symbols.files import file_identity


@dataclass(frozen=True, slots=True)
class UFrame:
    """A native user-space frame: `offset` is bytes from the start of `function`.

    For `function == "[unknown]"`, `offset` is the module-relative address (see module docstring).
    """

    function: str
    module: str
    offset: int


# --- Kernel (the table itself: kallsyms.py) ---


_KEPT_KERNEL = {"starts": "uint64", "names": "uint8", "module_ids": "uint32", "modules": "uint8"}


def load_kernel_symbols(programs: Callable[[], list[tuple[int, str]] | None]) -> KernelSymbols:
    """kallsyms as `KernelSymbols.load` reads it, without reading it where its lasting part
    (the kernel's and modules' text) was kept in this boot with these modules
    (symbol_cache.py) or read ahead by this process (read_kernel_symbols_ahead): then the
    BPF programs' symbols come from `programs()`, (start, name) pairs as kallsyms would name
    them, or None where only kallsyms can name the code (a trampoline): then kallsyms is
    read whole, as without a kept entry. kallsyms takes ~70 ms to read and parse here
    (121,000 lines: kallsyms.py), a kept entry ~2 ms."""
    entry = _kernel_entry()
    lasting = _lasting_read_ahead(entry)
    if lasting is None:
        kept = symbol_cache.load(entry, _KEPT_KERNEL) if entry else None
        lasting = KernelSymbols.from_kept(kept) if kept is not None else None
    extra = programs() if lasting is not None else None
    if extra is not None:
        return lasting.with_symbols(extra, TRANSIENT_MODULE)
    symbols = KernelSymbols.load()
    if entry and lasting is None and len(symbols):
        _keep_lasting(entry, symbols)
    return symbols


# kallsyms' lasting part as read_kernel_symbols_ahead read it, by entry name (kernel_entry_name):
# a Future, so that a load that comes while the read runs waits for it rather than reading too.
_ahead: dict[str, Future] = {}
_ahead_lock = threading.Lock()


def read_kernel_symbols_ahead() -> None:
    """Read kallsyms' lasting part now, for this process's later `load_kernel_symbols`, and
    keep it where the symbol cache is on. For a thread begun while bcc compiles the program
    (sources/ebpf/early.py): a first run's main thread then waits ~0.8 s for the compile on
    the other CPU, and kallsyms' reading (~70 ms, more beside the compile) moves there, from beside the
    command and before its first flush. A changed module list (another entry name) is read
    again by the load. Never raises: the load reads kallsyms itself where this could not."""
    entry = _kernel_entry()
    if entry is None:
        return
    with _ahead_lock:
        if entry in _ahead:
            return
        future = _ahead[entry] = Future()
    lasting = None
    try:
        kept = symbol_cache.load(entry, _KEPT_KERNEL)
        lasting = KernelSymbols.from_kept(kept) if kept is not None else _read_lasting(entry)
    except Exception:  # noqa: BLE001  (an unreadable kallsyms: the load says so, reading it itself)
        lasting = None
    finally:
        future.set_result(lasting)


def _read_lasting(entry: str) -> "KernelSymbols | None":
    """kallsyms' lasting part, read now and kept in the symbol cache as `entry`; None when
    kallsyms reads empty (no root: every address 0)."""
    symbols = KernelSymbols.load()
    return _keep_lasting(entry, symbols) if len(symbols) else None


def _keep_lasting(entry: str, symbols: KernelSymbols) -> KernelSymbols:
    """The lasting part of `symbols` (a whole kallsyms), kept in the symbol cache as `entry`."""
    lasting = symbols.lasting()
    symbol_cache.store(entry, lasting.kept())
    return lasting


def _lasting_read_ahead(entry: str | None) -> "KernelSymbols | None":
    """What read_kernel_symbols_ahead read for `entry` (waiting for it while it reads), handed
    over once: the load's table holds it from then on, and a second copy held here would be
    ~5 MB of the recorder's (64,000 names) for nothing. None when it did not read it, or could not."""
    with _ahead_lock:
        future = _ahead.pop(entry, None) if entry else None
    return future.result() if future is not None else None


def _kernel_entry() -> str | None:
    """The kept kernel symbols' entry name for this boot (kernel_entry_name); None where the
    boot cannot be told (nothing is kept)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read()
    except OSError:
        return None
    try:
        with open("/proc/modules") as f:
            modules = f.read()
    except FileNotFoundError:
        modules = None  # a kernel built without loadable modules
    except OSError:
        return None
    uname = os.uname()
    return kernel_entry_name(boot, modules, uname.release, uname.version)


def kernel_entry_name(boot_id: str, modules: str | None, release: str, version: str) -> str:
    """The entry name of kallsyms' lasting part: the boot, the kernel's build, and each
    loaded module's name, size and address from /proc/modules' text (`modules`; None: no
    modules), not its use count or state, which change while its text stays."""
    loaded = ["no modules"] if modules is None else [
        " ".join(fields[:2] + fields[5:6]) for fields in map(str.split, modules.splitlines())]
    return symbol_cache.key("kallsyms", boot_id.strip(), release, version, *loaded)


# --- Process mappings ---


@dataclass(frozen=True, slots=True)
class Mapping:
    """One line of /proc/PID/maps: addresses [start, end) map `path` from file offset `offset`.

    `path` is "" for anonymous memory and `[vdso]`-style names for kernel-provided ones;
    `deleted` is True when the kernel marked the file " (deleted)" (suffix stripped from `path`),
    or when no path reaches it (`reachable`).
    `path` is as the process names it, in its own mount namespace; `root` is what reaches that
    namespace from memprof's ("/proc/PID/root" for a process in a container or `unshare -m`,
    see `reachable`; "" for one in memprof's own), so its file is opened as `root + path`.
    `executable`: mapped with execute permission (a return address lies in such a mapping
    only; parse_maps keeps a library's other mappings, and [heap] or [stack], too).
    """

    start: int
    end: int
    offset: int
    path: str
    deleted: bool = False
    root: str = ""
    executable: bool = True

    @property
    def file(self) -> str:
        """The path memprof opens the mapped file by."""
        return self.root + self.path


def reachable(pid: int, maps: list[Mapping]) -> list[Mapping]:
    """`maps` of process `pid`, each file's path reachable from memprof's mount namespace:
    unchanged where the process shares it; else each under /proc/PID/root, the process's own
    view of the files (the same path in memprof's namespace is another file, or one the
    process's user put there: a container's libc is not the host's). Unchanged too where the
    namespaces cannot be compared (the process is gone).

    The kernel names those files from the root of the process's mount namespace, which is
    its /proc/PID/root (a container's, after pivot_root) unless the process chrooted inside
    that namespace: then each path is taken relative to the chroot, and a file mapped from
    outside it (opened before the chroot) is marked `deleted`: no path memprof has reaches
    it, and another file may lie at that path inside the root."""
    try:
        theirs = os.stat(f"/proc/{pid}/ns/mnt").st_ino
    except OSError:
        return maps
    ours = _own_mount_namespace()
    if ours is None or theirs == ours:
        return maps
    root = f"/proc/{pid}/root"
    try:
        chroot = os.readlink(root)  # from its namespace's root: "/" unless it chrooted there
    except OSError:
        chroot = "/"
    if chroot == "/" or not chroot.startswith("/"):
        return [replace(m, root=root) if m.path.startswith("/") else m for m in maps]
    return [_inside_chroot(m, root, chroot) for m in maps]


def _inside_chroot(m: Mapping, root: str, chroot: str) -> Mapping:
    """Mapping `m` of a process chrooted at `chroot` (a path from its namespace's root),
    named under its `root` (/proc/PID/root): see `reachable`."""
    if not m.path.startswith("/"):
        return m
    if m.path.startswith(chroot + "/"):
        return replace(m, root=root, path=m.path[len(chroot):])
    return replace(m, root=root, deleted=True)


@functools.cache
def _own_mount_namespace() -> int | None:
    """The inode of memprof's mount namespace, read once (it does not change)."""
    try:
        return os.stat("/proc/self/ns/mnt").st_ino
    except OSError:
        return None


_DELETED_SUFFIX = " (deleted)"


def parse_maps(text: str) -> list[Mapping]:
    """Parse /proc/PID/maps text into the mappings that can hold code, sorted by start.

    Kept: executable mappings (anonymous ones are JIT code) and every file-backed one.
    """
    mappings = []
    for line in text.splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) < 5:
            continue
        path = parts[5] if len(parts) == 6 else ""
        if "x" not in parts[1] and not path:
            continue
        deleted = path.endswith(_DELETED_SUFFIX)
        if deleted:
            path = path[: -len(_DELETED_SUFFIX)]
        start, end = (int(a, 16) for a in parts[0].split("-"))
        mappings.append(Mapping(start, end, int(parts[2], 16), path, deleted, executable="x" in parts[1]))
    mappings.sort(key=lambda m: m.start)
    return mappings


# The most of one process's /proc/PID/maps read at a time. A large PyTorch process's takes
# ~200 KB; a process can make its own take hundreds of MB (tens of thousands of mappings of a
# file at a long path: an audit took the root recorder from 0.3 to 0.65 GB with one). Past
# this, the lines after the last whole one are left out: files mapped there go without symbols.
MAX_MAPS_BYTES = 16 << 20


def snapshot_maps(pid: int) -> str | None:
    """The text of /proc/PID/maps (at most MAX_MAPS_BYTES, whole lines), or None when the
    process is gone.

    Raises NoPrivilegeError when the process belongs to someone we may not ptrace.
    """
    try:
        # A path's bytes need not be UTF-8 (a target can map "\xff.so"): such bytes are kept
        # as the text "\\xff", a name every later step can store and print (strict
        # decoding stopped the recorder). The file behind such a name goes without symbols.
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="backslashreplace") as f:
            text = f.read(MAX_MAPS_BYTES)
            if len(text) == MAX_MAPS_BYTES and f.read(1):
                text = text[: text.rfind("\n") + 1]
            return text
    except (FileNotFoundError, ProcessLookupError):
        return None
    except PermissionError as e:
        raise NoPrivilegeError(f"cannot read /proc/{pid}/maps: {e.strerror}",
                               "run memprof as root or as the target's user") from e
    except OSError:
        # ESRCH mid-read: the process exited while the kernel walked its mappings.
        return None


class _MapsIndex:
    """One snapshot of mappings, sorted by start, with their bounds as arrays: built once per
    snapshot, not per look-up (a torch process maps ~1,000 ranges; sorting them and building
    the arrays for each of a flush's ~2,000 native stacks, twice, took ~0.3 s of the
    recorder's CPU while the training bench ran, issue 24)."""

    def __init__(self, maps: Sequence[Mapping]):
        self.source = maps  # held: the snapshot this index is of (and its id stays its own)
        self.maps = sorted(maps, key=lambda m: m.start)
        self.starts = np.array([m.start for m in self.maps], dtype=np.uint64)
        self.ends = np.array([m.end for m in self.maps], dtype=np.uint64)

    def containing(self, addrs: np.ndarray) -> np.ndarray:
        """Index into `maps` (sorted, non-overlapping) of the mapping holding each address, or -1."""
        if not self.maps:
            return np.full(len(addrs), -1, dtype=np.int64)
        which = np.searchsorted(self.starts, addrs, side="right") - 1
        inside = (which >= 0) & (addrs < self.ends[np.maximum(which, 0)])
        return np.where(inside, which, -1)


_KEPT_INDEXES = 16  # snapshots of mappings indexed at once (UserSymbolizer._indexed)


class UserSymbolizer:
    """Resolves user-space addresses against a process's mappings.

    Keeps one ElfSymbols per file, rebuilt when the file at that path is replaced (device,
    inode or mtime changed). Files that cannot be read or parsed are remembered as such.
    Paths are read as seen by memprof: a target in another mount namespace needs them
    prefixed with /proc/PID/root by the caller.
    """

    def __init__(self):
        self._cache: dict[str, tuple[tuple, ElfSymbols | None]] = {}
        self._indexes: dict[int, _MapsIndex] = {}  # by id() of the snapshot each holds

    def _indexed(self, maps: Sequence[Mapping]) -> _MapsIndex:
        """The index of the snapshot `maps`, kept while the same snapshot (the same object:
        a snapshot is never changed in place, a new one is a new list) comes again. One per
        process of a flush (a job's ranks alternate), the oldest dropped past _KEPT_INDEXES;
        an index holds its snapshot, so that snapshot's id() is not reused while it is kept."""
        index = self._indexes.get(id(maps))
        if index is None or index.source is not maps:
            while len(self._indexes) >= _KEPT_INDEXES:
                del self._indexes[next(iter(self._indexes))]
            index = self._indexes[id(maps)] = _MapsIndex(maps)
        return index

    def symbols_for(self, path: str) -> ElfSymbols | None:
        """The symbol table of the file now at `path`, or None if unreadable or not ELF. Where
        nothing is at `path` now, the table read from it before, if any: a process in another
        mount namespace is read through /proc/PID/root, which goes with the process, and
        the stacks of its last moments are symbolized after its exit."""
        identity = file_identity(path)
        cached = self._cache.get(path)
        if identity is None:
            return cached[1] if cached is not None else None
        if cached is not None and cached[0] == identity:
            return cached[1]
        try:
            table = ElfSymbols(path)
        except Exception:  # noqa: BLE001 — any malformed file reads as "no symbols", never a crash
            table = None
        self._cache[path] = (identity, table)
        return table

    def resolve(self, maps: Sequence[Mapping], addrs) -> list[UFrame]:
        """One UFrame per address (array-like of uint64), in order. `maps` as from parse_maps:
        a snapshot, never changed in place (its sorted index is kept while it comes again).

        Each distinct address is resolved once; equal addresses share one UFrame object.
        """
        addrs = as_addresses(addrs)
        unique, inverse = np.unique(addrs, return_inverse=True)
        index = self._indexed(maps)
        maps, which = index.maps, index.containing(unique)
        frames = [UFrame(UNKNOWN, UNKNOWN, a) if m < 0 else None
                  for a, m in zip(unique.tolist(), which.tolist())]
        # unique is sorted and mappings are disjoint, so each mapping's addresses are one run.
        held, first, count = np.unique(which, return_index=True, return_counts=True)
        for m, lo, n in zip(held.tolist(), first.tolist(), count.tolist()):
            if m >= 0:
                frames[lo:lo + n] = self._resolve_in(maps[m], unique[lo:lo + n])
        return [frames[i] for i in inverse.reshape(-1).tolist()]

    def walk_valid_up_to(self, maps: Sequence[Mapping], addrs: Sequence[int]) -> int:
        """How many of a frame-pointer walk's return addresses `addrs` (innermost first) to
        believe: those before the first that lies in a mapping without execute permission
        (the heap, the stack, a library's data). A walk through code built without frame
        pointers (Debian's python3.11) reads on through whatever its frame register held: a
        thread's start read 126 frames in [heap] after its real ones. An address in no
        mapping of the snapshot is believed (a library mapped since it was taken)."""
        if not len(addrs):
            return 0
        index = self._indexed(maps)
        which = index.containing(as_addresses(addrs))
        for n, m in enumerate(which.tolist()):
            if m >= 0 and not index.maps[m].executable:
                return n
        return len(addrs)

    def file_address(self, maps: Sequence[Mapping], addr: int) -> tuple[str, int] | None:
        """(file path, ELF virtual address) of a user address, None where no readable ELF
        file's loaded bytes hold it."""
        index = self._indexed(maps)
        maps, which = index.maps, int(index.containing(as_addresses([addr]))[0])
        if which < 0 or not maps[which].path.startswith("/") or maps[which].deleted:
            return None
        mapping = maps[which]
        table = self.symbols_for(mapping.file)
        if table is None:
            return None
        vaddrs, mapped = table.vaddrs(as_addresses([addr - mapping.start + mapping.offset]))
        return (mapping.file, int(vaddrs[0])) if mapped[0] else None

    def _resolve_in(self, mapping: Mapping, addrs: np.ndarray) -> list[UFrame]:
        """Frames for addresses that all lie inside `mapping`."""
        module = os.path.basename(mapping.path) if mapping.path else "[anon]"
        file_offsets = addrs - np.uint64(mapping.start) + np.uint64(mapping.offset)
        pseudo = not mapping.path.startswith("/")  # "", [vdso], [heap]…: no file to read
        table = None if pseudo or mapping.deleted else self.symbols_for(mapping.file)
        if table is None:
            rel = addrs - np.uint64(mapping.start) if pseudo else file_offsets
            return [UFrame(UNKNOWN, module, int(a)) for a in rel.tolist()]
        vaddrs, mapped = table.vaddrs(file_offsets)
        idx, offsets, found = table.lookup(vaddrs)
        found &= mapped
        relative = np.where(mapped, vaddrs, file_offsets)
        return [
            UFrame(table.name(i), module, off) if ok else UFrame(UNKNOWN, module, rel)
            for i, off, ok, rel in zip(idx.tolist(), offsets.tolist(), found.tolist(), relative.tolist())
        ]


# --- Reading ahead ---


class SymbolPrewarm:
    """Reads the ELF symbol tables of `paths` into `user` (a UserSymbolizer) on a thread of
    its own, while the recorder does other work.

    The recorder starts one while bcc compiles its programs (1.3-2 s here, on a thread of
    sources/ebpf/early.py, in ctypes calls that release the GIL), so that the first flushes after the target starts do not read
    them: libtorch_cpu.so alone holds 89 MB of symbol tables, ~0.3 s to read and sort (~10 ms
    where symbol_cache.py kept them from an earlier run), and reading them while the target
    runs competes with it for what the CPUs share. `user` must
    not be used by anyone else before `wait()` returns; files that cannot be read are
    remembered as such, exactly as `UserSymbolizer.symbols_for` would.

    kallsyms is not read ahead: it names the recorder's own BPF programs (on top of every
    kernel stack, and dropped by name) only once they are loaded."""

    def __init__(self, user: UserSymbolizer, paths: Sequence[str]):
        self.user = user
        self._thread = start_quiet(threading.Thread(target=self._read, args=(list(paths),), name="memprof-symbols",
                                                    daemon=True))

    def _read(self, paths: list[str]) -> None:
        for path in paths:
            self.user.symbols_for(path)

    def wait(self) -> None:
        """Block until every table is read (at once, after the first call)."""
        self._thread.join()
