"""ELF symbol tables of user-space files, read with numpy, and C++ name demangling.

pyelftools reads only the headers (section and segment tables); the symbol table itself is
one numpy view, and names are decoded only for the addresses that hit them — per-symbol
Python objects would be far too slow for libtorch's 342k symbols."""
from __future__ import annotations

import ctypes
import functools
import os
import weakref

from memprof.lazy_import import numpy as np
from memprof.sources.symbols import symbol_cache
from memprof.sources.symbols.elfheaders import PT_LOAD, SHT_DYNSYM, SHT_SYMTAB, ElfHeaders, read_headers
from memprof.sources.symbols.files import MAX_SECTION_BYTES, open_binary, section_bytes

def first_of_each_start(starts: np.ndarray) -> np.ndarray:
    """Mask keeping the first entry of each run of equal `starts` (already sorted)."""
    keep = np.ones(len(starts), dtype=bool)
    keep[1:] = starts[1:] != starts[:-1]
    return keep


# --- C++ demangling ---


@functools.cache
def _cxa_demangle():
    """`(__cxa_demangle, free)` from libstdc++ and libc, or None where libstdc++ is missing."""
    # By its soname, from the loader's own search: ctypes.util.find_library would run
    # ldconfig, or gcc and ld from PATH, in the root recorder for a name the loader knows.
    try:
        lib = ctypes.CDLL("libstdc++.so.6")
        fn = lib.__cxa_demangle
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
    fn.restype = ctypes.c_void_p  # not c_char_p: we must free() the buffer ourselves
    free = ctypes.CDLL(None).free
    free.argtypes = [ctypes.c_void_p]
    return fn, free


@functools.lru_cache(maxsize=1 << 16)
def demangle(name: str) -> str:
    """Itanium C++ name → readable name ("_ZN3c109alloc_cpuEm" → "c10::alloc_cpu(unsigned long)").

    Anything that is not a mangled name, or cannot be demangled here, comes back unchanged.
    """
    if not name.startswith("_Z"):
        return name
    funcs = _cxa_demangle()
    if funcs is None:
        return name
    fn, free = funcs
    status = ctypes.c_int(-1)
    buf = fn(name.encode(), None, None, ctypes.byref(status))
    if status.value != 0 or not buf:
        return name
    try:
        return ctypes.string_at(buf).decode("utf-8", "replace")
    finally:
        free(buf)


# --- ELF symbol tables ---


_STT_FUNC, _STT_GNU_IFUNC = 2, 10
_SHN_UNDEF = 0
# Among aliases at one address (malloc / __libc_malloc) prefer global, then weak, then local.
_BINDING_RANK = (2, 0, 1) + (3,) * 13  # STB_LOCAL=0, GLOBAL=1, WEAK=2


def _sym_dtype(elfclass: int, little: bool) -> np.dtype:
    """Elf32_Sym / Elf64_Sym as a numpy record (field order differs between the two)."""
    e = "<" if little else ">"
    if elfclass == 64:
        fields = [("name", e + "u4"), ("info", "u1"), ("other", "u1"), ("shndx", e + "u2"),
                  ("value", e + "u8"), ("size", e + "u8")]
    else:
        fields = [("name", e + "u4"), ("value", e + "u4"), ("size", e + "u4"),
                  ("info", "u1"), ("other", "u1"), ("shndx", e + "u2")]
    return np.dtype(fields)


def _symbol_section(elf):
    """`.symtab`, else `.dynsym`; None where the file has neither."""
    section = elf.get_section_by_name(".symtab") or elf.get_section_by_name(".dynsym")
    if section is None or section["sh_type"] not in ("SHT_SYMTAB", "SHT_DYNSYM"):
        return None
    return section


def _alias_rank(syms: np.ndarray, strtab: StringTable) -> np.ndarray:
    """Sort key among symbols at one address, lowest wins: global, then weak, then local;
    fewer leading underscores (malloc over __libc_malloc); a symbol with a size."""
    if len(syms) == 0:
        return np.zeros(0, dtype=np.int64)
    lead = strtab.leading_bytes(syms["name"].astype(np.int64), 2)
    under1 = lead[:, 0] == ord("_")
    under2 = under1 & (lead[:, 1] == ord("_"))
    binding = np.array(_BINDING_RANK, dtype=np.int64)[syms["info"] >> 4]
    return binding * 8 + (under1.astype(np.int64) + under2) * 2 + (syms["size"] == 0)


