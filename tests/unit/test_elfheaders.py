"""ELF headers read directly (memprof/sources/symbols/elfheaders.py) against pyelftools, on
this machine's own files: the same symbol tables, load segments and sections, and no
pyelftools import for them; files of another shape, or whose tables lie, go to pyelftools as
before (which says what is wrong), never read past their end or MAX_SECTION_BYTES."""
from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from memprof.sources.cpython import interp
from memprof.sources.symbols import elfheaders, frameless
from memprof.sources.symbols.elfsyms import ElfSymbols

TORCH_LIB = Path(sys.prefix) / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages" / "torch" / "lib"
FILES = [path for path in ("/lib/x86_64-linux-gnu/libc.so.6", "/lib/x86_64-linux-gnu/libm.so.6",
                           os.path.realpath(sys.executable), "/usr/bin/true", str(TORCH_LIB / "libc10.so"))
         if os.path.isfile(path)]


def _table(symbols: ElfSymbols) -> list:
    return [symbols.seg_offset.tolist(), symbols.seg_filesz.tolist(), symbols.seg_vaddr.tolist(),
            symbols.values.tolist(), symbols.sizes.tolist(), symbols.name_offsets.tolist(),
            (symbols._strtab.offset, symbols._strtab.size)]


def _by_pyelftools(monkeypatch, path: str) -> ElfSymbols:
    with monkeypatch.context() as m:
        m.setattr(ElfSymbols, "_read_from_headers", lambda self, fd, headers: False)
        return ElfSymbols(path)


@pytest.fixture(autouse=True)
def _never_from_the_cache(monkeypatch):
    monkeypatch.setattr(ElfSymbols, "CACHED_STRTAB_BYTES", 1 << 62)  # read every file, keep none


@pytest.mark.parametrize("path", FILES)
def test_symbols_read_from_the_headers_are_pyelftools(monkeypatch, path):
    direct = ElfSymbols(path)
    assert _table(direct) == _table(_by_pyelftools(monkeypatch, path))
    if path == "/usr/bin/true":  # stripped: its .dynsym holds imports alone, no function
        assert len(direct.values) == 0
        return
    middle = direct.values[len(direct.values) // 2]
    _, offset, ok = direct.lookup(np.array([middle + 1], dtype=np.uint64))
    assert ok[0] and offset[0] == 1


@pytest.mark.parametrize("path", FILES)
def test_load_segments_and_sections_are_pyelftools(path):
    with open(path, "rb") as f:
        elf = ELFFile(f)
        assert interp._load_segments(path) == interp._segments(elf)
        expected = {s.name: (s["sh_addr"], s["sh_offset"], s["sh_size"]) for s in elf.iter_sections()
                    if s.name in (".eh_frame", ".eh_frame_hdr")}
        assert {n: tuple(s) for n, s in frameless._x86_64_sections(f, (".eh_frame", ".eh_frame_hdr")).items()} == expected


def test_a_command_s_libraries_are_read_without_importing_pyelftools(tmp_path):
    """Their symbols, the interpreter's segments, frameless decisions (callframe.py), and a
    mapped data file that is no ELF at all, as a stray frame-pointer address finds one."""
    data_file = tmp_path / "LC_CTYPE"
    data_file.write_bytes(b"\x00" * 4096)
    script = ("import sys; from memprof.sources.symbols.elfsyms import ElfSymbols; from memprof.sources.cpython import interp; "
              "from memprof.sources.symbols.frameless import FramelessFrames; "
              "from memprof.sources.symbols.symbolize import UserSymbolizer; "
              f"[ElfSymbols(p) for p in {FILES!r}]; interp._load_segments({FILES[0]!r}); "
              f"frameless = [FramelessFrames().return_address_at_sp({FILES[0]!r}, a) for a in range(0x28000, 0x29000, 0x100)]; "
              f"print(UserSymbolizer().symbols_for({str(data_file)!r}), len(frameless), 'elftools' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["None", "16", "False"]


def _copy(tmp_path: Path, source: str = "/lib/x86_64-linux-gnu/libc.so.6") -> Path:
    copy = tmp_path / "lib.so"
    shutil.copyfile(source, copy)
    return copy


def _patch_section(path: Path, name: str, field: str, value: int) -> None:
    """Set `field` (offset or size) of section `name`'s header in the file at `path`."""
    with open(path, "r+b") as f:
        head = f.read(64)
        shoff, shentsize = struct.unpack_from("<Q", head, 0x28)[0], struct.unpack_from("<H", head, 0x3A)[0]
        headers = elfheaders.read_headers(f.fileno())
        index = next(i for i, s in enumerate(headers.sections) if s.name == name)
        f.seek(shoff + index * shentsize + {"offset": 0x18, "size": 0x20}[field])
        f.write(struct.pack("<Q", value))


@pytest.mark.parametrize("field, value", [("size", 1 << 40), ("offset", 1 << 40)])
def test_a_symbol_table_the_headers_put_outside_the_file_goes_to_pyelftools_which_refuses_it(tmp_path, field, value):
    lib = _copy(tmp_path)
    _patch_section(lib, ".dynsym", field, value)
    with pytest.raises(ELFError):  # as before: pyelftools' section_bytes says why; nothing read past the end
        ElfSymbols(str(lib))


def test_a_names_table_over_the_limit_is_not_read(tmp_path, monkeypatch):
    lib = _copy(tmp_path)
    with open(lib, "rb") as f:
        assert elfheaders.read_headers(f.fileno()) is not None
        monkeypatch.setattr(elfheaders, "MAX_SECTION_BYTES", 16)
        assert elfheaders.read_headers(f.fileno()) is None


@pytest.mark.parametrize("change", ["32-bit", "big-endian", "not ELF", "truncated", "no sections", "tables past the end"])
def test_other_shapes_are_left_to_pyelftools(tmp_path, change):
    lib = _copy(tmp_path)
    data = bytearray(lib.read_bytes())
    if change == "32-bit":
        data[4] = 1
    elif change == "big-endian":
        data[5] = 2
    elif change == "not ELF":
        data[:4] = b"\x7fELG"
    elif change == "truncated":
        data = data[:40]
    elif change == "no sections":
        struct.pack_into("<H", data, 0x3C, 0)  # e_shnum 0: extended numbering
    else:
        struct.pack_into("<Q", data, 0x28, len(data) - 8)  # e_shoff: the table would run past the end
    lib.write_bytes(bytes(data))
    with open(lib, "rb") as f:
        assert elfheaders.read_headers(f.fileno()) is None


def test_of_two_sections_with_one_name_the_last_is_taken_as_pyelftools_takes_it(tmp_path, monkeypatch):
    """A later section (.rela.dyn) renamed .dynsym: pyelftools' get_section_by_name finds the
    later one, which holds no symbols; so must the direct read, not libc's real .dynsym."""
    lib = _copy(tmp_path)
    with open(lib, "r+b") as f:
        head = f.read(64)
        shoff, shentsize = struct.unpack_from("<Q", head, 0x28)[0], struct.unpack_from("<H", head, 0x3A)[0]
        sections = elfheaders.read_headers(f.fileno()).sections
        dynsym = next(i for i, s in enumerate(sections) if s.name == ".dynsym")
        later = next(i for i, s in enumerate(sections) if i > dynsym and s.name == ".rela.dyn")
        f.seek(shoff + dynsym * shentsize)
        name_offset = f.read(4)
        f.seek(shoff + later * shentsize)
        f.write(name_offset)
    direct = ElfSymbols(str(lib))
    assert len(direct.values) == 0
    assert _table(direct) == _table(_by_pyelftools(monkeypatch, str(lib)))
