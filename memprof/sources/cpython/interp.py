"""Which CPython a file is, and whether memprof may read its frames.

BPF walks CPython's thread states and frames with the struct offsets of
`pyoffsets_table.OFFSETS`, one entry per minor version, generated from that version's own
headers. An offset that is wrong for the interpreter at hand does not fail: BPF reads the wrong
words and reports nonsense frames. So an entry is handed to BPF only once it is *confirmed* for
the file that defines `_PyRuntime`:

1. the file defines `_PyRuntime` and `PyCode_Type` (`.dynsym`, else `.symtab`);
2. its version comes from the file itself — `Py_Version` (3.11+), or for 3.10, which has none,
   the minor from the file name and the patch from the PY_VERSION string in `.rodata` — and the
   minor is one the table knows;
3. `_PyRuntime`'s symbol size is the table's `sizeof(_PyRuntimeState)` and `PyCode_Type`'s
   `tp_basicsize` is its `sizeof(PyCodeObject)` (3.10; from 3.11 on, where code objects are
   variable-size, its `offsetof(PyCodeObject, co_code_adaptive)`): a debug, free-threaded or
   patched build differs;
4. 3.13+: `_PyRuntime` starts with `_Py_DebugOffsets`, the offsets CPython publishes for
   out-of-process readers; every one the table also has must agree.

Anything else raises PythonLayoutError with the reason, and the process gets no Python frames.
Only x86-64 is handled: the table was generated for it.
"""
from __future__ import annotations

import functools
import os
import re
import struct
from dataclasses import dataclass
from typing import NamedTuple, Sequence

from memprof.errors import SourceUnavailableError
from memprof.sources.cpython.offsets_table import OFFSETS
from memprof.sources.symbols import symbol_cache
from memprof.sources.symbols.elfheaders import PT_LOAD, read_headers
from memprof.sources.symbols.elfsyms import defined_in, defined_symbol
from memprof.sources.symbols.files import (FileAt, file_at, file_identity, is_regular_file, open_binary, section_bytes,
                                           split_process_root)
from memprof.sources.symbols.symbolize import Mapping

_SUPPORTED = f"3.{min(OFFSETS)[1]}–3.{max(OFFSETS)[1]}"
_LIBPYTHON = re.compile(r"libpython3\.(\d+)[a-z]*\.so(\.[\d.]+)?$")
_EXECUTABLE = re.compile(r"python3\.(\d+)[a-z]*$")
_PAGE = 4096
_TP_BASICSIZE = 32  # PyTypeObject: ob_refcnt, ob_type, ob_size, tp_name, then tp_basicsize
_DEBUG_COOKIE = b"xdebugpy"


class PythonLayoutError(SourceUnavailableError):
    """A file whose CPython struct layout memprof cannot confirm: no Python frames for it."""


@dataclass(frozen=True)
class PythonBinary:
    """A CPython runtime file whose struct offsets are confirmed.

    `path` defines `_PyRuntime` (a python3.X executable or a libpython3.X.so*). The addresses are
    link-time virtual addresses (st_value): add the load bias of a mapping (`load_bias`) for
    run-time ones. `offsets` is the table entry (bytes, -1 for a field this version lacks);
    it is shared by every caller of `inspect_python`: do not modify it.
    """

    path: str
    version: tuple[int, int, int]
    runtime_vaddr: int
    code_type_vaddr: int
    offsets: dict[str, int]
    init_vaddr: int = 0  # Py_InitializeFromConfig, where a process is registered at its start (0: none)

    def version_text(self) -> str:
        """The version as text: "3.11.2"."""
        return ".".join(map(str, self.version))


def inspect_python(path: str) -> PythonBinary:
    """Confirm the table's offsets for the CPython runtime file at `path` (see module docstring).

    Results, refusals included, are cached per file (files.FileAt: each process of a
    container names its interpreter by a path of its own); a cached result keeps the path
    it was first found by. Raises PythonLayoutError.
    """
    try:
        file = file_at(path)
    except OSError as e:
        raise PythonLayoutError(f"cannot read {path}: {e.strerror}", "check the path") from e
    result = _inspect_cached(file)
    if isinstance(result, PythonLayoutError):
        raise PythonLayoutError(result.message, result.hint)  # a fresh one: no stale traceback
    return result


