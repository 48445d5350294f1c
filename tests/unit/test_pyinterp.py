"""Confirming CPython struct offsets per interpreter file, checked on the real interpreters present."""
from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys

import pytest

from memprof.sources.cpython.interp import (PythonLayoutError, inspect_python, load_bias, parse_debug_offsets,
                                      python_file_in_maps, runtime_file)
from memprof.sources.cpython.offsets_table import OFFSETS
from memprof.sources.symbols.symbolize import Mapping, parse_maps

PYENV = "/root/.pyenv/versions"
# (runtime file, executable, version)
INTERPRETERS = [
    ("/usr/bin/python3.11", "/usr/bin/python3.11", None),  # Debian's: non-PIE, libpython linked in
    (f"{PYENV}/3.10.13/lib/libpython3.10.so.1.0", f"{PYENV}/3.10.13/bin/python3.10", (3, 10, 13)),
    (f"{PYENV}/3.11.7/lib/libpython3.11.so.1.0", f"{PYENV}/3.11.7/bin/python3.11", (3, 11, 7)),
    (f"{PYENV}/3.12.1/lib/libpython3.12.so.1.0", f"{PYENV}/3.12.1/bin/python3.12", (3, 12, 1)),
    (f"{PYENV}/3.13.0/lib/libpython3.13.so.1.0", f"{PYENV}/3.13.0/bin/python3.13", (3, 13, 0)),
]
LIB39 = f"{PYENV}/3.9.18/lib/libpython3.9.so.1.0"


def _need(path: str) -> str:
    if not os.path.exists(path):
        pytest.skip(f"{path} is not installed here")
    return path


def _expected_version(exe: str, version):
    """The version the interpreter reports itself, for one whose version the test does not pin."""
    if version is not None:
        return version
    out = subprocess.run([exe, "-c", "import sys; print(*sys.version_info[:3])"], capture_output=True, text=True, check=True)
    return tuple(int(x) for x in out.stdout.split())


# --- real interpreters ---


@pytest.mark.parametrize("lib,exe,version", INTERPRETERS, ids=lambda v: v if isinstance(v, str) else None)
def test_real_interpreter_is_confirmed(lib, exe, version):
    binary = inspect_python(_need(lib))
    expected = _expected_version(exe, version)
    assert binary.version == expected
    assert binary.version_text() == ".".join(map(str, expected))
    assert binary.offsets == OFFSETS[expected[:2]]
    assert binary.path == lib
    assert binary.runtime_vaddr > 0 and binary.code_type_vaddr > 0


def test_results_are_cached_per_file():
    lib = _need(INTERPRETERS[3][0])
    assert inspect_python(lib) is inspect_python(lib)


def test_python_3_9_is_not_supported():
    with pytest.raises(PythonLayoutError) as e:
        inspect_python(_need(LIB39))
    assert e.value.message == "CPython 3.9 is not supported (memprof reads frames of 3.10–3.13)"
    assert e.value.hint


def test_non_python_elf_is_refused():
    with pytest.raises(PythonLayoutError, match=r"not a CPython runtime \(no _PyRuntime symbol\)"):
        inspect_python("/bin/true")


def test_non_elf_and_missing_files_are_refused(tmp_path):
    text = tmp_path / "python3.12"
    text.write_text("#!/bin/sh\n")
    with pytest.raises(PythonLayoutError, match="not an ELF file"):
        inspect_python(str(text))
    with pytest.raises(PythonLayoutError, match="cannot read"):
        inspect_python(str(tmp_path / "missing"))


def test_shared_build_executable_leads_to_its_libpython():
    lib, exe, _ = INTERPRETERS[3]
    assert runtime_file(_need(exe)) == os.path.realpath(_need(lib))
    assert runtime_file(_need("/usr/bin/python3.11")) == "/usr/bin/python3.11"  # defines _PyRuntime itself
    assert runtime_file("/bin/true") == "/bin/true"


# --- tampered copies ---


