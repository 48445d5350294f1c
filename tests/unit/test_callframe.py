"""callframe.py's CFA rules: against pyelftools on real libraries' .eh_frame, and on
hand-made entries for what real files rarely hold (64-bit lengths, every encoding this
reads, remembered states, entries that run past their section)."""
from __future__ import annotations

import os
import random
import struct

import pytest
from elftools.dwarf.callframe import CallFrameInfo
from elftools.dwarf.structs import DWARFStructs

from memprof.sources.symbols import frameless
from memprof.sources.symbols.callframe import CallFrames, CfaRule

torch = pytest.importorskip("torch")
TORCH_LIB = os.path.join(os.path.dirname(torch.__file__), "lib")
LIBRARIES = ["/usr/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libstdc++.so.6", "/usr/bin/python3.11",
             os.path.join(TORCH_LIB, "libc10.so"), os.path.join(TORCH_LIB, "libtorch_cpu.so")]


class _Stream:
    """The section as the file stream pyelftools reads."""

    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def seek(self, pos, whence=0):
        self.pos = {0: 0, 1: self.pos, 2: len(self.data)}[whence] + pos
        return self.pos

    def tell(self):
        return self.pos

    def read(self, n=-1):
        end = len(self.data) if n is None or n < 0 else self.pos + n
        out, self.pos = self.data[self.pos:end], min(end, len(self.data))
        return out


def _pyelftools_rule(cfi: CallFrameInfo, fde_offset: int, vaddr: int):
    """pyelftools' answer in callframe's terms; "refused" where it raises."""
    try:
        rule = None
        for row in cfi._parse_entry_at(fde_offset).get_decoded().table:
            if row["pc"] > vaddr:
                break
            rule = row["cfa"]
    except Exception:  # noqa: BLE001 — pyelftools does not know DW_CFA_GNU_args_size
        return "refused"
    return (None, 0) if rule.expr is not None else (rule.reg, rule.offset)


@pytest.mark.parametrize("path", LIBRARIES, ids=os.path.basename)
def test_the_rules_are_pyelftools_rules_where_it_reads_the_entry(path):
    eh = frameless._EhFrame(path)
    frame = frameless._x86_64_sections(eh._file, (".eh_frame",))[".eh_frame"]
    data = os.pread(eh._file.fileno(), frame.size, frame.offset)
    cfi = CallFrameInfo(stream=_Stream(data), size=frame.size, address=frame.addr, for_eh_frame=True,
                        base_structs=DWARFStructs(little_endian=True, dwarf_format=32, address_size=8))
    ours = CallFrames(lambda offset, size: data[offset:offset + size], frame.size, frame.addr)
    rnd = random.Random(os.path.basename(path))  # the same sample wherever the library is installed
    compared = refused = 0
    for i in rnd.sample(range(len(eh.starts)), min(400, len(eh.starts))):
        fde_offset = int(eh.fde_offsets[i]) + eh._hdr_addr - eh._frame_addr
        start = int(eh.starts[i]) + eh._hdr_addr
        for vaddr in (start - 1, start, start + 1, start + 4, start + rnd.randrange(1, 400)):
            try:
                fde = cfi._parse_entry_at(fde_offset)
                inside = fde["initial_location"] <= vaddr < fde["initial_location"] + fde["address_range"]
                expected = _pyelftools_rule(cfi, fde_offset, vaddr) if inside else None
            except Exception:  # noqa: BLE001
                expected = "refused"
            if expected == "refused":
                refused += 1
                ours.cfa_rule(fde_offset, vaddr)  # read without an error: DW_CFA_GNU_args_size is known here
                continue
            rule = ours.cfa_rule(fde_offset, vaddr)
            assert (None if rule is None else tuple(rule)) == expected, hex(vaddr)
            compared += inside
    assert compared > 1000
    # pyelftools refuses libtorch's entries with DW_CFA_GNU_args_size: ~10 % of those sampled.
    assert refused < compared / 4


# --- hand-made entries ---

