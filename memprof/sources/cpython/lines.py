"""Line numbers of CPython bytecode, decoded from a code object's `co_linetable` bytes.

eBPF captures (code object, instruction offset) pairs from another process's interpreter;
this module turns them into source lines without running that interpreter. Two formats:

* CPython 3.10 — PEP 626 pairs (byte delta, signed line delta); see 3.10's
  Objects/lnotab_notes.txt.
* CPython 3.11 .. 3.13 — the location table; see Objects/locations.md and
  `_PyLineTable_NextAddressRange` in Objects/codeobject.c.

Offsets here are instruction indices in code units (2 bytes each: byte offset // 2) and
lines are 1-based source lines; None stands for "no line" (artificial instructions)."""
from __future__ import annotations

import bisect
import functools
import math
import re
from typing import Sequence

from memprof.lazy_import import numpy as np

# (start_code_unit, end_code_unit, line): half-open range [start, end) of instructions.
LineRange = tuple[int, int, "int | None"]

_PEP626_VERSIONS = {(3, 10)}
_LOCATION_VERSIONS = {(3, 11), (3, 12), (3, 13)}

# 3.10: a line delta of -128 marks a range whose instructions have no line.
_PEP626_NO_LINE = -128

# 3.11+: codes in bits 3-6 of an entry's first byte that move the line (others keep it).
_CODE_ONE_LINE0 = 10  # codes 10, 11, 12 advance the line by 0, 1, 2
_CODE_ONE_LINE2 = 12
_CODE_NO_COLUMNS = 13  # signed varint line delta, no columns
_CODE_LONG = 14  # signed varint line delta, then end line / columns (ignored here)
_CODE_NONE = 15  # no location: no line, line unchanged


def lines_table(version: Sequence[int], linetable: bytes, firstlineno: int) -> list[LineRange]:
    """Decode `linetable` into contiguous (start, end, line) ranges in code units.

    `version` is the CPython (major, minor) that made the code object, (3, 10) .. (3, 13)
    (extra items, as in `sys.version_info`, are ignored); `firstlineno` is its
    co_firstlineno. Ranges start at 0, each begins where the previous ends, none is empty,
    and neighbours with the same line are merged. `line` is None where the table says the
    instructions have no line. Raises ValueError for an unsupported version or a malformed
    table (odd length in 3.10, an entry not starting with a marker byte, a cut-off varint).
    """
    key = _version_key(version)
    return list(_decode(key, bytes(linetable), firstlineno))


def line_at(table: Sequence[LineRange], instr_index: int) -> int | None:
    """Line of instruction `instr_index` (code units) in a table from `lines_table`.

    None when the table has no line for it, including offsets outside the table."""
    if instr_index < 0 or not table or instr_index >= table[-1][1]:
        return None
    # Ranges are contiguous from 0, so the one holding instr_index is the last starting at or
    # before it. The probe's infinite second item outranks any `end`, so a range starting at
    # instr_index sorts before it and `line` (maybe None) is never compared.
    pos = bisect.bisect_right(table, (instr_index, math.inf)) - 1
    return table[pos][2]


def line_for(version: tuple[int, int], linetable: bytes, firstlineno: int,
             instr_index: int) -> int | None:
    """Line number of the instruction at `instr_index` (in code units of 2 bytes, i.e. byte
    offset // 2) for a code object of CPython `version` (3, 10) .. (3, 13) whose co_linetable
    is `linetable` and co_firstlineno is `firstlineno`. None when the table has no line for it
    (e.g. instruction offset past the end of the table, or an entry with no line). Raises
    ValueError for unsupported versions (and for malformed tables, see `lines_table`).

    Decoded tables are cached, so repeated look-ups in one code object cost a bisection."""
    return line_at(_decode(_version_key(version), bytes(linetable), firstlineno), instr_index)


def _version_key(version: Sequence[int]) -> tuple[int, int]:
    """(major, minor) of `version`, or ValueError when this module cannot decode its tables."""
    key = tuple(version[:2])
    if key not in _PEP626_VERSIONS and key not in _LOCATION_VERSIONS:
        raise ValueError(f"unsupported CPython version for line tables: {version!r} "
                         "(supported: 3.10 to 3.13)")
    return key  # type: ignore[return-value]


