"""Where one function calls another: the place for a single uprobe that sees an allocation whole.

An allocator function is usually probed twice: a uprobe at its entry (the size) and a uretprobe
at its return (the address) — two traps into the kernel, plus a third at the matching free.
Where the allocator itself passes both to a function it calls after allocating
(`c10::alloc_cpu` calls `c10::NUMAMove(data, nbytes, node)` on every successful allocation),
one uprobe on that `call` instruction sees both, in the argument registers. The kernel emulates
a relative `call` (it pushes the return address and jumps, no single-step: ~0.7 µs here, where a
single-stepped instruction costs ~9–10 µs in this VM), so the allocation costs one trap, not two.

This module only finds the instruction, and only when it is certain of it:
- the caller decodes (capstone, linear sweep from its symbol) over its whole size;
- exactly one 5-byte `call rel32` in it reaches the callee, directly or through a PLT stub
  whose GOT slot has the callee's JUMP_SLOT relocation;
- the caller sets up a frame pointer (`push %rbp; mov %rsp,%rbp`, after an optional
  `endbr64`), so the BPF side can read the caller's return address at `%rbp + 8`.
Anything else — another architecture, no capstone, a build that inlines or reorders — gives a
reason instead, and the caller falls back to the entry and return probes.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from memprof.lazy_import import numpy as np
from memprof.sources.symbols import symbol_cache
from memprof.sources.symbols.elfsyms import defined_symbol, demangle, symbol_indices
from memprof.sources.symbols.files import open_binary, section_bytes

_ENDBR64 = bytes.fromhex("f30f1efa")
_FRAME_SETUP = bytes.fromhex("554889e5")  # push %rbp; mov %rsp,%rbp
_CALL_REL32 = 0xE8
_MAX_FUNCTION_BYTES = 1 << 16
_R_X86_64_JUMP_SLOT = 7
# Elf64_Rela as numpy's dtype fields; x86-64 only, as the decoding
_ELF64_RELA = [("offset", "<u8"), ("info", "<u8"), ("addend", "<i8")]


@dataclass(frozen=True)
class CallSite:
    """`offset`: bytes from the caller symbol's start to the `call` (None when not found);
    `why`: how it was found, or why it was not, in words for meta.json and doctor;
    `file_offset`: where the `call` is in the file, for the entry that keeps it (_kept)."""

    offset: int | None
    why: str
    file_offset: int | None = field(default=None, compare=False)


def find_call_site(path: str, caller: str, callee: str) -> CallSite:
    """The one `call rel32` in `caller` (an ELF symbol of `path`) that reaches `callee`: as
    kept from an earlier recorder's decoding of the same file (see _kept), else decoded."""
    try:
        f = open_binary(path)
    except OSError as e:
        return CallSite(None, f"cannot read {path}: {e}")
    with f:
        name = symbol_cache.file_key(os.fstat(f.fileno()), caller, callee, kind="call-site-record")
        kept = _kept(f, name, caller, callee)
        if kept is not None:
            return kept
        site = _decode(f, path, caller, callee)
        if site.file_offset is not None:
            symbol_cache.store_record(name, {"offset": site.offset, "file_offset": site.file_offset}, _KEPT_SUFFIX)
        return site


# Call sites kept across runs (issue 24, start-up): capstone's import and the decoding took
# 20-30 ms of each start of a command whose Python environment has torch, on its path
# (bench/RESULTS.md). An entry is named by the file's device, inode, size, mtime and ctime
# (a change to the file changes its ctime, which no user can set back) with the two
# symbols, in symbol_cache's folder, counted apart from the symbol tables: a JSON record
# of plain values.
_KEPT_SUFFIX = ".site"


def _kept(f, name: str, caller: str, callee: str) -> CallSite | None:
    """The call site kept under `name`, if its byte in `f` is still a `call`; None otherwise."""
    record = symbol_cache.load_record(name, _KEPT_SUFFIX) or {}
    offset, at = record.get("offset"), record.get("file_offset")
    if type(offset) is not int or type(at) is not int:  # noqa: E721 (not bool, a JSON true)
        return None
    if not 0 <= offset < _MAX_FUNCTION_BYTES or at < 0 or os.pread(f.fileno(), 1, at) != bytes([_CALL_REL32]):
        return None
    return _found(caller, callee, offset, at)


def _found(caller: str, callee: str, offset: int, file_offset: int) -> CallSite:
    return CallSite(offset, f"one uprobe at {demangle(caller)}+{offset:#x}, its call to {demangle(callee)}",
                    file_offset)


def _decode(f, path: str, caller: str, callee: str) -> CallSite:
    """The call site decoded from the open ELF `f`."""
    try:
        from capstone import CS_ARCH_X86, CS_MODE_64, Cs
        from elftools.common.exceptions import ELFError
        from elftools.elf.elffile import ELFFile
    except ImportError as e:
        return CallSite(None, f"{e.name} is not installed")
    try:
        elf = ELFFile(f)
        if elf["e_machine"] != "EM_X86_64":
            return CallSite(None, f"{elf['e_machine']}: only x86-64 call sites are decoded")
        return _find_in(elf, caller, callee, Cs(CS_ARCH_X86, CS_MODE_64))
    except (OSError, ELFError, ValueError) as e:
        return CallSite(None, f"cannot read {path}: {e}")


