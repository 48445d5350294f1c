"""The CFA rule at an address, read from one .eh_frame entry (FDE) and its CIE.

frameless.py asks, for one interrupted instruction at a time, how the canonical frame
address is computed there. pyelftools answered it by parsing the entry field by field
through a file stream (~0.5 ms an answer, 75 ms of a training run's recorder beside the
command, plus its import; issue 24), and refused entries with DW_CFA_GNU_args_size, which
GCC writes in C++ code. This reads the entry's bytes once and runs its call-frame program
(DWARF 5 §6.4.2; .eh_frame's form in the LSB, "Exception Frames") until the address.

Only the CFA is followed: every other register's rule is skipped over. A CIE is parsed once
per offset. Anything this does not know (an augmentation, an encoding, an opcode, an entry
that runs past its section) raises ValueError, which the caller reads as "no answer"."""
from __future__ import annotations

from typing import Callable, NamedTuple

_MASK64 = (1 << 64) - 1
MAX_ENTRY_BYTES = 1 << 20  # no real entry comes near; a larger length is a corrupt one

# Pointer encodings (DW_EH_PE_*): the low four bits give the format, bits 4-6 the base.
_PE_FIXED = {0x00: (8, False), 0x02: (2, False), 0x03: (4, False), 0x04: (8, False),  # (bytes, signed)
             0x0A: (2, True), 0x0B: (4, True), 0x0C: (8, True)}
_PE_ULEB128, _PE_SLEB128 = 0x01, 0x09
_PE_ABS, _PE_PCREL = 0x00, 0x10

# Operand shapes of the extended opcodes (high two bits clear) that leave the CFA alone.
_U, _S, _BLOCK = "u", "s", "b"
_SKIPPED_OPERANDS = {
    0x00: (),            # nop
    0x05: (_U, _U),      # offset_extended
    0x06: (_U,),         # restore_extended
    0x07: (_U,),         # undefined
    0x08: (_U,),         # same_value
    0x09: (_U, _U),      # register
    0x10: (_U, _BLOCK),  # expression
    0x11: (_U, _S),      # offset_extended_sf
    0x14: (_U, _U),      # val_offset
    0x15: (_U, _S),      # val_offset_sf
    0x16: (_U, _BLOCK),  # val_expression
    0x2D: (),            # GNU_window_save (AArch64: negate_ra_state)
    0x2E: (_U,),         # GNU_args_size
    0x2F: (_U, _U),      # GNU_negative_offset_extended
}


class CfaRule(NamedTuple):
    """CFA = register + offset; `register` None where a DWARF expression computes it."""
    register: int | None
    offset: int


class _Cie(NamedTuple):
    code_align: int
    data_align: int
    fde_encoding: int
    has_augmentation_data: bool
    instructions: bytes


class CallFrames:
    """One .eh_frame section: `read(offset, size)` gives bytes at `offset` from the section's
    start (fewer at its end), `size` is its size and `address` its virtual address."""

    def __init__(self, read: Callable[[int, int], bytes], size: int, address: int):
        self._read, self._size, self._address = read, size, address
        self._cies: dict[int, _Cie] = {}

    def cfa_rule(self, fde_offset: int, vaddr: int) -> CfaRule | None:
        """The CFA rule in force at `vaddr` by the FDE at `fde_offset`; None where that FDE
        does not cover `vaddr`. Raises ValueError for an entry this cannot read."""
        body, body_offset = self._entry(fde_offset)
        cie_pointer = int.from_bytes(_take(body, 0, 4), "little")
        if cie_pointer == 0:
            raise ValueError(f"the entry at {fde_offset:#x} is a CIE, not an FDE")
        cie = self._cie(body_offset - cie_pointer)
        start, pos = _pointer(body, 4, cie.fde_encoding, self._address + body_offset + 4)
        length, pos = _pointer(body, pos, cie.fde_encoding & 0x0F, 0)
        if not start <= vaddr < start + length:
            return None
        if cie.has_augmentation_data:
            skip, pos = _uleb128(body, pos)
            pos += skip
        return _run(cie, body[pos:], start, vaddr)

    def _entry(self, offset: int) -> tuple[bytes, int]:
        """(the entry's bytes after its length, their offset in the section)."""
        if not 0 <= offset <= self._size - 4:
            raise ValueError(f"an entry at {offset:#x}, outside its section")
        length = int.from_bytes(_take(self._read(offset, 4), 0, 4), "little")
        start = offset + 4
        if length == 0xFFFFFFFF:
            length = int.from_bytes(_take(self._read(start, 8), 0, 8), "little")
            start += 8
        if length > MAX_ENTRY_BYTES or start + length > self._size:
            raise ValueError(f"the entry at {offset:#x} runs past its section")
        body = self._read(start, length)
        if len(body) != length:
            raise ValueError(f"the entry at {offset:#x} was cut short")
        return body, start

    def _cie(self, offset: int) -> _Cie:
        cie = self._cies.get(offset)
        if cie is None:
            cie = self._cies[offset] = _parse_cie(self._entry(offset)[0])
        return cie