@functools.lru_cache(maxsize=64)
def _inspect_cached(file: FileAt) -> PythonBinary | PythonLayoutError:
    """inspect_python's work, returning its refusal rather than raising (so that it is cached);
    a confirmation kept from an earlier run of the same file is taken as it is (_kept)."""
    kept = _kept_inspection(file)
    if kept is not None:
        return kept
    from elftools.common.exceptions import ELFError
    path = file.path
    try:
        with open_binary(path) as f:
            found = _Inspection(path, f).run()
    except PythonLayoutError as e:
        return e
    except OSError as e:
        return PythonLayoutError(f"cannot read {path}: {e.strerror}", "check the path")
    except (ELFError, struct.error) as e:  # a truncated or malformed ELF file
        return PythonLayoutError(f"cannot parse {path} as ELF: {e}", _HINT_FILE)
    _keep(file, "python-runtime", {"version": list(found.version), "runtime_vaddr": found.runtime_vaddr,
                                   "code_type_vaddr": found.code_type_vaddr, "init_vaddr": found.init_vaddr,
                                   "offsets": found.offsets})
    return found


def python_file_in_maps(maps: Sequence[Mapping]) -> str | None:
    """The mapped file of a process that should hold its CPython runtime, by name only.

    A libpython3.X.so* wins over a python3.X executable (a shared build's executable defines
    no `_PyRuntime`). Deleted files are skipped: what is at the path now is another file.
    Whether the file really is a supported CPython is for `inspect_python` to say. The path
    is the one memprof reads it by (Mapping.file: under /proc/PID/root for a process in a
    mount namespace of its own).
    """
    files = [m for m in maps if m.path.startswith("/") and not m.deleted]
    for pattern in (_LIBPYTHON, _EXECUTABLE):
        for m in files:
            if pattern.match(os.path.basename(m.path)):
                return m.file
    return None


def mapped_as(path: str, maps: Sequence[Mapping]) -> str | None:
    """The path (Mapping.file) by which `maps` map the libpython at `path`, which may name it
    through a link; None when none of the process's libpython mappings is that file."""
    if any(m.file == path and not m.deleted for m in maps):
        return path
    wanted = file_identity(path)
    if wanted is None:
        return None
    return next((m.file for m in maps if not m.deleted and _LIBPYTHON.match(os.path.basename(m.path))
                 and file_identity(m.file) == wanted), None)


def load_bias(path: str, maps: Sequence[Mapping]) -> int | None:
    """Run-time address minus link-time address (bytes) for `path` in a process, or None.

    Taken from the lowest mapping of `path`: the loader maps the first PT_LOAD segment there,
    from the page holding its first file byte. The segment is the one whose file bytes, from
    that page on, hold the mapping's offset; of several (segments sharing a page), the lowest.
    None when `path` (a Mapping.file) is not mapped (deleted mappings do not count) or no
    segment fits.
    """
    mine = [m for m in maps if m.file == path and not m.deleted]
    if not mine:
        return None
    first = min(mine, key=lambda m: m.start)
    for offset, filesz, vaddr in _load_segments(path):
        if offset - offset % _PAGE <= first.offset < offset + max(filesz, 1):
            return first.start - (vaddr + (first.offset - offset))
    return None


def runtime_file(path: str) -> str:
    """The file that defines `_PyRuntime` for the interpreter executable at `path`.

    `path` itself when it defines it (a static build, or a libpython); for a shared build, the
    libpython3.X.so* it links, found through its RUNPATH/RPATH ($ORIGIN expanded) and the usual
    library directories. `path` when neither is found (inspect_python then says why). Under
    /proc/PID/root, the libpython is looked for in that process's folders and named under
    that root, unresolved (register() finds its mapping by identity); elsewhere, by its real
    path. What the executable links is read once per file (files.FileAt): the recorder asks
    at every exec of a Python process.
    """
    try:
        needed, runpaths = _links_libpython(file_at(path))
    except OSError:
        return path
    root = split_process_root(path)[0]
    for name in needed:
        for d in _library_dirs(path, runpaths):
            candidate = root + os.path.join(d, name)
            if is_regular_file(candidate):
                return candidate if root else os.path.realpath(candidate)
    return path


@functools.lru_cache(maxsize=256)
def _links_libpython(file: FileAt) -> tuple[list[str], list[str]]:
    """_libpython_needed of the executable `file`; ([], []) for one that cannot be read.
    Per file, not per path: $ORIGIN is expanded per path (_library_dirs). Kept across runs
    (_kept)."""
    kept = _kept(file, "python-links")
    if kept is not None and _strings(kept.get("needed")) and _strings(kept.get("runpaths")):
        return kept["needed"], kept["runpaths"]
    from elftools.common.exceptions import ELFError
    try:
        with open_binary(file.path) as f:
            needed, runpaths = _libpython_needed(f)
    except (OSError, ELFError):
        return [], []
    _keep(file, "python-links", {"needed": needed, "runpaths": runpaths})
    return needed, runpaths


