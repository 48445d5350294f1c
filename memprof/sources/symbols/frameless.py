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

import numpy as np

from memprof.sources.symbols.files import file_identity, open_binary

_RSP = 7                  # DWARF register number of %rsp on x86-64
_DATAREL_SDATA4 = 0x3B    # DW_EH_PE_datarel | DW_EH_PE_sdata4: the table encoding every linker here writes


class _EhFrame:
    """One file's .eh_frame, with .eh_frame_hdr's table as numpy arrays (initial locations
    sorted, and each FDE's offset in .eh_frame)."""

    def __init__(self, path: str):
        from elftools.dwarf.callframe import CallFrameInfo
        from elftools.elf.elffile import ELFFile
        self._file = open_binary(path)
        elf = ELFFile(self._file)
        hdr, frame = elf.get_section_by_name(".eh_frame_hdr"), elf.get_section_by_name(".eh_frame")
        if hdr is None or frame is None or elf["e_machine"] != "EM_X86_64":
            raise ValueError("no .eh_frame_hdr")
        self.starts, self.fde_offsets = _hdr_table(hdr.data(), hdr["sh_addr"], frame["sh_addr"])
        dwarf = elf.get_dwarf_info(follow_links=False)
        section = dwarf.eh_frame_sec  # the section's bytes, which CFI offsets count from
        self._cfi = CallFrameInfo(stream=section.stream, size=section.size, address=section.address,
                                  base_structs=dwarf.structs, for_eh_frame=True)

    def cfa_rule(self, vaddr: int):
        """The CFA rule in force at `vaddr` (pyelftools' CFARule), None where no FDE covers it."""
        i = int(np.searchsorted(self.starts, vaddr, side="right")) - 1
        if i < 0:
            return None
        fde = self._cfi._parse_entry_at(int(self.fde_offsets[i]))  # one entry, not the section
        start, size = fde["initial_location"], fde["address_range"]
        if not start <= vaddr < start + size:
            return None
        rule = None
        for row in fde.get_decoded().table:
            if row["pc"] > vaddr:
                break
            rule = row["cfa"]
        return rule


def _hdr_table(data: bytes, hdr_addr: int, frame_addr: int) -> tuple[np.ndarray, np.ndarray]:
    """.eh_frame_hdr's binary-search table: (initial locations, FDE offsets in .eh_frame)."""
    version, _, count_enc, table_enc = data[0], data[1], data[2], data[3]
    if version != 1 or table_enc != _DATAREL_SDATA4 or count_enc != 0x03:  # udata4 count
        raise ValueError("an .eh_frame_hdr encoding memprof does not read")
    count = int.from_bytes(data[8:12], "little")
    table = np.frombuffer(data, dtype="<i4", count=2 * count, offset=12).reshape(count, 2).astype(np.int64)
    return table[:, 0] + hdr_addr, table[:, 1] + hdr_addr - frame_addr


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
        except Exception:  # noqa: BLE001 — a malformed entry reads as "not known frameless"
            return False
        return rule is not None and rule.expr is None and rule.reg == _RSP and rule.offset == 8

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
