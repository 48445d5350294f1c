"""Line-table decoding, checked against real CPython 3.10 .. 3.13 interpreters' `co_lines()`."""
from __future__ import annotations

import glob
import json
import os
import random
import subprocess

import pytest

from memprof.sources.cpython import lines as pylines
from memprof.sources.cpython.lines import line_at, line_for, lines_table

# --- hand-made tables ---


def _loc_entry(code: int, length: int, *payload: int) -> bytes:
    """One 3.11+ location entry: first byte 1cccclll, then `payload` bytes (top bit clear)."""
    return bytes([0x80 | code << 3 | (length - 1), *payload])


def _signed_varint(delta: int) -> list[int]:
    """Encode `delta` as locations.md's signed varint (6 bits a byte, bit 6 = more follows)."""
    raw = (-delta << 1 | 1) if delta < 0 else delta << 1
    out = []
    while True:
        chunk = raw & 0x3F
        raw >>= 6
        if not raw:
            return out + [chunk]
        out.append(chunk | 0x40)


@pytest.mark.parametrize("version", [(3, 10), (3, 11), (3, 12), (3, 13)])
def test_empty_table_has_no_lines(version):
    assert lines_table(version, b"", 1) == []
    assert line_for(version, b"", 1, 0) is None


@pytest.mark.parametrize("version", [(2, 7), (3, 9), (3, 14), (4, 0)])
def test_unsupported_version_raises(version):
    with pytest.raises(ValueError, match="unsupported CPython version"):
        line_for(version, b"", 1, 0)
    with pytest.raises(ValueError):
        lines_table(version, b"", 1)


def test_version_info_like_tuples_are_accepted():
    assert line_for((3, 12, 1, "final", 0), _loc_entry(10, 2), 7, 1) == 7


def test_pep626_table():
    table = bytes([
        6, 0,      # units 0-2: line 10
        4, 2,      # units 3-4: line 12
        2, 0x80,   # unit 5: no line (-128), running line stays 12
        0, 127,    # byte delta 0: line moves to 139 without covering code
        4, 1,      # units 6-7: line 140
        254, 0,    # units 8-134: a long run, still line 140
        4, 0xF6,   # units 135-136: line 130 (delta -10)
    ])
    assert lines_table((3, 10), table, 10) == [
        (0, 3, 10), (3, 5, 12), (5, 6, None), (6, 135, 140), (135, 137, 130)]
    expected = {0: 10, 2: 10, 3: 12, 4: 12, 5: None, 6: 140, 134: 140, 135: 130, 136: 130,
                137: None, -1: None}
    for unit, line in expected.items():
        assert line_for((3, 10), table, 10, unit) == line, unit


def test_location_table():
    table = b"".join([
        _loc_entry(0, 3, 0x05),                         # short form: units 0-2, line 20
        _loc_entry(11, 2, 4, 9),                        # one-line form +1: units 3-4, line 21
        _loc_entry(15, 1),                              # no location: unit 5
        _loc_entry(13, 4, *_signed_varint(300)),        # no columns, +300: units 6-9, line 321
        _loc_entry(14, 8, *_signed_varint(-250), 0, 1, 2),  # long form, -250: units 10-17, line 71
        _loc_entry(12, 1, 3, 4),                        # one-line form +2: unit 18, line 73
        _loc_entry(10, 1, 3, 4),                        # one-line form +0: unit 19, line 73
    ])
    assert lines_table((3, 11), table, 20) == [
        (0, 3, 20), (3, 5, 21), (5, 6, None), (6, 10, 321), (10, 18, 71), (18, 20, 73)]
    assert [line_for((3, 13), table, 20, u) for u in (0, 4, 5, 9, 10, 17, 18, 19, 20)] == [
        20, 21, None, 321, 71, 71, 73, 73, None]