# --- kept across runs ---
#
# What the recorder learns of an interpreter file before the command starts (what it links,
# its confirmed layout) is kept in root's symbol cache folder (symbols/symbol_cache.py),
# named by the file's device, inode, size, mtime and ctime, this module's _KEPT_FORMAT and
# the offsets table's entries: the ELF reads took ~7 ms of the start of every Python command
# (a scratch timing of runtime_file and inspect_python, three runs). A kept
# confirmation holds the table entry it confirmed, and is used only while the table has
# that entry. Refusals are not kept: their files are read again.
_KEPT_FORMAT = 1  # bump when what a check reads or decides changes
_KEPT_SUFFIX = ".python"


def _kept(file: FileAt, kind: str) -> dict | None:
    return symbol_cache.load_record(_kept_name(file, kind), _KEPT_SUFFIX)


def _keep(file: FileAt, kind: str, record: dict) -> None:
    symbol_cache.store_record(_kept_name(file, kind), record, _KEPT_SUFFIX)


def _kept_name(file: FileAt, kind: str) -> str:
    return symbol_cache.file_key(file.stat, _KEPT_FORMAT, _table_text(), kind=kind)


@functools.cache
def _table_text() -> str:
    return repr(sorted(OFFSETS.items()))


def _kept_inspection(file: FileAt) -> PythonBinary | None:
    """The confirmation kept for `file`, named by its path now; None where none is, or it
    is not one this table would give."""
    kept = _kept(file, "python-runtime")
    if kept is None:
        return None
    version, offsets = kept.get("version"), kept.get("offsets")
    addresses = [kept.get(k) for k in ("runtime_vaddr", "code_type_vaddr", "init_vaddr")]
    if not (isinstance(version, list) and len(version) == 3 and all(_is_int(v) for v in version + addresses)):
        return None
    version = tuple(version)
    if offsets != OFFSETS.get(version[:2]):
        return None
    return PythonBinary(file.path, version, *addresses[:2], OFFSETS[version[:2]], addresses[2])


def _is_int(value) -> bool:
    return type(value) is int  # noqa: E721 (JSON's true is no address)


def _strings(value) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


# --- reading the file ---


class Symbol(NamedTuple):
    value: int  # its link-time address
    size: int   # bytes


