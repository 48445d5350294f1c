"""Does a function keep its return address at the stack pointer? Read from the ELF's call-frame
information (.eh_frame), for glibc's system-call wrappers.

Frame-pointer unwinding from a system call starts at the user instruction after `syscall`
and follows %rbp. A wrapper such as `pipe()` or `socket()` pushes no frame of its own, so
%rbp is still its caller's, and the first return address the walk finds is the *caller's*:
the function that called the wrapper is skipped (`__pipe ← main` where the program called
`pipe()` from `site_a`). The BPF side also reads the word at the user stack pointer
(bpf/common.bpf.c, `fill_stacks`); where the .eh_frame rule for the interrupted instruction
says the canonical frame address is %rsp + 8, nothing has been pushed since the call, and
that word is the wrapper's return address: its caller's frame.

Only the one FDE covering an address is decoded, found through .eh_frame_hdr's sorted
table (libtorch_cpu's .eh_frame is 17 MB: reading every entry takes seconds; one entry
takes microseconds)."""
from __future__ import annotations

import os
from typing import NamedTuple

from memprof.lazy_import import numpy as np
from memprof.sources.symbols.callframe import CallFrames, CfaRule
from memprof.sources.symbols.elfheaders import EM_X86_64, read_headers
from memprof.sources.symbols.files import MAX_SECTION_BYTES, file_identity, open_binary

_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1
_RSP = 7                  # DWARF register number of %rsp on x86-64
_DATAREL_SDATA4 = 0x3B    # DW_EH_PE_datarel | DW_EH_PE_sdata4: the table encoding every linker here writes


class _EhFrame:
    """One file's .eh_frame, with .eh_frame_hdr's table as numpy arrays (initial locations
    sorted, and each FDE's offset in .eh_frame)."""

    def __init__(self, path: str):
        self._file = open_binary(path)
        sections = _x86_64_sections(self._file, (".eh_frame_hdr", ".eh_frame"))
        if sections is None or len(sections) < 2:
            self._file.close()
            raise ValueError("no .eh_frame_hdr, or not an x86-64 ELF")
        hdr, frame = sections[".eh_frame_hdr"], sections[".eh_frame"]
        self._hdr_addr, self._frame_addr = hdr.addr, frame.addr
        self.starts, self.fde_offsets = _hdr_table(os.pread(self._file.fileno(), hdr.size, hdr.offset))
        # The entries are read from the file where they are needed, not the section whole
        # (23 MB for libtorch_cpu; issue 24, the recorder's size).
        fd, section_offset = self._file.fileno(), frame.offset
        self._frames = CallFrames(lambda offset, size: os.pread(fd, size, section_offset + offset), frame.size, frame.addr)

    def cfa_rule(self, vaddr: int) -> CfaRule | None:
        """The CFA rule in force at `vaddr`, None where no FDE covers it. Raises ValueError
        for an entry callframe.py cannot read."""
        # Clamped into the table's int32 range: an address beyond it finds the nearest entry,
        # whose own range then rejects it, as the unclamped search would have.
        relative = min(max(vaddr - self._hdr_addr, _INT32_MIN), _INT32_MAX)
        i = int(np.searchsorted(self.starts, relative, side="right")) - 1
        if i < 0:
            return None
        return self._frames.cfa_rule(int(self.fde_offsets[i]) + self._hdr_addr - self._frame_addr, vaddr)


class _Section(NamedTuple):
    addr: int
    offset: int
    size: int


def _x86_64_sections(file, names: tuple[str, ...]) -> dict[str, _Section] | None:
    """The sections of `file` (an open ELF) among `names` that hold bytes in it, read from its
    section header table directly (elfheaders.py): pyelftools parsed every header of a file
    to find two names, ~8 ms a library and ~0.2 s of the recorder's CPU on the training bench
    (bench/RESULTS.md). None for anything but a 64-bit little-endian x86-64 ELF, or a table
    that does not fit in the file; sections past their file's end or over MAX_SECTION_BYTES
    are left out."""
    headers = read_headers(file.fileno())
    if headers is None or headers.machine != EM_X86_64:
        return None
    return {section.name: _Section(section.addr, section.offset, section.size) for section in headers.sections
            if section.name in names and headers.holds(section, MAX_SECTION_BYTES)}


def _hdr_table(data: bytes) -> tuple[np.ndarray, np.ndarray]:
    """.eh_frame_hdr's binary-search table: (initial locations, FDE offsets in .eh_frame),
    both as int32 views of `data` counted from .eh_frame_hdr's address (the table's own
    encoding, not widened: 425k entries in libtorch_cpu); `cfa_rule` adds it back."""
    version, _, count_enc, table_enc = data[0], data[1], data[2], data[3]
    if version != 1 or table_enc != _DATAREL_SDATA4 or count_enc != 0x03:  # udata4 count
        raise ValueError("an .eh_frame_hdr encoding memprof does not read")
    count = int.from_bytes(data[8:12], "little")
    table = np.frombuffer(data, dtype="<i4", count=2 * count, offset=12).reshape(count, 2)
    return table[:, 0], table[:, 1]


class FramelessFrames:
    """Answers, per (file, address), whether the return address is the word at %rsp.
    Files are identified by path, device, inode and mtime, as UserSymbolizer's are; one that
    cannot be read, has no .eh_frame_hdr, or is not x86-64 answers False everywhere."""

    def __init__(self):
        self._files: dict[str, tuple[tuple, _EhFrame | None]] = {}
        self._answers: dict[tuple[str, int], bool] = {}

    def return_address_at_sp(self, path: str, vaddr: int) -> bool:
        key = (path, vaddr)
        answer = self._answers.get(key)
        if answer is None:
            answer = self._answers[key] = self._decide(path, vaddr)
        return answer

    def _decide(self, path: str, vaddr: int) -> bool:
        frames = self._eh_frame(path)
        if frames is None:
            return False
        try:
            rule = frames.cfa_rule(vaddr)
        except Exception:  # noqa: BLE001 — an entry callframe.py cannot read: not known frameless
            return False
        return rule == CfaRule(_RSP, 8)

    def _eh_frame(self, path: str) -> _EhFrame | None:
        identity = file_identity(path)
        if identity is None:
            return None
        cached = self._files.get(path)
        if cached is not None and cached[0] == identity:
            return cached[1]
        try:
            frames = _EhFrame(path)
        except Exception:  # noqa: BLE001 — unreadable or not ELF: no answer but False
            frames = None
        self._files[path] = (identity, frames)
        return frames