def _uleb(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _sleb(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        done = (value == 0 and not byte & 0x40) or (value == -1 and byte & 0x40)
        out.append(byte | (0 if done else 0x80))
        if done:
            return bytes(out)


def _entry(body: bytes, wide: bool = False) -> bytes:
    return (b"\xff\xff\xff\xff" + struct.pack("<Q", len(body)) if wide else struct.pack("<I", len(body))) + body


def _cie(instructions: bytes, augmentation: bytes = b"zR", data: bytes = b"\x1b", version: int = 1) -> bytes:
    """A CIE: code alignment 1, data alignment -8, return address register 16."""
    head = struct.pack("<IB", 0, version) + augmentation + b"\0" + _uleb(1) + _sleb(-8)
    head += bytes([16]) if version == 1 else _uleb(16)
    if augmentation:
        head += _uleb(len(data)) + data
    return _entry(head + instructions)


def _section(cie: bytes, fde_body, wide: bool = False) -> bytes:
    """CIE at 0, then one FDE; `fde_body(cie_pointer_offset)` returns the FDE's body."""
    fde_at = len(cie) + (12 if wide else 4)
    return cie + _entry(fde_body(fde_at), wide)


ADDRESS = 0x10000  # the section's address
FUNCTION = 0x20000  # the function the FDE covers, 0x100 bytes
# DW_CFA_* used below
DEF_CFA, DEF_CFA_OFFSET, DEF_CFA_REGISTER, DEF_CFA_EXPRESSION = 0x0C, 0x0E, 0x0D, 0x0F
REMEMBER, RESTORE, ARGS_SIZE, OFFSET_EXT_SF = 0x0A, 0x0B, 0x2E, 0x11
INITIAL = bytes([DEF_CFA]) + _uleb(7) + _uleb(8) + bytes([0x80 | 16]) + _uleb(1)  # def_cfa rsp+8; offset r16


def _pcrel_fde(instructions: bytes):
    """The body of an FDE for FUNCTION, given where its CIE pointer lies (and its CIE, at 0
    unless said)."""
    def body(cie_pointer_at: int, cie_at: int = 0) -> bytes:
        location_at = ADDRESS + cie_pointer_at + 4
        out = struct.pack("<Ii", cie_pointer_at - cie_at, FUNCTION - location_at) + struct.pack("<i", 0x100)
        return out + _uleb(0) + instructions
    return body


def _frames(section: bytes) -> CallFrames:
    return CallFrames(lambda offset, size: section[offset:offset + size], len(section), ADDRESS)


PROLOGUE = (bytes([0x40 | 1, DEF_CFA_OFFSET]) + _uleb(16)       # push %rbp at +0: rsp+16 from +1
            + bytes([0x40 | 3, DEF_CFA_REGISTER]) + _uleb(6)    # mov %rsp,%rbp: rbp+16 from +4
            + bytes([REMEMBER, 0x40 | 0x10, DEF_CFA]) + _uleb(7) + _uleb(8)  # an early return at +0x14
            + bytes([0x40 | 1, RESTORE]))                        # rbp+16 again from +0x15


@pytest.mark.parametrize("wide", [False, True], ids=["32-bit lengths", "64-bit lengths"])
def test_a_prologue_and_a_remembered_state(wide):
    cie = _cie(INITIAL)
    section = cie + _entry(_pcrel_fde(PROLOGUE)(len(cie) + (12 if wide else 4)), wide)
    frames = _frames(section)
    at = {offset: frames.cfa_rule(len(cie), FUNCTION + offset) for offset in (0, 1, 3, 4, 0x13, 0x14, 0x15, 0xFF)}
    assert at == {0: (7, 8), 1: (7, 16), 3: (7, 16), 4: (6, 16), 0x13: (6, 16), 0x14: (7, 8), 0x15: (6, 16),
                  0xFF: (6, 16)}
    assert frames.cfa_rule(len(cie), FUNCTION - 1) is None and frames.cfa_rule(len(cie), FUNCTION + 0x100) is None


def test_advances_of_every_width_signed_offsets_and_skipped_operands():
    program = (bytes([0x02, 0x10]) + bytes([0x13]) + _sleb(-3)                    # advance_loc1 +0x10; offset -3 * -8
               + bytes([0x03]) + struct.pack("<H", 0x10) + bytes([ARGS_SIZE]) + _uleb(300)
               + bytes([OFFSET_EXT_SF]) + _uleb(3) + _sleb(-2)
               + bytes([0x12]) + _uleb(6) + _sleb(-4)                              # def_cfa_sf rbp, -4 * -8
               + bytes([0x04]) + struct.pack("<I", 0x10) + bytes([DEF_CFA_EXPRESSION]) + _uleb(2) + b"\x77\x08")
    cie = _cie(INITIAL)
    frames = _frames(_section(cie, _pcrel_fde(program)))
    rules = [frames.cfa_rule(len(cie), FUNCTION + offset) for offset in (0xF, 0x10, 0x1F, 0x20, 0x2F, 0x30)]
    assert rules == [(7, 8), (7, 24), (7, 24), (6, 32), (6, 32), (None, 0)]


@pytest.mark.parametrize("augmentation, data", [
    (b"zR", b"\x1b"),                               # pc-relative sdata4, GCC's and LLVM's
    (b"zPLR", b"\x9b" + struct.pack("<i", 0) + b"\x03\x1b"),  # a personality routine, an LSDA
    (b"zSR", b"\x1b"),                               # a signal frame
])
def test_augmentations(augmentation, data):
    cie = _cie(INITIAL, augmentation, data)
    frames = _frames(_section(cie, _pcrel_fde(PROLOGUE)))
    assert frames.cfa_rule(len(cie), FUNCTION + 4) == CfaRule(6, 16)


def test_absolute_udata8_locations_and_a_version_3_cie_without_augmentation():
    cie = _cie(INITIAL, augmentation=b"", version=3)
    frames = _frames(_section(cie, lambda at: struct.pack("<IQQ", at, FUNCTION, 0x100) + PROLOGUE))
    assert [frames.cfa_rule(len(cie), FUNCTION + o) for o in (0, 4)] == [(7, 8), (6, 16)]


@pytest.mark.parametrize("damage", [
    "length past the section", "cie pointer outside", "points at an FDE", "unknown opcode", "restore with nothing",
    "cut leb", "eh augmentation", "datarel encoding", "indirect encoding", "entry offset outside"])
def test_entries_it_cannot_read_raise_value_error(damage):
    cie = _cie(INITIAL)
    program = PROLOGUE
    if damage == "unknown opcode":
        program = bytes([0x40 | 1, 0x3F])
    elif damage == "restore with nothing":
        program = bytes([0x40 | 1, RESTORE])
    elif damage == "cut leb":
        program = bytes([0x40 | 1, DEF_CFA_OFFSET, 0x80])
    elif damage == "eh augmentation":
        cie = _cie(INITIAL, b"eh", b"")
    elif damage == "datarel encoding":
        cie = _cie(INITIAL, b"zR", b"\x3b")
    elif damage == "indirect encoding":
        cie = _cie(INITIAL, b"zR", b"\x9b")
    section = _section(cie, _pcrel_fde(program))
    offset = len(cie)
    if damage == "length past the section":
        section = section[:offset] + struct.pack("<I", len(section)) + section[offset + 4:]
    elif damage == "cie pointer outside":
        section = section[:offset + 4] + struct.pack("<I", offset + 100) + section[offset + 8:]
    elif damage == "points at an FDE":  # a second FDE whose CIE pointer leads to the first
        offset = len(section)
        section += _entry(_pcrel_fde(PROLOGUE)(offset + 4, cie_at=len(cie)))
    elif damage == "entry offset outside":
        offset = len(section) + 8
    with pytest.raises(ValueError):
        _frames(section).cfa_rule(offset, FUNCTION + 8)


def test_a_cie_is_parsed_once():
    cie = _cie(INITIAL)
    section = _section(cie, _pcrel_fde(PROLOGUE))
    reads = []
    frames = CallFrames(lambda offset, size: reads.append(offset) or section[offset:offset + size], len(section), ADDRESS)
    frames.cfa_rule(len(cie), FUNCTION)
    first = len(reads)
    frames.cfa_rule(len(cie), FUNCTION + 4)
    assert 0 in reads[:first] and 0 not in reads[first:]
