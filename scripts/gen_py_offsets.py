"""Derive memprof/sources/cpython/offsets_table.py from CPython's own internal headers.

For each interpreter given (default: every pyenv CPython 3.10-3.13 on this machine, and the
Debian system one), compile scripts/py_offsets.c against that version's include/ and
include/internal/ headers (-DPy_BUILD_CORE) and record the offsets it prints. Patch releases
of one minor version share a layout; the table is keyed by minor version, and run-time
checks (memprof/sources/cpython/interp.py) confirm a given interpreter matches it.

    python scripts/gen_py_offsets.py [INCLUDE_DIR ...] > memprof/sources/cpython/offsets_table.py
"""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def include_dirs() -> list[str]:
    found = sorted(glob.glob("/root/.pyenv/versions/3.1[0-3].*/include/python3.1[0-3]"))
    found += sorted(glob.glob("/usr/include/python3.1[0-3]"))
    return [d for d in found if os.path.isdir(os.path.join(d, "internal"))]


def offsets_for(include: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        exe = os.path.join(tmp, "py_offsets")
        subprocess.run(["gcc", f"-I{include}", f"-I{include}/internal", "-o", exe,
                        os.path.join(HERE, "py_offsets.c")], check=True)
        return json.loads(subprocess.run([exe], check=True, capture_output=True, text=True).stdout)


def main(argv: list[str]) -> int:
    table: dict[tuple, dict] = {}
    for include in argv or include_dirs():
        found = offsets_for(include)
        version = tuple(found.pop("version"))
        if version in table and table[version] != found:
            print(f"{include}: layout differs from another {version} build", file=sys.stderr)
            return 1
        table[version] = found
    print('"""CPython struct offsets per minor version (x86-64), derived from each version\'s own')
    print("internal headers by scripts/gen_py_offsets.py — do not edit by hand. -1: no such field.\"\"\"")
    print("\nOFFSETS = {")
    for version in sorted(table):
        print(f"    {version!r}: {{")
        for name, value in table[version].items():
            print(f"        {name!r}: {value},")
        print("    },")
    print("}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