def test_line_at_matches_line_for():
    table = _loc_entry(13, 3, *_signed_varint(4)) + _loc_entry(15, 2) + _loc_entry(11, 5)
    ranges = lines_table((3, 12), table, 1)
    for unit in range(-2, 13):
        assert line_at(ranges, unit) == line_for((3, 12), table, 1, unit)
    assert line_at([], 0) is None


@pytest.mark.parametrize("version, table", [
    ((3, 10), b"\x02"),                                 # odd length
    ((3, 11), b"\x05\x80"),                             # first byte is not an entry start
    ((3, 12), bytes([0x80 | 13 << 3, 0x41])),           # varint says "more" but ends
])
def test_malformed_tables_raise(version, table):
    with pytest.raises(ValueError, match="malformed"):
        lines_table(version, table, 1)


# --- the decoder against a byte-by-byte reading of locations.md ---


def _reference_locations(table: bytes, firstlineno: int) -> list:
    """The plain reading of a 3.11+ table, one byte at a time, that lines.py's decoder (which
    splits entries with a regular expression) must agree with: ranges, merges and errors.
    A varint is read from the byte after the entry's first, whatever that byte is."""
    def varint(pos):
        value = shift = 0
        while True:
            if pos >= len(table):
                raise ValueError("malformed: cut off")
            value |= (table[pos] & 0x3F) << shift
            if not table[pos] & 0x40:
                return -(value >> 1) if value & 1 else value >> 1
            pos, shift = pos + 1, shift + 6

    ranges, line, start, pos = [], firstlineno, 0, 0
    while pos < len(table):
        if not table[pos] & 0x80:
            raise ValueError("malformed: not an entry")
        code, length = (table[pos] >> 3) & 0x0F, (table[pos] & 0x07) + 1
        if code in (13, 14):
            line += varint(pos + 1)
        elif 10 <= code <= 12:
            line += code - 10
        this = None if code == 15 else line
        if ranges and ranges[-1][2] == this:
            ranges[-1] = (ranges[-1][0], start + length, this)
        else:
            ranges.append((start, start + length, this))
        start += length
        pos += 1
        while pos < len(table) and not table[pos] & 0x80:
            pos += 1
    return ranges


def _random_table(rnd: random.Random, entries: int) -> bytes:
    """Up to `entries` entries of every code with random payloads: mostly well formed, with
    long varints, bytes with the top bit set where a varint or column byte belongs, and
    cut-off ends."""
    out: list[int] = []
    for _ in range(rnd.randint(0, entries)):
        code = rnd.choice([0, 5, 9, 10, 11, 12, 13, 13, 14, 14, 15])
        out.append(0x80 | code << 3 | rnd.randint(0, 7))
        if code in (13, 14) and rnd.random() < 0.8:
            out += _signed_varint(rnd.choice([rnd.randint(-31, 31), rnd.randint(-5000, 5000)]))
        out += [rnd.getrandbits(8) if rnd.random() < 0.1 else rnd.getrandbits(7) for _ in range(rnd.randint(0, 4))]
    if out and rnd.random() < 0.2:
        out = out[:rnd.randint(0, len(out))]
    return bytes(out)


def _outcome(decode, table: bytes, firstlineno: int):
    try:
        return decode(table, firstlineno)
    except ValueError:
        return "ValueError"


@pytest.mark.parametrize("seed", range(4))
def test_location_decoders_agree_with_a_byte_by_byte_reading(seed):
    """Both decoders, the loop and numpy's (lines_table picks one by the table's size), on
    small and large tables."""
    rnd = random.Random(seed)
    tables = ([_random_table(rnd, 40) for _ in range(1500)] + [_random_table(rnd, 400) for _ in range(500)]
              + [bytes(rnd.getrandbits(8) for _ in range(rnd.randint(1, 1024))) for _ in range(300)])
    outcomes = {"ranges": 0, "ValueError": 0}
    for table in tables:
        firstlineno = rnd.randint(0, 100_000)
        expected = _outcome(_reference_locations, table, firstlineno)
        assert _outcome(lambda t, f: lines_table((3, 12), t, f), table, firstlineno) == expected, table.hex()
        assert _outcome(pylines._decode_locations, table, firstlineno) == expected, table.hex()
        if table:
            try:
                assert _outcome(pylines._decode_locations_vectorized, table, firstlineno) == expected, table.hex()
            except pylines._TooLarge:  # a delta past 2^40 (random bytes): lines_table took the loop
                pass
        outcomes["ValueError" if expected == "ValueError" else "ranges"] += 1
    assert min(outcomes.values()) > 300  # both kinds of table were tried
    assert sum(len(table) >= pylines._VECTOR_MIN_BYTES for table in tables) > 300  # numpy's decoder's sizes too