class _Inspection:
    """The checks of inspect_python on one open file, in order (see the module docstring)."""

    def __init__(self, path: str, f):
        from elftools.common.exceptions import ELFError
        from elftools.elf.elffile import ELFFile
        self.path, self.f = path, f
        try:
            self.elf = ELFFile(f)
        except ELFError as e:
            raise PythonLayoutError(f"{path} is not an ELF file ({e})", _HINT_FILE) from e
        if self.elf.header["e_machine"] != "EM_X86_64" or self.elf.elfclass != 64:
            raise PythonLayoutError(f"{path} is not an x86-64 ELF file: memprof reads x86-64 CPython only",
                                    "the offsets table holds x86-64 layouts; other machines get no Python frames")

    def run(self) -> PythonBinary:
        runtime = self.symbol("_PyRuntime")
        if runtime is None:
            raise PythonLayoutError(f"{self.path} is not a CPython runtime (no _PyRuntime symbol)", _HINT_FILE)
        version = self.version()
        offsets = OFFSETS[version[:2]]
        code_type = self.symbol("PyCode_Type")
        if code_type is None:
            raise PythonLayoutError(f"{self.path} is not a CPython runtime (no PyCode_Type symbol)", _HINT_FILE)
        label = f"CPython {version[0]}.{version[1]}"
        _expect(f"_PyRuntime is {runtime.size} bytes, {label}'s layout has {offsets['sizeof_runtime']}",
                runtime.size == offsets["sizeof_runtime"])
        basicsize, expected = self.u64(code_type.value + _TP_BASICSIZE), _code_basicsize(offsets)
        _expect(f"code objects are {basicsize} bytes, {label}'s layout has {expected}", basicsize == expected)
        if version[:2] >= (3, 13):
            _check_debug_offsets(self.read(runtime.value, _debug_struct(version).size), version, offsets)
        init = self.symbol("Py_InitializeFromConfig")
        return PythonBinary(self.path, version, runtime.value, code_type.value, offsets,
                            init.value if init is not None else 0)

    def symbol(self, name: str) -> Symbol | None:
        """The defined symbol `name` of .dynsym, else .symtab; None if neither defines it."""
        found = defined_symbol(self.elf, name)
        return Symbol(*found) if found is not None else None

    def version(self) -> tuple[int, int, int]:
        """(3, minor, patch), with a minor the table knows; raises PythonLayoutError otherwise."""
        py_version = self.symbol("Py_Version")  # PY_VERSION_HEX, since 3.11
        if py_version is not None:
            hexversion = self.u64(py_version.value)
            version = (hexversion >> 24, hexversion >> 16 & 0xFF, hexversion >> 8 & 0xFF)
        else:
            version = self._version_without_py_version()
        if version[0] != 3 or version[:2] not in OFFSETS:
            raise PythonLayoutError(f"CPython {version[0]}.{version[1]} is not supported (memprof reads frames of {_SUPPORTED})",
                                    f"run the target under CPython {_SUPPORTED} for Python frames")
        return version

    def _version_without_py_version(self) -> tuple[int, int, int]:
        """Before 3.11: minor from the file name, patch from PY_VERSION in .rodata."""
        name = os.path.basename(self.path)
        match = _LIBPYTHON.match(name) or _EXECUTABLE.match(name)
        if match is None:
            raise PythonLayoutError(f"{self.path} has no Py_Version (so it is older than 3.11), and its name "
                                    "does not say which 3.X it is", "pass the python3.X or libpython3.X.so file")
        minor = int(match.group(1))
        if (3, minor) not in OFFSETS:
            return 3, minor, 0  # refused by the caller; the patch does not matter
        if minor >= 11:
            raise PythonLayoutError(f"{self.path} is named for CPython 3.{minor} but has no Py_Version symbol", _HINT_BUILD)
        return 3, minor, self._patch_from_rodata(minor)

    def _patch_from_rodata(self, minor: int) -> int:
        # The linker merges string tails, so PY_VERSION may be the end of a longer string such as
        # the install prefix "/root/.pyenv/versions/3.10.13": match a string's end, not a whole one.
        section = self.elf.get_section_by_name(".rodata")
        data = section_bytes(section) if section is not None else b""
        found = {int(m.group(1)) for m in re.finditer(rb"(?<![\d.])3\.%d\.(\d+)(?:(?:a|b|rc)\d+)?\+?\x00" % minor, data)}
        if len(found) != 1:
            what = "no" if not found else "more than one"
            raise PythonLayoutError(f"{self.path} is named for CPython 3.{minor} but has {what} 3.{minor}.N "
                                    "version string in .rodata", _HINT_BUILD)
        return found.pop()

    def read(self, vaddr: int, size: int) -> bytes:
        """`size` bytes of the file at link-time address `vaddr` (from a PT_LOAD's file bytes)."""
        for offset, filesz, seg_vaddr in _segments(self.elf):
            if seg_vaddr <= vaddr and vaddr + size <= seg_vaddr + filesz:
                self.f.seek(offset + vaddr - seg_vaddr)
                data = self.f.read(size)
                if len(data) == size:
                    return data
        raise PythonLayoutError(f"{self.path}: address {vaddr:#x} is not in the file's bytes", _HINT_BUILD)

    def u64(self, vaddr: int) -> int:
        return struct.unpack("<Q", self.read(vaddr, 8))[0]


_HINT_FILE = "point memprof at the python3.X executable or the libpython3.X.so it loads"
_HINT_BUILD = ("the process is recorded without Python frames; they need a stock (non-debug, "
               f"non-free-threaded) CPython {_SUPPORTED} build")


def _code_basicsize(offsets: dict[str, int]) -> int:
    """PyCode_Type.tp_basicsize of a build with this layout: sizeof(PyCodeObject) up to 3.10;
    from 3.11 on, code is a variable-size object and tp_basicsize is
    offsetof(PyCodeObject, co_code_adaptive) (Objects/codeobject.c), short of sizeof by padding."""
    return offsets["code_adaptive"] if offsets["code_adaptive"] >= 0 else offsets["sizeof_code"]


def _expect(reason: str, ok: bool) -> None:
    if not ok:
        raise PythonLayoutError(f"{reason}: a patched or differently configured build", _HINT_BUILD)