def _parse_cie(body: bytes) -> _Cie:
    """A CIE's alignment factors, its FDEs' pointer encoding and its initial instructions."""
    if _take(body, 0, 4) != b"\0\0\0\0":
        raise ValueError("the FDE's CIE pointer does not lead to a CIE")
    version = _take(body, 4, 1)[0]
    end = body.find(b"\0", 5)
    if version not in (1, 3) or end < 0:
        raise ValueError(f"a CIE of version {version}, or without its augmentation's end")
    augmentation, pos = body[5:end].decode("ascii", "replace"), end + 1
    if "eh" in augmentation or (augmentation and augmentation[0] != "z"):
        raise ValueError(f"CIE augmentation {augmentation!r}")
    code_align, pos = _uleb128(body, pos)
    data_align, pos = _sleb128(body, pos)
    pos = pos + 1 if version == 1 else _uleb128(body, pos)[1]  # the return address register
    fde_encoding = _PE_ABS
    if augmentation:
        data_length, pos = _uleb128(body, pos)
        data_end = pos + data_length
        for letter in augmentation[1:]:
            if letter == "R":
                fde_encoding, pos = _take(body, pos, 1)[0], pos + 1
            elif letter == "L":
                pos += 1
            elif letter == "P":
                encoding, pos = _take(body, pos, 1)[0], pos + 1
                _, pos = _pointer(body, pos, encoding & 0x0F, 0)
            elif letter not in "SB":
                raise ValueError(f"CIE augmentation {augmentation!r}")
        pos = data_end
    if fde_encoding & 0xF0 not in (_PE_ABS, _PE_PCREL):  # (not indirect, nor omitted: 0xff)
        raise ValueError(f"FDE pointer encoding {fde_encoding:#x}")
    return _Cie(code_align, data_align, fde_encoding, bool(augmentation), body[pos:])


def _run(cie: _Cie, instructions: bytes, start: int, vaddr: int) -> CfaRule:
    """The CFA rule after the CIE's initial instructions and the FDE's, up to the last
    location at or before `vaddr`. DW_CFA_set_loc, which no compiler here writes, is one of
    the opcodes refused."""
    rule = CfaRule(None, 0)
    remembered: list[CfaRule] = []
    loc = start
    for program in (cie.instructions, instructions):
        pos = 0
        while pos < len(program):
            op = program[pos]
            pos += 1
            high, low = op & 0xC0, op & 0x3F
            advance = None
            if high == 0x40:          # advance_loc
                advance = low * cie.code_align
            elif high == 0x80:        # offset
                pos = _uleb128(program, pos)[1]
            elif high == 0xC0:        # restore
                pass
            elif op in (0x02, 0x03, 0x04):  # advance_loc1, 2, 4
                width = 1 << (op - 2)
                advance = int.from_bytes(_take(program, pos, width), "little") * cie.code_align
                pos += width
            elif op == 0x0A:          # remember_state
                remembered.append(rule)
            elif op == 0x0B:          # restore_state
                if not remembered:
                    raise ValueError("restore_state with nothing remembered")
                rule = remembered.pop()
            elif op == 0x0C:          # def_cfa
                register, pos = _uleb128(program, pos)
                offset, pos = _uleb128(program, pos)
                rule = CfaRule(register, offset)
            elif op == 0x0D:          # def_cfa_register
                register, pos = _uleb128(program, pos)
                rule = CfaRule(register, rule.offset)
            elif op == 0x0E:          # def_cfa_offset
                offset, pos = _uleb128(program, pos)
                rule = CfaRule(rule.register, offset)
            elif op == 0x0F:          # def_cfa_expression
                length, pos = _uleb128(program, pos)
                pos += length
                rule = CfaRule(None, 0)
            elif op == 0x12:          # def_cfa_sf
                register, pos = _uleb128(program, pos)
                offset, pos = _sleb128(program, pos)
                rule = CfaRule(register, offset * cie.data_align)
            elif op == 0x13:          # def_cfa_offset_sf
                offset, pos = _sleb128(program, pos)
                rule = CfaRule(rule.register, offset * cie.data_align)
            elif op in _SKIPPED_OPERANDS:
                pos = _skip(program, pos, _SKIPPED_OPERANDS[op])
            else:
                raise ValueError(f"call-frame opcode {op:#x}")
            if advance is not None:
                if loc + advance > vaddr:
                    return rule
                loc += advance
            if pos > len(program):
                raise ValueError("an instruction runs past its entry")
    return rule


def _skip(program: bytes, pos: int, operands: tuple[str, ...]) -> int:
    for kind in operands:
        if kind == _BLOCK:
            length, pos = _uleb128(program, pos)
            pos += length
        else:
            pos = _uleb128(program, pos)[1]  # a signed one has the same extent
    return pos


def _pointer(data: bytes, pos: int, encoding: int, field_address: int) -> tuple[int, int]:
    """(value, position after it) of a pointer in `encoding`; pc-relative ones count from
    `field_address`, the pointer's own address."""
    fmt = encoding & 0x0F
    if fmt == _PE_ULEB128:
        value, end = _uleb128(data, pos)
    elif fmt == _PE_SLEB128:
        value, end = _sleb128(data, pos)
    elif fmt in _PE_FIXED:
        width, signed = _PE_FIXED[fmt]
        value, end = int.from_bytes(_take(data, pos, width), "little", signed=signed), pos + width
    else:
        raise ValueError(f"pointer encoding {encoding:#x}")
    if encoding & 0xF0 == _PE_PCREL:
        value += field_address
    elif encoding & 0xF0:  # relative to text, data or a function, aligned, or indirect
        raise ValueError(f"pointer encoding {encoding:#x}")
    return value & _MASK64, end


def _uleb128(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data):
            raise ValueError("a LEB128 number runs past its entry")
        byte = data[pos]
        value |= (byte & 0x7F) << shift
        pos += 1
        if not byte & 0x80:
            return value, pos
        shift += 7


def _sleb128(data: bytes, pos: int) -> tuple[int, int]:
    value, end = _uleb128(data, pos)
    bits = 7 * (end - pos)
    return (value - (1 << bits) if value >> (bits - 1) & 1 else value), end


def _take(data: bytes, pos: int, size: int) -> bytes:
    if pos + size > len(data):
        raise ValueError("a field runs past its entry")
    return data[pos:pos + size]