def test_a_line_delta_too_large_for_numpy_is_decoded_by_the_loop():
    table = _loc_entry(13, 1, *_signed_varint(1 << 70)) + _loc_entry(11, 1) * 600
    assert len(table) >= pylines._VECTOR_MIN_BYTES
    with pytest.raises(pylines._TooLarge):
        pylines._decode_locations_vectorized(table, 1)
    assert lines_table((3, 11), table, 1) == _reference_locations(table, 1)


def test_a_varint_read_from_the_next_entrys_first_byte():
    # Code 13 with no payload: its varint is the next entry's first byte (0x80 | 5 << 3, 0xa8:
    # raw 0x28 → +20), which then starts an entry of its own (code 5: the line kept).
    table = _loc_entry(13, 2) + _loc_entry(5, 1) + _loc_entry(10, 1)
    assert lines_table((3, 11), table, 10) == _reference_locations(table, 10) == [(0, 4, 30)]


# --- against real interpreters ---

def _corpus() -> str:
    """Source covering the compiler's line-table cases across 3.10 .. 3.13."""
    lines = [
        "import functools",
        "X = [i * 2 for i in range(3)]",
        "",
        "def deco(f):",
        "    @functools.wraps(f)",
        "    def inner(*a, **k):",
        "        return f(*a, **k)",
        "    return inner",
        "",
        "@deco",
        "@functools.lru_cache(maxsize=None)",
        "def decorated(n):",
        "",
        "    # a comment and a blank line: lines with no code",
        "    total = 0",
        "    for i in range(n):",
        "        if i % 3:",
        "            continue",
        "        total += (lambda v: v + 1)(i)",
        "    else:",
        "        total -= 1",
        "    return total",
        "",
        "def control(xs):",
        "    out = {k: [v for v in range(k) if v] for k in xs}",
        "    gen = (x for x in xs if x)",
        "    s = {x for x in gen}",
        "    while xs:",
        "        try:",
        "            xs.pop()",
        "        except IndexError as e:",
        "            raise RuntimeError('x') from e",
        "        except (KeyError, ValueError):",
        "            pass",
        "        else:",
        "            break",
        "        finally:",
        "            s.add(0)",
        "    with open(__file__) as f, open(__file__) as g:",
        "        f.read(); g.read()",
        "    match xs:",
        "        case [a, *rest] if a:",
        "            return rest",
        "        case {'k': v}:",
        "            return v",
        "        case _:",
        "            pass",
        "    return out, s",
        "",
        "def outer(a):",
        "    b = a + 1",
        "    def middle():",
        "        nonlocal b",
        "        def innermost():",
        "            return a + b",
        "        b += 1",
        "        return innermost",
        "    return middle",
        "",
        "class K:",
        "    attr = [x for x in range(2)]",
        "    def method(self):",
        "        yield from range(3)",
        "    async def amethod(self, other):",
        "        async with other as o:",
        "            async for i in o:",
        "                await i",
        "        return [j async for j in other]",
        "",
    ]
    lines += _long_function()
    while len(lines) < 4999:  # the next def lands on line 5000
        lines.append("")
    lines += [
        "def far_away(x):",
        "    y = x * 2",
        "    return (lambda: y)()",
    ]
    return "\n".join(lines) + "\n"