def _segments(elf) -> list[tuple[int, int, int]]:
    """(p_offset, p_filesz, p_vaddr) of each PT_LOAD, lowest address first."""
    return sorted(((s["p_offset"], s["p_filesz"], s["p_vaddr"]) for s in elf.iter_segments()
                   if s["p_type"] == "PT_LOAD"), key=lambda seg: seg[2])


def _load_segments(path: str) -> list[tuple[int, int, int]]:
    """_segments of the file at `path`, read from its headers directly where they are of the
    usual shape (elfheaders.py: a Python command's recorder met its interpreter here right
    after the command began, and imported pyelftools for it, ~20 ms), else by pyelftools;
    [] where it cannot be read."""
    try:
        with open_binary(path) as f:
            headers = read_headers(f.fileno())
            if headers is None:
                return _load_segments_by_pyelftools(f)
    except OSError:
        return []
    return sorted(((s.offset, s.filesz, s.vaddr) for s in headers.segments if s.type == PT_LOAD), key=lambda seg: seg[2])


def _load_segments_by_pyelftools(f) -> list[tuple[int, int, int]]:
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile
    try:
        return _segments(ELFFile(f))
    except ELFError:
        return []


_LIB_DIRS = ("/lib/x86_64-linux-gnu", "/usr/lib/x86_64-linux-gnu", "/lib64", "/usr/lib64",
             "/lib", "/usr/lib", "/usr/local/lib")


def _libpython_needed(f) -> tuple[list[str], list[str]]:
    """(libpython DT_NEEDED names, its DT_RUNPATH/DT_RPATH entries as written) of an
    executable; ([], []) if it defines `_PyRuntime` itself or links no libpython."""
    from elftools.elf.elffile import ELFFile
    elf = ELFFile(f)
    dynamic = elf.get_section_by_name(".dynamic")
    defined = defined_in(elf, ".dynsym", "_PyRuntime") is not None
    if dynamic is None or defined:
        return [], []
    tags = list(dynamic.iter_tags())
    needed = [t.needed for t in tags if t.entry.d_tag == "DT_NEEDED" and _LIBPYTHON.match(t.needed)]
    runpaths = [p for t in tags if t.entry.d_tag in ("DT_RUNPATH", "DT_RPATH")
                for p in (t.runpath if t.entry.d_tag == "DT_RUNPATH" else t.rpath).split(":") if p]
    return needed, runpaths


def _library_dirs(path: str, runpaths: list[str]) -> list[str]:
    """Where the executable at `path` finds the libraries it links: its `runpaths` ($ORIGIN
    expanded), LD_LIBRARY_PATH, the usual directories; as its process names them (inside
    its /proc/PID/root, if `path` is under one)."""
    root, inside = split_process_root(path)
    origin = os.path.dirname(inside if root else os.path.realpath(path))  # a mapping's path is already real
    dirs = [p.replace("$ORIGIN", origin).replace("${ORIGIN}", origin) for p in runpaths]
    env = [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p]
    return dirs + env + list(_LIB_DIRS)


# --- 3.13+: _Py_DebugOffsets ---

# struct _Py_DebugOffsets of CPython 3.13 (Include/internal/pycore_runtime.h): char cookie[8],
# then uint64_t fields in this order. It is stable within a minor version only (3.14 reorders it).
_DEBUG_FIELDS_313 = (
    "version", "free_threaded",
    "runtime_state.size", "runtime_state.finalizing", "runtime_state.interpreters_head",
    "interpreter_state.size", "interpreter_state.id", "interpreter_state.next",
    "interpreter_state.threads_head", "interpreter_state.gc", "interpreter_state.imports_modules",
    "interpreter_state.sysdict", "interpreter_state.builtins", "interpreter_state.ceval_gil",
    "interpreter_state.gil_runtime_state", "interpreter_state.gil_runtime_state_enabled",
    "interpreter_state.gil_runtime_state_locked", "interpreter_state.gil_runtime_state_holder",
    "thread_state.size", "thread_state.prev", "thread_state.next", "thread_state.interp",
    "thread_state.current_frame", "thread_state.thread_id", "thread_state.native_thread_id",
    "thread_state.datastack_chunk", "thread_state.status",
    "interpreter_frame.size", "interpreter_frame.previous", "interpreter_frame.executable",
    "interpreter_frame.instr_ptr", "interpreter_frame.localsplus", "interpreter_frame.owner",
    "code_object.size", "code_object.filename", "code_object.name", "code_object.qualname",
    "code_object.linetable", "code_object.firstlineno", "code_object.argcount",
    "code_object.localsplusnames", "code_object.localspluskinds", "code_object.co_code_adaptive",
    "pyobject.size", "pyobject.ob_type",
    "type_object.size", "type_object.tp_name", "type_object.tp_repr", "type_object.tp_flags",
    "tuple_object.size", "tuple_object.ob_item", "tuple_object.ob_size",
    "list_object.size", "list_object.ob_item", "list_object.ob_size",
    "dict_object.size", "dict_object.ma_keys", "dict_object.ma_values",
    "float_object.size", "float_object.ob_fval",
    "long_object.size", "long_object.lv_tag", "long_object.ob_digit",
    "bytes_object.size", "bytes_object.ob_size", "bytes_object.ob_sval",
    "unicode_object.size", "unicode_object.state", "unicode_object.length",
    "unicode_object.asciiobject_size",
    "gc.size", "gc.collecting",
)
_DEBUG_FIELDS = {(3, 13): _DEBUG_FIELDS_313}