class StringTable:
    """An ELF string table read from its file when a name is wanted, not held in memory.

    libtorch_cpu.so's `.strtab` is 84 MB of mangled C++ names, of which a recording names a
    few thousand: held as bytes it was the recorder's largest object after the ring buffer
    (issue 24, the recorder's size). Reads are `pread`s of `fd` (owned: closed when the table
    is collected), so a file truncated under the recorder reads as short names, never as a
    fault, as a mapping of it would.
    """

    _NAME_READ = 256      # bytes read for a name first; longer ones are read again, whole
    _CHUNK = 1 << 22      # bytes per read when a pass touches every name (leading_bytes)

    def __init__(self, fd: int, offset: int, size: int):
        self._fd, self.offset, self.size = fd, offset, size
        weakref.finalize(self, os.close, fd)

    def string_at(self, start: int) -> bytes:
        """The NUL-terminated string at `start` in the table, without its NUL; the rest of
        the table where no NUL ends it; b"" outside the table."""
        if not 0 <= start < self.size:
            return b""
        want = self._NAME_READ
        while True:
            want = min(want, self.size - start)
            data = os.pread(self._fd, want, self.offset + start)
            end = data.find(b"\0")
            if end >= 0:
                return data[:end]
            if len(data) < want or start + want >= self.size:
                return data  # the table (or the file, truncated since) ends first
            want *= 4

    def leading_bytes(self, starts: np.ndarray, count: int) -> np.ndarray:
        """The first `count` bytes of the strings at each of `starts` (int64), as a
        (len(starts), count) uint8 array, 0 past the table's end. One pass over the table in
        4 MiB reads, so the whole table is never in memory at once."""
        out = np.zeros((len(starts), count), dtype=np.uint8)
        order = np.argsort(starts, kind="stable")
        ordered = starts[order]
        for chunk_start in range(0, self.size, self._CHUNK):
            lo, hi = np.searchsorted(ordered, [chunk_start, chunk_start + self._CHUNK])
            if lo == hi:
                continue
            length = min(self._CHUNK + count, self.size - chunk_start)
            data = np.frombuffer(os.pread(self._fd, length, self.offset + chunk_start), dtype=np.uint8)
            rows, at = order[lo:hi], ordered[lo:hi] - chunk_start
            for k in range(count):
                inside = at + k < len(data)
                out[rows[inside], k] = data[at[inside] + k]
        return out


def _sizes_within_sections(section_ends: list[int], syms: np.ndarray) -> np.ndarray:
    """Symbol sizes, where a size of 0 (assembly: `_init`, `_fini`, `_start`) becomes "up to the
    end of its section" (`section_ends`, by section index): else the last such symbol would
    claim every address after it."""
    sizes = syms["size"].astype(np.uint64)
    ends = np.array(section_ends or [0], dtype=np.uint64)
    # Special indices (SHN_ABS and other reserved values >= 0xff00) name no section: keep 0.
    bounded = (sizes == 0) & (syms["shndx"] < len(ends))
    shndx = np.where(bounded, syms["shndx"], 0)
    end = ends[shndx]
    return np.where(bounded & (end > syms["value"]), end - syms["value"], sizes)


def defined_symbol(elf, name: str) -> tuple[int, int] | None:
    """(address, size) of the symbol `name` as `.dynsym`, else `.symtab`, defines it (not
    undefined, not at 0); None when neither does. The string table is searched as bytes and
    the symbols read with numpy: pyelftools' get_symbol_by_name makes a Python object of
    every symbol in the table first (python3.11's 13,000: 0.2-0.4 s of every recorded Python
    command's start, bench/RESULTS.md)."""
    for section_name in (".dynsym", ".symtab"):
        found = defined_in(elf, section_name, name)
        if found is not None:
            return found
    return None


def defined_in(elf, section_name: str, name: str) -> tuple[int, int] | None:
    """defined_symbol() in the one symbol table `section_name`."""
    section = elf.get_section_by_name(section_name)
    if section is None or section["sh_type"] not in ("SHT_SYMTAB", "SHT_DYNSYM"):
        return None
    syms = _records(elf, section)
    hits = syms[_named(elf, section, syms, name) & (syms["shndx"] != _SHN_UNDEF) & (syms["value"] != 0)]
    return (int(hits[0]["value"]), int(hits[0]["size"])) if hits.size else None


def symbol_indices(elf, section, name: str) -> np.ndarray:
    """Indices in the symbol table `section` of its symbols named `name`, defined or not."""
    syms = _records(elf, section)
    return np.flatnonzero(_named(elf, section, syms, name))


def _functions(syms: np.ndarray) -> np.ndarray:
    """The records of `syms` (a symbol table's) that are functions defined here. The caller
    lets go of the whole table then: a reader that held libtorch's (12 MiB of records) to its
    end peaked at 41 MB, against 32 MB (tracemalloc, tests/unit/test_symbol_readers_size.py)."""
    kind = syms["info"] & 0xF
    return syms[((kind == _STT_FUNC) | (kind == _STT_GNU_IFUNC)) & (syms["value"] != 0)
                & (syms["shndx"] != 0)]  # SHN_UNDEF: imports, whose value may be a PLT stub