def _long_function() -> list[str]:
    """A function of ~900 lines: big forward gaps, a 300-line call (large backward deltas on
    the call instruction), one very long line, and a loop whose jump back spans 300 lines."""
    body = ["def very_long(n):", "    acc = 0"]
    for i in range(150):
        body.append(f"    acc += n * {i}")
    body += [""] * 200 + ["    # 200 blank lines above"]
    body.append("    acc += max(")
    body += [f"        {i}," for i in range(300)]
    body.append("    )")
    body.append("    t = (" + ", ".join(f"n + {i}" for i in range(250)) + ")")
    body.append("    while acc < n:")
    body += [f"        acc += {i}" for i in range(300)]
    body += ["        " + ("" if i % 2 else "pass") for i in range(20)]
    body.append("    return acc, t")
    return body


# Runs under the interpreter being checked: every code object's table and co_lines().
_DUMPER = r"""
import importlib.util, json, sys

def walk(co, out):
    out.append({
        "name": co.co_name,
        "linetable": co.co_linetable.hex(),
        "firstlineno": co.co_firstlineno,
        "n_units": len(co.co_code) // 2,
        "lines": [list(entry) for entry in co.co_lines()],  # (start byte, end byte, line)
    })
    for const in co.co_consts:
        if isinstance(const, type(co)):
            walk(const, out)

codes = []
walk(compile(sys.stdin.read(), "<corpus>", "exec"), codes)
for name in ("argparse", "difflib", "typing"):  # real-world code, loaded the usual way
    spec = importlib.util.find_spec(name)
    walk(spec.loader.get_code(name), codes)
print(json.dumps({"version": list(sys.version_info[:2]), "codes": codes}))
"""

_INTERPRETERS = [
    ("3.10", "/root/.pyenv/versions/3.10.*/bin/python3.10"),
    ("3.11", "/root/.pyenv/versions/3.11.*/bin/python3.11"),
    ("3.12", "/root/.pyenv/versions/3.12.*/bin/python3.12"),
    ("3.13", "/root/.pyenv/versions/3.13.*/bin/python3.13"),
    ("system-3.11", "/usr/bin/python3.11"),
]


def _dump(pattern: str) -> dict:
    """The dumper's JSON from the newest interpreter matching `pattern`; skips if none."""
    found = sorted(glob.glob(pattern))
    if not found or not os.access(found[-1], os.X_OK):
        pytest.skip(f"no interpreter matching {pattern}")
    done = subprocess.run([found[-1], "-I", "-c", _DUMPER], input=_corpus(),
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _truth(code: dict) -> list[int | None]:
    """Line per code unit from co_lines (byte offsets), None where it gives no line."""
    per_unit: list[int | None] = [None] * code["n_units"]
    for start, end, line in code["lines"]:
        for unit in range(start // 2, end // 2):
            per_unit[unit] = line
    return per_unit


@pytest.mark.parametrize("label, pattern", _INTERPRETERS, ids=[i[0] for i in _INTERPRETERS])
def test_matches_co_lines_of_real_interpreter(label, pattern):
    dump = _dump(pattern)
    version = tuple(dump["version"])
    assert label.endswith(f"{version[0]}.{version[1]}")
    codes = dump["codes"]
    # The corpus did what it claims: a def at line 5000 and a function spanning > 300 lines.
    assert any(c["name"] == "far_away" and c["firstlineno"] == 5000 for c in codes)
    assert any(c["name"] == "very_long" and max(l for *_, l in c["lines"] if l) > 800
               for c in codes)
    mismatches = []
    for code in codes:
        table = bytes.fromhex(code["linetable"])
        truth = _truth(code)
        for unit, want in enumerate(truth):
            got = line_for(version, table, code["firstlineno"], unit)
            if got != want:
                mismatches.append((code["name"], code["firstlineno"], unit, want, got))
        # Nothing past the end of the bytecode.
        assert line_for(version, table, code["firstlineno"], len(truth)) is None, code["name"]
    assert not mismatches, f"{len(mismatches)} mismatches, first: {mismatches[:5]}"
