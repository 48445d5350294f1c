"""bpf/parts.h is the map of what the BPF program's parts give each other (bpf/README.md,
"Parts"). The parts are joined into one text, so a part can call into another with no
declaration and compile; these tests make every such use visible in the header.

The parts are read as text (comments and strings removed): functions are `name(...) {`
definitions, maps are BPF_*(name, ...) definitions, and a use is a word that is not a
field (after `.` or `->`)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from memprof.sources.ebpf.loading import program_text

BPF = Path(__file__).resolve().parents[2] / "bpf"
HEADER = BPF / "parts.h"
_KEYWORDS = {"if", "for", "while", "switch", "return", "sizeof"}


def _code(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    return re.sub(r'"(?:\\.|[^"\\])*"', '""', text)


def _signature(text: str) -> str:
    return " ".join(text.replace("*", " * ").split())


def _functions(code: str) -> dict[str, str]:
    """name -> its normalized signature (return type, name and parameters)."""
    found = re.finditer(r"static\s+__always_inline\s+([\w\s\*]+?)\b(\w+)\s*\(([^;{}()]*)\)\s*\{", code)
    return {m[2]: _signature(f"{m[1]} {m[2]}({m[3]})") for m in found if m[2] not in _KEYWORDS}


def _maps(code: str) -> set[str]:
    plain = re.findall(r"\bBPF_(?!TABLE\b)[A-Z_]+\(\s*(\w+)", code)
    tables = re.findall(r'\bBPF_TABLE\(\s*""\s*,[^,]+,[^,]+,\s*(\w+)', code)
    return set(plain) | set(tables)


def _structs(code: str) -> set[str]:
    return set(re.findall(r"\bstruct\s+(\w+)\s*\{", code))


def _macros(code: str) -> set[str]:
    return set(re.findall(r"^\s*#\s*define\s+(\w+)", code, flags=re.M))


def _used_words(code: str) -> set[str]:
    """Identifiers used, except fields (`e->py_stack`, `key.layer`) and struct tags."""
    code = re.sub(r"(?:\.|->)\s*\w+", " ", code)
    code = re.sub(r"\bstruct\s+\w+", " ", code)
    return set(re.findall(r"\b[A-Za-z_]\w*\b", code))


def _used_structs(code: str) -> set[str]:
    return set(re.findall(r"\bstruct\s+(\w+)", code))


def _order() -> list[str]:
    """The parts in the order memprof/sources/ebpf/loading.py joins them (with the kmem family)."""
    return re.findall(r'^#line 1 "([^"]+)"$', program_text(str(BPF), kmem=True), flags=re.M)


PARTS = _order()


def _part(name: str) -> str:
    return _code((BPF / name).read_text())


def _header_sections() -> dict[str, str]:
    """The header's text per part it declares (its `== part: ==` sections)."""
    text = HEADER.read_text()
    pieces = re.split(r"/\* == ([\w.]+\.bpf\.c)(?:, [\w.]+\.bpf\.c)*:", text)
    return {pieces[i]: pieces[i + 1] for i in range(1, len(pieces) - 1, 2)}


def _declared(part: str) -> dict[str, str]:
    """Prototypes the header declares for `part`: name -> normalized signature."""
    code = _code(_header_sections().get(part, ""))
    found = re.finditer(r"static\s+__always_inline\s+([\w\s\*]+?)\b(\w+)\s*\(([^;{}()]*)\)\s*;", code)
    return {m[2]: _signature(f"{m[1]} {m[2]}({m[3]})") for m in found}


def _listed_maps(part: str) -> set[str]:
    listed = re.findall(r"maps:\s*([\w ,]+)", _header_sections().get(part, ""))
    return {name.strip() for line in listed for name in line.split(",") if name.strip()}


def _uses(user: str, owner: str) -> tuple[set[str], set[str], set[str]]:
    """(functions, maps, structs and macros) that part `user` uses from part `owner`."""
    mine, theirs = _part(user), _part(owner)
    words = _used_words(mine)
    functions = (set(_functions(theirs)) - set(_functions(mine))) & words
    maps = (_maps(theirs) - _maps(mine)) & words
    other = ((_structs(theirs) - _structs(mine)) & _used_structs(mine)) | ((_macros(theirs) - _macros(mine)) & words)
    return functions, maps, other


def test_parts_are_joined_in_the_order_the_header_and_readme_give():
    assert PARTS == ["common.bpf.c", "python.bpf.c", "kmem.bpf.c", "uprobes.bpf.c", "memprof.bpf.c"]
    header_order = re.search(r"^ \*\s+(common\.bpf\.c.*)$", HEADER.read_text(), flags=re.M)[1].split()
    assert header_order == PARTS
    readme = " ".join((BPF / "README.md").read_text().split())
    assert " → ".join(f"`{p}`" for p in PARTS) in readme


@pytest.mark.parametrize("part", PARTS)
def test_each_part_includes_the_header(part):
    assert re.search(r'^#include "parts\.h"', (BPF / part).read_text(), flags=re.M), part