def _records(elf, section) -> np.ndarray:
    """A symbol table section's entries as one numpy array (a view of its bytes)."""
    dtype = _sym_dtype(elf.elfclass, elf.little_endian)
    data = section_bytes(section)
    return np.frombuffer(data, dtype=dtype, count=len(data) // dtype.itemsize)


def _named(elf, section, syms: np.ndarray, name: str) -> np.ndarray:
    offsets = string_offsets(section_bytes(elf.get_section(section["sh_link"])), name.encode())
    return np.isin(syms["name"], offsets) if offsets else np.zeros(len(syms), bool)


def string_offsets(strtab: bytes, name: bytes) -> list[int]:
    """Every offset in an ELF string table at which the string `name` starts. Not only after a
    NUL: tables share tails, so a symbol named "free" may point into "cfree"."""
    needle, found = name + b"\0", []
    at = strtab.find(needle)
    while at >= 0:
        found.append(at)
        at = strtab.find(needle, at + 1)
    return found


class ElfSymbols:
    """Function symbols and PT_LOAD segments of one ELF file, as sorted numpy arrays.

    Symbols come from `.symtab`, else `.dynsym` (stripped libraries). They are read with numpy
    straight from the section bytes rather than one pyelftools object per symbol: libtorch has
    hundreds of thousands. Names stay undecoded until an address resolves to them.

    A file whose names fill CACHED_STRTAB_BYTES or more has its arrays kept across runs
    (symbol_cache.py, as root) and taken from there while the file is unchanged: the read is
    what costs, not the arrays.
    """

    # Tables this large take 0.1 s or more to read (libtorch_cpu.so: 84 MB, 0.28 s); the
    # interpreter's, libc's and libstdc++'s (40-300 kB) take 5-25 ms, less than a kept entry
    # would save them.
    CACHED_STRTAB_BYTES = 4 << 20
    _ARRAYS = {"seg_offset": "uint64", "seg_filesz": "uint64", "seg_vaddr": "uint64", "values": "uint64",
               "sizes": "uint64", "name_offsets": "int64", "strtab": "int64"}

    def __init__(self, path: str):
        with open_binary(path) as f:
            st = os.fstat(f.fileno())
            if st.st_size < self.CACHED_STRTAB_BYTES:  # its names cannot fill that: never kept
                self._read(f)
                return
            entry = symbol_cache.file_key(st)
            if not self._take_kept(symbol_cache.load(entry, self._ARRAYS), f.fileno(), st.st_size):
                self._read(f)
                if self._strtab.size >= self.CACHED_STRTAB_BYTES:
                    symbol_cache.store(entry, self._kept())

    def _read(self, f) -> None:
        headers = read_headers(f.fileno())
        if headers is not None and self._read_from_headers(f.fileno(), headers):
            return
        if os.pread(f.fileno(), 4, 0) != b"\x7fELF":
            # Said here, without pyelftools' import (26-56 ms): a frame-pointer walk's stray
            # address can land in a mapped data file (a locale's LC_CTYPE).
            raise ValueError("not an ELF file")
        from elftools.elf.elffile import ELFFile  # import here: only files of another shape need it

        elf = ELFFile(f)
        self._read_segments(elf)
        self._read_symbols(elf, f.fileno())

    def _read_from_headers(self, fd: int, headers: ElfHeaders) -> bool:
        """_read for a 64-bit little-endian file, from the headers elfheaders.py read (no
        pyelftools); False where its symbol table is not where they say, or too large to
        read (pyelftools then reads the file, or says why it cannot)."""
        section = headers.by_name(".symtab") or headers.by_name(".dynsym")
        syms, where = np.zeros(0, _sym_dtype(64, True)), (0, 0)
        if section is not None and section.type in (SHT_SYMTAB, SHT_DYNSYM):
            if not headers.holds(section, MAX_SECTION_BYTES) or not 0 <= section.link < len(headers.sections):
                return False
            data = os.pread(fd, section.size, section.offset)
            if len(data) != section.size:
                return False
            dtype = _sym_dtype(64, True)
            syms = np.frombuffer(data, dtype=dtype, count=len(data) // dtype.itemsize)
            del data  # the whole table goes with `syms`'s rebinding below (libtorch's: 12 MiB)
            syms = _functions(syms)
            strings = headers.sections[section.link]
            where = (strings.offset, strings.size)
        self._set_segments([(s.offset, s.filesz, s.vaddr) for s in headers.segments if s.type == PT_LOAD and s.filesz])
        self._set_symbols(syms, where, fd, [s.addr + s.size for s in headers.sections])
        return True

    def _kept(self) -> dict[str, np.ndarray]:
        where = np.array([self._strtab.offset, self._strtab.size], dtype=np.int64)
        return {"seg_offset": self.seg_offset, "seg_filesz": self.seg_filesz, "seg_vaddr": self.seg_vaddr,
                "values": self.values, "sizes": self.sizes, "name_offsets": self.name_offsets, "strtab": where}

    def _take_kept(self, kept: dict[str, np.ndarray] | None, fd: int, file_size: int) -> bool:
        """Take the arrays of a kept entry, if they are shaped as _read's would be (the
        names' table inside the file of `file_size` bytes, the symbols ascending)."""
        if kept is None or len(kept["strtab"]) != 2:
            return False
        offset, size = (int(v) for v in kept["strtab"])
        if not (0 <= offset and 0 <= size and offset + size <= file_size):
            return False
        segments = {len(kept[field]) for field in ("seg_offset", "seg_filesz", "seg_vaddr")}
        symbols = {len(kept[field]) for field in ("values", "sizes", "name_offsets")}
        if len(segments) != 1 or len(symbols) != 1 or np.any(kept["values"][1:] <= kept["values"][:-1]):
            return False
        self.seg_offset, self.seg_filesz, self.seg_vaddr = kept["seg_offset"], kept["seg_filesz"], kept["seg_vaddr"]
        self.values, self.sizes, self.name_offsets = kept["values"], kept["sizes"], kept["name_offsets"]
        self._strtab = StringTable(os.dup(fd), offset, size)
        return True

    def _read_segments(self, elf) -> None:
        self._set_segments([(s["p_offset"], s["p_filesz"], s["p_vaddr"])
                            for s in elf.iter_segments() if s["p_type"] == "PT_LOAD" and s["p_filesz"]])

    def _set_segments(self, loads: list[tuple[int, int, int]]) -> None:
        """The PT_LOAD segments that hold file bytes: (file offset, size in the file, address)."""
        table = np.array(sorted(loads), dtype=np.uint64).reshape(-1, 3)
        self.seg_offset, self.seg_filesz, self.seg_vaddr = table[:, 0], table[:, 1], table[:, 2]

    def _read_symbols(self, elf, fd: int) -> None:
        section = _symbol_section(elf)
        if section is None:
            syms, where = np.zeros(0, _sym_dtype(64, True)), (0, 0)
        else:
            strings = elf.get_section(section["sh_link"])
            syms, where = _functions(_records(elf, section)), (strings["sh_offset"], strings["sh_size"])
        self._set_symbols(syms, where, fd, [sec["sh_addr"] + sec["sh_size"] for sec in elf.iter_sections()])

    def _set_symbols(self, syms: np.ndarray, where: tuple[int, int], fd: int, section_ends: list[int]) -> None:
        """The functions `syms` (_functions' records), named in the string table at `where`
        ((offset, size) in the file open on `fd`); `section_ends`: each section's end address,
        by index, which bounds a symbol of size 0."""
        # A descriptor of its own: `fd` closes when the constructor's `with` ends.
        self._strtab = StringTable(os.dup(fd), *where)
        syms = syms[np.lexsort((_alias_rank(syms, self._strtab), syms["value"]))]
        syms = syms[first_of_each_start(syms["value"])]
        self.values = syms["value"].astype(np.uint64)
        self.sizes = _sizes_within_sections(section_ends, syms)
        self.name_offsets = syms["name"].astype(np.int64)

    def vaddrs(self, file_offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """File offsets → virtual addresses via the PT_LOAD segment holding each offset.

        Returns (vaddrs, ok); ok is False where no segment's file bytes hold the offset.
        """
        if len(self.seg_offset) == 0:
            return file_offsets, np.zeros(len(file_offsets), dtype=bool)
        seg = np.searchsorted(self.seg_offset, file_offsets, side="right") - 1
        ok = seg >= 0
        seg = np.where(ok, seg, 0)
        ok &= file_offsets < self.seg_offset[seg] + self.seg_filesz[seg]
        return file_offsets - self.seg_offset[seg] + self.seg_vaddr[seg], ok

    def lookup(self, vaddrs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Nearest symbol at or below each address, and inside it when its size is known.

        Returns (symbol index, bytes from the symbol's start, ok).
        """
        if len(self.values) == 0:
            none = np.zeros(len(vaddrs), dtype=np.int64)
            return none, none.astype(np.uint64), none.astype(bool)
        idx = np.searchsorted(self.values, vaddrs, side="right") - 1
        ok = idx >= 0
        idx = np.where(ok, idx, 0)
        offsets = vaddrs - self.values[idx]
        size = self.sizes[idx]
        return idx, offsets, ok & ((size == 0) | (offsets < size))

    def name(self, i: int) -> str:
        """Demangled name of symbol i."""
        return demangle(self._strtab.string_at(int(self.name_offsets[i])).decode("utf-8", "replace"))


# --- User space ---
