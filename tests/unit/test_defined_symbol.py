"""elfsyms.defined_symbol: the numpy look-up of one symbol by name that start-up uses instead
of pyelftools' get_symbol_by_name must give what that gives, on real files."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from memprof.sources.symbols.elfsyms import defined_symbol, string_offsets

LIBC = "/lib/x86_64-linux-gnu/libc.so.6"
TORCH_LIB = Path(sys.prefix) / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages" / "torch" / "lib"


def _by_pyelftools(elf, name: str):
    for table in (".dynsym", ".symtab"):
        section = elf.get_section_by_name(table)
        for sym in (section.get_symbol_by_name(name) if section is not None else None) or ():
            if sym["st_shndx"] != "SHN_UNDEF" and sym["st_value"]:
                return sym["st_value"], sym["st_size"]
    return None


CASES = [
    (sys.executable, ["_PyRuntime", "PyCode_Type", "Py_Version", "Py_InitializeFromConfig", "malloc", "no_such_symbol"]),
    (LIBC, ["malloc", "free", "cfree", "__libc_malloc", "calloc", "no_such_symbol"]),
    (str(TORCH_LIB / "libc10.so"), ["_ZN3c109alloc_cpuEm", "_ZN3c108free_cpuEPv", "malloc", "no_such_symbol"]),
]


@pytest.mark.parametrize("path, names", CASES, ids=["python", "libc", "libc10"])
def test_the_same_answer_as_pyelftools(path, names):
    if not Path(path).exists():
        pytest.skip(f"{path} is not installed here")
    with open(Path(path).resolve(), "rb") as f:
        elf = ELFFile(f)
        for name in names:
            assert defined_symbol(elf, name) == _by_pyelftools(elf, name), name


def test_a_name_found_at_every_place_it_starts_tails_included():
    table = b"\0cfree\0free\0malloc\0"
    assert string_offsets(table, b"free") == [2, 7]
    assert string_offsets(table, b"malloc") == [12]
    assert string_offsets(table, b"mall") == []