@pytest.mark.parametrize("user", PARTS)
def test_every_call_into_another_part_is_declared_in_the_header(user):
    for owner in PARTS:
        if owner != user:
            functions, _, _ = _uses(user, owner)
            missing = functions - set(_declared(owner))
            assert not missing, f"{user} calls {sorted(missing)} of {owner}: declare them in bpf/parts.h under {owner}"


@pytest.mark.parametrize("user", PARTS)
def test_maps_used_from_another_part_are_listed_and_come_before(user):
    for owner in PARTS:
        if owner != user:
            _, maps, _ = _uses(user, owner)
            missing = maps - _listed_maps(owner)
            assert not missing, f"{user} uses {sorted(missing)} of {owner}: list them ('maps: …') in bpf/parts.h"
            assert not maps or PARTS.index(owner) < PARTS.index(user), f"{user} uses maps of {owner}, joined after it"


@pytest.mark.parametrize("user", PARTS)
def test_no_part_uses_another_parts_types_or_macros(user):
    """Shared layouts and constants belong in memprof.h (or parts.h), not in one part."""
    for owner in PARTS:
        if owner != user:
            _, _, other = _uses(user, owner)
            assert not other, f"{user} uses {sorted(other)} of {owner}: move them to memprof.h or parts.h"


@pytest.mark.parametrize("owner", PARTS)
def test_every_declaration_matches_its_definition_and_is_used(owner):
    defined = _functions(_part(owner))
    for name, signature in _declared(owner).items():
        assert name in defined, f"bpf/parts.h declares {name} under {owner}, which does not define it"
        assert signature == defined[name], f"bpf/parts.h: {signature} != {owner}: {defined[name]}"
        assert any(name in _uses(user, owner)[0] for user in PARTS if user != owner), \
            f"bpf/parts.h declares {name}, which no other part uses"
    for name in _listed_maps(owner):
        assert name in _maps(_part(owner)), f"bpf/parts.h lists map {name} under {owner}, which does not define it"


def test_the_checks_see_the_known_dependencies():
    """The parser finds what the parts are known to use from each other."""
    assert _uses("kmem.bpf.c", "common.bpf.c")[0] >= {"reserve", "submit", "init_event", "fill_stacks", "is_tracked"}
    assert "emit_alloc" in _uses("kmem.bpf.c", "python.bpf.c")[0]
    assert "output" in _uses("python.bpf.c", "common.bpf.c")[0]
    assert "count" in _uses("python.bpf.c", "common.bpf.c")[0]
    assert _uses("memprof.bpf.c", "python.bpf.c")[1] == {"py_procs", "py_threads"}


def test_the_readme_table_says_what_each_part_uses():
    rows = re.findall(r"^\| `([\w.]+\.bpf\.c)` \| ([^|]*) \| ([^|]*) \|$", (BPF / "README.md").read_text(), flags=re.M)
    table = {part: (common.strip(), python.strip()) for part, common, python in rows if part in PARTS}
    assert set(table) == set(PARTS)
    for user in PARTS:
        cells = []
        for owner in ("common.bpf.c", "python.bpf.c"):
            functions, maps, _ = _uses(user, owner) if owner != user else (set(), set(), set())
            cells.append(", ".join(sorted(functions) + [f"map {m}" for m in sorted(maps)]) or "—")
        assert table[user] == tuple(cells), f"bpf/README.md, Parts: write | `{user}` | {cells[0]} | {cells[1]} |"


@pytest.mark.parametrize("part", PARTS)
def test_no_part_calls_bcc_probe_read_user_by_its_name(part):
    """bcc's front end looks each call of bpf_probe_read_user up in kallsyms, rebuilding its
    map of every kernel symbol each time (~35 ms a call site): parts call parts.h's
    read_user, the same helper under another name."""
    assert not re.search(r"\bbpf_probe_read_user(?:_str)?\s*\(", _part(part)), part


def test_read_user_is_the_kernels_probe_read_user_helper():
    code = _code(HEADER.read_text())
    assert re.search(r"\(\*read_user\)\([^)]*\)\s*=\s*\(void \*\)BPF_FUNC_probe_read_user;", code)


def _programs(part: str) -> list[tuple[str, str]]:
    """(its marker, or "", the program's name) for each program `part` defines."""
    found = re.findall(r"^(\w+\s+)?(?:int\s+(mp_\w+)\s*\(|RAW_TRACEPOINT_PROBE\((\w+)\))", _part(part), flags=re.M)
    return [(marker.strip(), name or f"raw_tracepoint__{tp}") for marker, name, tp in found]


def test_every_program_names_the_half_that_compiles_it():
    """A first run compiles the program in two halves (compile_child.py, parts.h's MP_HALF):
    a program without MP_KERNEL_PROGRAM or MP_USER_PROGRAM would be compiled in both, and the
    halves would not join (a program in two halves): the whole compile would run after them."""
    programs = [program for part in PARTS for program in _programs(part)]
    assert len(programs) >= 50  # what the pattern finds: every kmem, process, Python, torch, cuda and native program
    assert [name for marker, name in programs if marker not in ("MP_KERNEL_PROGRAM", "MP_USER_PROGRAM")] == []
