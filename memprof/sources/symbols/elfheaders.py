"""An ELF file's program and section headers, read with struct from the file directly, for
the one shape the recorder meets on its own machine: 64-bit, little-endian.

pyelftools reads any ELF, and its import alone takes ~55 ms. A warm `record` imported it on
the symbol prewarm's thread for the small libraries of every command (libc's symbols are
read each run: too small to keep, elfsyms.py), beside the main thread's start-up, and
reached its command later for it (bench/RESULTS.md, 2026-12-07). Callers fall back to
pyelftools where `read_headers` gives None: another class or byte order, extended
numbering, or tables outside the file.
"""
from __future__ import annotations

import os
import struct
from typing import NamedTuple

from memprof.sources.symbols.files import MAX_SECTION_BYTES

_ELF64_HEADER = struct.Struct("<16sHHIQQQIHHHHHH")
_ELF64_SEGMENT = struct.Struct("<IIQQQQQQ")
_ELF64_SECTION = struct.Struct("<IIQQQQIIQQ")
_PN_XNUM = 0xFFFF  # e_phnum when the count is in section 0's sh_info
PT_LOAD = 1
SHT_SYMTAB, SHT_NOBITS, SHT_DYNSYM = 2, 8, 11
EM_X86_64 = 62


class Segment(NamedTuple):
    type: int
    offset: int
    vaddr: int
    filesz: int


class Section(NamedTuple):
    name: str
    type: int
    addr: int
    offset: int
    size: int
    link: int


class ElfHeaders(NamedTuple):
    machine: int
    file_size: int
    segments: list[Segment]
    sections: list[Section]  # by index, the null section 0 included

    def by_name(self, name: str) -> Section | None:
        """The last section named `name`, as pyelftools' get_section_by_name finds it."""
        return next((s for s in reversed(self.sections) if s.name == name), None)

    def holds(self, section: Section, most: int) -> bool:
        """Whether `section`'s bytes lie in the file and number at most `most`."""
        return section.type != SHT_NOBITS and section.size <= most and section.offset + section.size <= self.file_size


def read_headers(fd: int) -> ElfHeaders | None:
    """The headers of the ELF open on `fd`; None where it is not a 64-bit little-endian ELF
    with its tables in the file and counted in its header (module docstring)."""
    file_size = os.fstat(fd).st_size
    head = os.pread(fd, _ELF64_HEADER.size, 0)
    if len(head) < _ELF64_HEADER.size or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
        return None
    (_, _, machine, _, _, phoff, shoff, _, _, phentsize, phnum, shentsize, shnum,
     shstrndx) = _ELF64_HEADER.unpack(head)
    if phnum == _PN_XNUM or (phnum and phentsize != _ELF64_SEGMENT.size):
        return None
    if shentsize != _ELF64_SECTION.size or not 0 < shstrndx < shnum:
        return None  # (shnum 0 or shstrndx SHN_XINDEX: extended numbering, past 65,279 sections)
    segments = _table(fd, phoff, phnum, _ELF64_SEGMENT, file_size)
    raw_sections = _table(fd, shoff, shnum, _ELF64_SECTION, file_size)
    if segments is None or raw_sections is None:
        return None
    names_at = raw_sections[shstrndx]
    if names_at[1] == SHT_NOBITS or names_at[5] > MAX_SECTION_BYTES or names_at[4] + names_at[5] > file_size:
        return None  # (a sparse file can claim gigabytes: files.MAX_SECTION_BYTES)
    names = os.pread(fd, names_at[5], names_at[4])
    sections = [Section(_name(names, name), kind, addr, offset, size, link)
                for name, kind, _, addr, offset, size, link, _, _, _ in raw_sections]
    return ElfHeaders(machine, file_size, [Segment(kind, offset, vaddr, filesz)
                                           for kind, _, offset, vaddr, _, filesz, _, _ in segments], sections)


def _table(fd: int, offset: int, count: int, entry: struct.Struct, file_size: int) -> list[tuple] | None:
    """`count` entries of `entry` at `offset`; None where they do not lie in the file."""
    if not count:
        return []
    if offset + count * entry.size > file_size:
        return None
    data = os.pread(fd, count * entry.size, offset)
    return list(entry.iter_unpack(data)) if len(data) == count * entry.size else None


def _name(names: bytes, at: int) -> str:
    end = names.find(b"\0", at)
    return names[at:end].decode("ascii", "replace") if 0 <= at < end else ""