def _find_in(elf, caller: str, callee: str, disassembler) -> CallSite:
    symbols = _defined_functions(elf, {caller, callee})
    if caller not in symbols:
        return CallSite(None, f"{caller} is not defined here")
    start, size = symbols[caller]
    if not 0 < size <= _MAX_FUNCTION_BYTES:  # a cut function could hide a second call
        return CallSite(None, f"{caller} is {size} bytes long (decoded: 1 to {_MAX_FUNCTION_BYTES})")
    found = _read_vaddr(elf, start, size)
    if found is None:
        return CallSite(None, f"{caller}'s bytes are not in the file")
    code, code_at = found
    if not code.removeprefix(_ENDBR64).startswith(_FRAME_SETUP):
        return CallSite(None, f"{caller} does not set up a frame pointer")
    targets = _callee_addresses(elf, callee, symbols.get(callee))
    if not targets:
        return CallSite(None, f"{callee} is neither defined nor imported through the PLT")
    calls, decoded = [], 0
    for insn in disassembler.disasm(code, start):
        decoded += insn.size
        if insn.size == 5 and insn.bytes[0] == _CALL_REL32:
            target = insn.address + 5 + int.from_bytes(insn.bytes[1:5], "little", signed=True)
            if target in targets:
                calls.append(insn.address - start)
    if decoded != len(code):
        return CallSite(None, f"{caller} did not decode to its end ({decoded} of {len(code)} bytes)")
    if len(calls) != 1:
        return CallSite(None, f"{caller} calls {callee} {len(calls)} times, not once")
    return _found(caller, callee, calls[0], code_at + calls[0])


def _defined_functions(elf, names: set[str]) -> dict[str, tuple[int, int]]:
    """name -> (virtual address, size) for those of `names` defined in .dynsym or .symtab."""
    found = {name: defined_symbol(elf, name) for name in names}
    return {name: where for name, where in found.items() if where is not None}


def _read_vaddr(elf, vaddr: int, size: int) -> tuple[bytes, int] | None:
    """(`size` bytes at virtual address `vaddr`, their offset in the file), from the PT_LOAD
    segment whose file bytes hold them."""
    for segment in elf.iter_segments():
        if segment["p_type"] != "PT_LOAD":
            continue
        begin = segment["p_vaddr"]
        if begin <= vaddr and vaddr + size <= begin + segment["p_filesz"]:
            at = segment["p_offset"] + vaddr - begin
            stream = elf.stream
            stream.seek(at)
            data = stream.read(size)
            return (data, at) if len(data) == size else None
    return None


def _callee_addresses(elf, callee: str, defined: tuple[int, int] | None) -> set[int]:
    """Addresses a `call` reaches `callee` at: its own, and each PLT stub jumping through its GOT slot."""
    addresses = {defined[0]} if defined else set()
    slots = _jump_slots(elf, callee)
    if slots:
        for name in (".plt", ".plt.sec"):
            section = elf.get_section_by_name(name)
            if section is not None:
                addresses |= _stubs_through(section, slots)
    return addresses


def _jump_slots(elf, callee: str) -> set[int]:
    """GOT addresses of `callee`'s JUMP_SLOT relocations (read with numpy: pyelftools parses
    each relocation and its symbol's name, 0.12 s of start-up for libc10's)."""
    section = elf.get_section_by_name(".rela.plt")
    if section is None or section["sh_type"] != "SHT_RELA":
        return set()
    indices = symbol_indices(elf, elf.get_section(section["sh_link"]), callee)
    if indices.size == 0:
        return set()
    data = section_bytes(section)
    rela = np.dtype(_ELF64_RELA)
    relocs = np.frombuffer(data, dtype=rela, count=len(data) // rela.itemsize)
    info = relocs["info"]
    hits = ((info & 0xFFFFFFFF) == _R_X86_64_JUMP_SLOT) & np.isin(info >> np.uint64(32), indices)
    return {int(offset) for offset in relocs["offset"][hits]}


def _stubs_through(section, slots: set[int]) -> set[int]:
    """Start addresses of the 16-byte PLT stubs in `section` that jump through one of `slots`:
    `jmp *disp(%rip)` (ff 25), after an optional endbr64 and bnd prefix (f2)."""
    data, base, stubs = section_bytes(section), section["sh_addr"], set()
    for at in range(0, len(data) - 15, 16):
        stub = data[at:at + 16]
        rest = stub.removeprefix(_ENDBR64)
        skip = 16 - len(rest)
        if rest[:1] == b"\xf2":
            rest, skip = rest[1:], skip + 1
        if rest[:2] != b"\xff\x25":
            continue
        end = base + at + skip + 6
        if end + int.from_bytes(rest[2:6], "little", signed=True) in slots:
            stubs.add(base + at)
    return stubs