@functools.lru_cache(maxsize=4096)
def _decode(version: tuple[int, int], linetable: bytes, firstlineno: int) -> tuple[LineRange, ...]:
    """Cached decoding, as a tuple so callers cannot alter the shared value."""
    if version in _PEP626_VERSIONS:
        return tuple(_decode_pep626(linetable, firstlineno))
    if len(linetable) >= _VECTOR_MIN_BYTES:
        try:
            return tuple(_decode_locations_vectorized(linetable, firstlineno))
        except _TooLarge:
            pass
    return tuple(_decode_locations(linetable, firstlineno))


def _append(ranges: list[LineRange], start: int, end: int, line: int | None) -> None:
    """Add [start, end) with `line` to `ranges`, merging it into the last range if same line."""
    if ranges and ranges[-1][2] == line:
        ranges[-1] = (ranges[-1][0], end, line)
    else:
        ranges.append((start, end, line))


# --- CPython 3.10: PEP 626 ---


def _decode_pep626(table: bytes, firstlineno: int) -> list[LineRange]:
    """Ranges of a 3.10 co_linetable: pairs of (unsigned byte delta, signed line delta).

    The line delta applies before the range it opens; -128 means "no line" and leaves the
    running line untouched. A pair with byte delta 0 only moves the line — the compiler
    splits line deltas beyond ±127 and byte deltas beyond 254 into several pairs."""
    if len(table) % 2:
        raise ValueError(f"malformed 3.10 line table: odd length {len(table)}")
    ranges: list[LineRange] = []
    line = firstlineno
    start_byte = 0
    for i in range(0, len(table), 2):
        byte_delta, line_delta = table[i], table[i + 1]
        if line_delta >= 128:
            line_delta -= 256  # signed char
        if line_delta == _PEP626_NO_LINE:
            entry_line = None
        else:
            line += line_delta
            entry_line = line
        if byte_delta:
            end_byte = start_byte + byte_delta
            _append(ranges, start_byte // 2, end_byte // 2, entry_line)
            start_byte = end_byte
    return ranges


# --- CPython 3.11 .. 3.13: location table ---


# One entry of a location table: its first byte has the top bit set, the rest have it clear.
_ENTRY = re.compile(rb"[\x80-\xff][\x00-\x7f]*")
_NOT_OPEN = object()  # the line of the range before the first: equal to no line


def _decode_locations(table: bytes, firstlineno: int) -> list[LineRange]:
    """Ranges of a 3.11+ location table.

    Each entry starts with a byte 1cccclll — code cccc, length lll + 1 code units — followed
    by bytes with the top bit clear (varints and column bytes). Only the line matters here:
    codes 13 and 14 carry a signed varint line delta right after the first byte, codes 10-12
    advance it by code - 10, code 15 has no line, and every other code keeps the line.

    The entries are split by a regular expression and a one-byte varint (a line delta of
    less than 32 either way, most of them) is read in place: a byte-by-byte loop took a
    training run's recorder ~0.1 s of CPU beside the command (issue 24)."""
    if table and not table[0] & 0x80:
        raise ValueError("malformed location table: byte 0 does not start an entry")
    ranges: list[LineRange] = []
    line = firstlineno
    start = opened = pos = 0
    open_line: object = _NOT_OPEN
    for entry in _ENTRY.findall(table):
        head = entry[0]
        code = (head >> 3) & 0x0F
        if code < _CODE_ONE_LINE0:
            this = line
        elif code <= _CODE_ONE_LINE2:
            line += code - _CODE_ONE_LINE0
            this = line
        elif code == _CODE_NONE:
            this = None
        else:  # _CODE_NO_COLUMNS, _CODE_LONG
            if len(entry) > 1 and not entry[1] & 0x40:
                raw = entry[1] & 0x3F
                line += -(raw >> 1) if raw & 1 else raw >> 1
            else:  # a longer varint, or one the next entry's byte holds (a malformed table)
                line += _signed_varint(table, pos + 1)
            this = line
        if this != open_line:  # a new range, as _append would open (None == None merges)
            if start:
                ranges.append((opened, start, open_line))
            opened, open_line = start, this
        start += (head & 0x07) + 1
        pos += len(entry)
    if start:
        ranges.append((opened, start, open_line))
    return ranges


# From this many bytes a table is decoded with numpy: its fixed ~25 µs a call beats the loop
# above (~0.075 µs a byte) from ~400 bytes. A training run's recorder decodes ~1,500 tables,
# median 320 bytes, a tenth near BPF's 2,048-byte cut (a module's; issue 24).
_VECTOR_MIN_BYTES = 512
# A line delta beyond this is left to the loop above, whose ints do not overflow (no real
# table holds one; a hostile one may).
_VECTOR_MAX_DELTA = 1 << 40


class _TooLarge(Exception):
    """A line delta the vectorized decoder leaves to `_decode_locations`."""


def _decode_locations_vectorized(table: bytes, firstlineno: int) -> list[LineRange]:
    """`_decode_locations` with numpy: the same ranges, and ValueError where it raises one.

    Every byte with the top bit set starts an entry, so the entries are found at once; a
    one-byte varint is read at once too, a longer one by `_signed_varint`. Ranges open where
    "no line" changes, or the line does."""
    data = np.frombuffer(table, dtype=np.uint8)
    if not data[0] & 0x80:
        raise ValueError("malformed location table: byte 0 does not start an entry")
    heads_at = np.flatnonzero(data & 0x80)
    heads = data[heads_at]
    codes = (heads >> 3) & 0x0F
    deltas = np.where((codes >= _CODE_ONE_LINE0) & (codes <= _CODE_ONE_LINE2), codes.astype(np.int64) - _CODE_ONE_LINE0, 0)
    with_varint = np.flatnonzero((codes == _CODE_NO_COLUMNS) | (codes == _CODE_LONG))
    if with_varint.size:
        deltas[with_varint] = _signed_varints(table, data, heads_at[with_varint] + 1)
    lines = firstlineno + np.cumsum(deltas)
    ends = np.cumsum((heads & 0x07).astype(np.int64) + 1)
    no_line = codes == _CODE_NONE
    opens = np.flatnonzero(np.concatenate(([True], (no_line[1:] != no_line[:-1])
                                           | (~no_line[1:] & (lines[1:] != lines[:-1])))))
    starts = np.concatenate(([0], ends[opens[1:] - 1])).tolist()
    range_lines = [None if none else line for none, line in zip(no_line[opens].tolist(), lines[opens].tolist())]
    return list(zip(starts, starts[1:] + [int(ends[-1])], range_lines))


def _signed_varints(table: bytes, data, at):
    """The signed varints at byte positions `at` (ascending) of `table`, whose bytes `data`
    holds as a numpy array: each read as `_signed_varint` reads it, a one-byte one at once."""
    if at[-1] >= len(table):
        raise ValueError("malformed location table: varint cut off at the end")
    first = data[at].astype(np.int64)
    raw = first & 0x3F
    values = np.where(raw & 1, -(raw >> 1), raw >> 1)
    for i in np.flatnonzero(first & 0x40).tolist():
        value = _signed_varint(table, int(at[i]))
        if abs(value) > _VECTOR_MAX_DELTA:
            raise _TooLarge
        values[i] = value
    return values


def _varint(table: bytes, pos: int) -> int:
    """Unsigned varint at `pos`: 6 value bits a byte, least significant first; bit 6 says
    another byte follows."""
    value = shift = 0
    while True:
        if pos >= len(table):
            raise ValueError("malformed location table: varint cut off at the end")
        byte = table[pos]
        value |= (byte & 0x3F) << shift
        if not byte & 0x40:
            return value
        pos += 1
        shift += 6


def _signed_varint(table: bytes, pos: int) -> int:
    """Signed varint at `pos`: an unsigned varint holding magnitude << 1 | sign bit."""
    raw = _varint(table, pos)
    return -(raw >> 1) if raw & 1 else raw >> 1