def _copy(src: str, tmp_path, name: str | None = None) -> str:
    dst = tmp_path / (name or os.path.basename(src))
    shutil.copyfile(_need(src), dst)
    return str(dst)


def _symbol(path: str, name: str):
    """(file offset of the .dynsym entry of `name`, its st_value, file offset of its value's bytes)."""
    from elftools.elf.elffile import ELFFile
    with open(path, "rb") as f:
        elf = ELFFile(f)
        dynsym = elf.get_section_by_name(".dynsym")
        index = next(i for i, s in enumerate(dynsym.iter_symbols()) if s.name == name)
        value = dynsym.get_symbol(index)["st_value"]
        seg = next(s for s in elf.iter_segments()
                   if s["p_type"] == "PT_LOAD" and s["p_vaddr"] <= value < s["p_vaddr"] + s["p_filesz"])
        return dynsym["sh_offset"] + index * dynsym["sh_entsize"], value, seg["p_offset"] + value - seg["p_vaddr"]


def _patch(path: str, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def test_tampered_runtime_size_is_refused(tmp_path):
    path = _copy(INTERPRETERS[3][0], tmp_path)
    assert inspect_python(path).version == (3, 12, 1)
    entry, _, _ = _symbol(path, "_PyRuntime")
    _patch(path, entry + 16, struct.pack("<Q", OFFSETS[(3, 12)]["sizeof_runtime"] + 8))  # Elf64_Sym.st_size
    os.utime(path, ns=(1, 1))  # a new mtime: the cached verdict on the original must not be reused
    with pytest.raises(PythonLayoutError) as e:
        inspect_python(path)
    assert e.value.message == (f"_PyRuntime is {OFFSETS[(3, 12)]['sizeof_runtime'] + 8} bytes, CPython 3.12's layout "
                               f"has {OFFSETS[(3, 12)]['sizeof_runtime']}: a patched or differently configured build")


def test_tampered_code_object_size_is_refused(tmp_path):
    path = _copy(INTERPRETERS[2][0], tmp_path)
    _, _, data = _symbol(path, "PyCode_Type")
    _patch(path, data + 32, struct.pack("<Q", 1000))  # PyTypeObject.tp_basicsize
    with pytest.raises(PythonLayoutError, match="code objects are 1000 bytes, CPython 3.11's layout has"):
        inspect_python(path)


def _debug_field_offset(field: str) -> int:
    from memprof.sources.cpython.interp import _DEBUG_FIELDS
    return 8 + 8 * _DEBUG_FIELDS[(3, 13)].index(field)


def test_3_13_debug_offsets_are_the_tables():
    lib = _need(INTERPRETERS[4][0])
    _, _, data = _symbol(lib, "_PyRuntime")
    with open(lib, "rb") as f:
        f.seek(data)
        published = parse_debug_offsets(f.read(1024), (3, 13))
    table = OFFSETS[(3, 13)]
    assert published["thread_state.current_frame"] == table["tstate_frame"]
    assert published["code_object.co_code_adaptive"] == table["code_adaptive"]
    assert published["unicode_object.asciiobject_size"] == table["unicode_ascii_data"]
    assert published["gc.size"] > 0 and published["free_threaded"] == 0


@pytest.mark.parametrize("field,expected", [
    ("thread_state.current_frame", "_Py_DebugOffsets thread_state.current_frame is 4096, the table's tstate_frame is"),
    ("code_object.qualname", "_Py_DebugOffsets code_object.qualname is 4096, the table's code_qualname is"),
    ("free_threaded", "free-threaded"),
])
def test_3_13_debug_offsets_mismatch_is_refused(tmp_path, field, expected):
    path = _copy(INTERPRETERS[4][0], tmp_path)
    _, _, data = _symbol(path, "_PyRuntime")
    _patch(path, data + _debug_field_offset(field), struct.pack("<Q", 4096))
    with pytest.raises(PythonLayoutError, match=expected):
        inspect_python(path)


def test_3_13_missing_cookie_is_refused(tmp_path):
    path = _copy(INTERPRETERS[4][0], tmp_path)
    _, _, data = _symbol(path, "_PyRuntime")
    _patch(path, data, b"notdebug")
    with pytest.raises(PythonLayoutError, match="does not start with _Py_DebugOffsets"):
        inspect_python(path)


def test_3_10_needs_its_version_in_the_file_name(tmp_path):
    path = _copy(INTERPRETERS[1][0], tmp_path, "libsomething.so")
    with pytest.raises(PythonLayoutError, match="does not say which 3.X"):
        inspect_python(path)


def test_3_10_name_must_match_the_version_string(tmp_path):
    path = _copy(INTERPRETERS[1][0], tmp_path, "libpython3.12.so.1.0")  # no Py_Version, yet named 3.12
    with pytest.raises(PythonLayoutError, match="named for CPython 3.12 but has no Py_Version"):
        inspect_python(path)


# --- mappings ---


def _m(start: int, path: str, offset: int = 0, deleted: bool = False) -> Mapping:
    return Mapping(start, start + 0x1000, offset, path, deleted)


def test_python_file_in_maps_prefers_libpython():
    maps = [_m(0x400000, "/opt/py/bin/python3.12"), _m(0x7f0000000000, "/usr/lib/libc.so.6"),
            _m(0x7f1000000000, "/opt/py/lib/libpython3.12.so.1.0")]
    assert python_file_in_maps(maps) == "/opt/py/lib/libpython3.12.so.1.0"
    assert python_file_in_maps(maps[:2]) == "/opt/py/bin/python3.12"


def test_python_file_in_maps_skips_others_and_deleted():
    assert python_file_in_maps([_m(0x400000, "/bin/bash"), _m(0x500000, "")]) is None
    assert python_file_in_maps([_m(0x400000, "/usr/bin/python3.11", deleted=True)]) is None
    assert python_file_in_maps([_m(0x400000, "/usr/lib/libpython3.so")]) is None  # the stable-ABI stub
    assert python_file_in_maps([_m(0x400000, "/usr/bin/python3.13t")]) == "/usr/bin/python3.13t"


def test_load_bias_of_synthetic_mappings():
    lib = _need(INTERPRETERS[3][0])
    base = 0x7F0012340000
    # The loader's layout: the first PT_LOAD (vaddr 0, offset 0) at the base, the rest above it.
    maps = [_m(base + 0x86000, lib, 0x86000), _m(base, lib, 0), _m(0x400000, "/usr/bin/other")]
    assert load_bias(lib, maps) == base
    assert load_bias(lib, [_m(base, lib, 0, deleted=True)]) is None
    assert load_bias(lib, [_m(base, "/usr/bin/other")]) is None
    exe = _need("/usr/bin/python3.11")  # non-PIE: linked at 0x400000, loaded there
    assert load_bias(exe, [_m(0x400000, exe, 0)]) == 0


_PRINT_ADDRESSES = """
import ctypes, sys
runtime = ctypes.addressof(ctypes.c_char.in_dll(ctypes.pythonapi, "_PyRuntime"))
print(runtime, id(type((lambda: 0).__code__)), flush=True)
sys.stdin.read()
"""


@pytest.mark.parametrize("lib,exe,version", INTERPRETERS, ids=lambda v: v if isinstance(v, str) else None)
def test_live_process_addresses(lib, exe, version):
    """In a running interpreter, load_bias + st_value is where _PyRuntime and PyCode_Type are."""
    proc = subprocess.Popen([_need(exe), "-c", _PRINT_ADDRESSES], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        runtime_addr, code_type_addr = map(int, proc.stdout.readline().split())
        with open(f"/proc/{proc.pid}/maps") as f:
            maps = parse_maps(f.read())
    finally:
        proc.communicate("")
    path = python_file_in_maps(maps)
    assert os.path.realpath(path) == os.path.realpath(lib)
    binary = inspect_python(path)
    bias = load_bias(path, maps)
    assert bias is not None and bias % 4096 == 0
    assert bias + binary.runtime_vaddr == runtime_addr
    assert bias + binary.code_type_vaddr == code_type_addr
    assert any(m.path == path and m.start <= runtime_addr < m.end for m in maps)


# --- doctor ---


def test_doctor_python_checks():
    from memprof.doctor import python_checks
    lib39 = _need(LIB39)
    own, old = python_checks([os.path.join(os.path.dirname(os.path.dirname(lib39)), "bin", "python3.9")])
    assert own.name == old.name == "Python frames"
    assert not own.required and not old.required
    if own.ok:
        assert own.detail.startswith("CPython 3.") and own.detail.endswith(": frames supported")
    assert not old.ok and old.absent == "unsupported"
    assert old.detail.endswith(f"{lib39}: CPython 3.9 is not supported (memprof reads frames of 3.10–3.13)")
    assert "3.10–3.13" in old.fix


def test_doctor_unsupported_python_does_not_change_the_exit_status():
    from click.testing import CliRunner

    from memprof.cli.doctor import doctor
    runner = CliRunner()
    plain = runner.invoke(doctor, [], env={"COLUMNS": "300"})
    with_old = runner.invoke(doctor, ["--python", _need(LIB39), "--python", sys.executable], env={"COLUMNS": "300"})
    assert with_old.exit_code == plain.exit_code, with_old.output
    rows = [line for line in with_old.output.splitlines() if "│ Python frames" in line]
    assert len(rows) == 3, with_old.output
    assert "unsupported" in rows[1] and "CPython 3.9 is not supported" in rows[1]


# --- kept across runs ---


@pytest.fixture
def symbol_cache_dir(monkeypatch):
    """A symbol cache folder of the test's own, only root may write, as the real one."""
    import uuid
    from memprof.sources.symbols import symbol_cache
    if os.geteuid() != 0:
        pytest.skip("the cache serves root")
    top = f"/var/cache/memprof-tests/{uuid.uuid4().hex}"
    monkeypatch.setattr(symbol_cache, "CACHE_DIR", f"{top}/symbols")
    monkeypatch.delenv(symbol_cache.OFF_ENV, raising=False)
    yield f"{top}/symbols"
    shutil.rmtree(top, ignore_errors=True)


def _forget_this_run():
    """As a new recorder: nothing of this process's own caches."""
    from memprof.sources.cpython import interp
    interp._inspect_cached.cache_clear()
    interp._links_libpython.cache_clear()


def test_a_layout_is_kept_across_runs_and_used_only_while_the_table_has_it(symbol_cache_dir, tmp_path, monkeypatch):
    """What start-up confirms of an interpreter is kept in root's symbol cache folder: a later
    recorder neither reads the file nor imports pyelftools for it. A kept layout is used only
    while the offsets table holds the entry it confirmed."""
    from memprof.sources.cpython import interp
    lib = _copy(INTERPRETERS[3][0], tmp_path)
    first = inspect_python(lib)
    _forget_this_run()
    monkeypatch.setattr(interp, "_Inspection", None)  # reading the file again would fail
    kept = inspect_python(lib)
    assert kept == first and kept is not first and kept.offsets is OFFSETS[(3, 12)]
    _forget_this_run()
    monkeypatch.setitem(OFFSETS, (3, 12), {**OFFSETS[(3, 12)], "sizeof_runtime": 1})
    with pytest.raises(TypeError):  # the table's entry changed: the kept layout is not used, the file is read
        inspect_python(lib)
    _forget_this_run()


def test_what_an_executable_links_is_kept_across_runs(symbol_cache_dir, monkeypatch):
    from memprof.sources.cpython import interp
    lib, exe, _ = INTERPRETERS[3]
    _forget_this_run()
    assert runtime_file(_need(exe)) == os.path.realpath(_need(lib))
    _forget_this_run()
    monkeypatch.setattr(interp, "_libpython_needed", None)  # reading the file again would fail
    assert runtime_file(exe) == os.path.realpath(lib)
    _forget_this_run()