# Table key → the _Py_DebugOffsets field publishing the same offset or size.
_PUBLISHED = {
    "sizeof_runtime": "runtime_state.size",
    "runtime_interp_head": "runtime_state.interpreters_head",
    "interp_tstate_head": "interpreter_state.threads_head",
    "sizeof_thread": "thread_state.size",
    "tstate_next": "thread_state.next",
    "tstate_thread_id": "thread_state.thread_id",
    "tstate_frame": "thread_state.current_frame",
    "frame_previous": "interpreter_frame.previous",
    "frame_code": "interpreter_frame.executable",
    "frame_instr": "interpreter_frame.instr_ptr",
    "frame_owner": "interpreter_frame.owner",
    "sizeof_code": "code_object.size",
    "code_filename": "code_object.filename",
    "code_name": "code_object.name",
    "code_qualname": "code_object.qualname",
    "code_linetable": "code_object.linetable",
    "code_firstlineno": "code_object.firstlineno",
    "code_adaptive": "code_object.co_code_adaptive",
    "object_type": "pyobject.ob_type",
    "bytes_size": "bytes_object.ob_size",
    "bytes_data": "bytes_object.ob_sval",
    "unicode_state": "unicode_object.state",
    "unicode_length": "unicode_object.length",
    "unicode_ascii_data": "unicode_object.asciiobject_size",  # ASCII data follows the header
}


def _debug_struct(version: tuple[int, ...]) -> struct.Struct:
    """The layout of `_Py_DebugOffsets` for `version`'s minor; PythonLayoutError if unknown."""
    fields = _DEBUG_FIELDS.get(tuple(version[:2]))
    if fields is None:
        raise PythonLayoutError(f"memprof does not know CPython {version[0]}.{version[1]}'s _Py_DebugOffsets", _HINT_BUILD)
    return struct.Struct("<8s%dQ" % len(fields))


def parse_debug_offsets(raw: bytes, version: tuple[int, ...]) -> dict[str, int]:
    """`_Py_DebugOffsets` of CPython `version` (its minor's field list) from the first bytes
    of `_PyRuntime`.

    Keys are "struct.field" as in the header ("thread_state.current_frame"), plus "version" and
    "free_threaded". Raises PythonLayoutError when the cookie is missing or the minor unknown.
    """
    cookie, *values = _debug_struct(version).unpack_from(raw)
    if cookie != _DEBUG_COOKIE:
        raise PythonLayoutError(f"_PyRuntime does not start with _Py_DebugOffsets (cookie {cookie!r})", _HINT_BUILD)
    return dict(zip(_DEBUG_FIELDS[tuple(version[:2])], values))


def _check_debug_offsets(raw: bytes, version: tuple[int, int, int], offsets: dict[str, int]) -> None:
    """Every offset the table shares with the file's own `_Py_DebugOffsets` must agree."""
    published = parse_debug_offsets(raw, version)
    if published["version"] >> 8 != (version[0] << 16 | version[1] << 8 | version[2]):
        raise PythonLayoutError(f"_Py_DebugOffsets is for version {published['version']:#x}, "
                                f"Py_Version says {'.'.join(map(str, version))}", _HINT_BUILD)
    if published["free_threaded"]:
        raise PythonLayoutError("a free-threaded (PEP 703) build: its object layout differs", _HINT_BUILD)
    for key, field in _PUBLISHED.items():
        if offsets[key] >= 0 and published[field] != offsets[key]:
            raise PythonLayoutError(f"_Py_DebugOffsets {field} is {published[field]}, the table's {key} is "
                                    f"{offsets[key]}: a patched or differently configured build", _HINT_BUILD)
