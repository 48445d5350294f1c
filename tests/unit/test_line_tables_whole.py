"""A line table longer than BPF copies (PY_LINES_BYTES) is read whole from the live process
(memprof/sources/cpython/frames.py, PythonFrames._whole_line_table), and believed only when it
begins with what BPF copied. Real memory of this very process stands in for the target's: a
real function whose line table is ~5 KB, read by the real process_vm_readv."""
from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest

from memprof.sources.cpython import frames as frames_module
from memprof.sources.cpython import lines as pylines
from memprof.sources.cpython.frames import MAX_LINE_TABLE_BYTES, PythonFrames
from memprof.sources.symbols.procs import read_process_memory

PY_LINES_BYTES = 2048  # bpf/python.bpf.c
BYTES_DATA = 32        # PyBytesObject.ob_sval on 64-bit CPython 3.8-3.13
VERSION = sys.version_info[:2]

pytestmark = pytest.mark.skipif(sys.implementation.name != "cpython", reason="reads a CPython bytes object's memory")


def long_function():
    """A function of 700 statements: its line table is past BPF's copy."""
    namespace: dict = {}
    body = "\n".join(f"    v{i} = n + {i}" for i in range(700))
    exec(compile(f"def long_function(n):\n{body}\n    return n\n", "long_function.py", "exec"), namespace)
    return namespace["long_function"]


LONG = long_function()
TABLE = LONG.__code__.co_linetable  # kept alive by the code object: its memory stays put


class _ProcsMap:
    """py_procs as PythonFrames reads it: indexed by a c_uint32 tgid; KeyError for another."""

    def __init__(self, tgid: int):
        self.tgid = tgid

    def __getitem__(self, key):
        if key.value != self.tgid:
            raise KeyError(key.value)
        return SimpleNamespace(bytes_data=BYTES_DATA)


def leaf_for(table: bytes, copied: bytes | None = None, address: int | None = None):
    """A py_codes leaf as BPF writes it for `table`: its first PY_LINES_BYTES copied."""
    copied = table[:PY_LINES_BYTES] if copied is None else copied
    return SimpleNamespace(minor=VERSION[1], lines=copied, lines_len=len(table),
                           lines_ptr=id(table) if address is None else address,
                           firstlineno=1, name=b"", name_len=0, name_state=0, file=b"", file_len=0,
                           file_state=0, file_skip=0)


def frames_of(tgid: int) -> PythonFrames:
    return PythonFrames(bpf={"py_procs": _ProcsMap(tgid)})


def test_the_table_is_longer_than_bpf_copies():
    assert len(TABLE) > PY_LINES_BYTES, len(TABLE)


def test_a_live_process_table_is_read_whole_and_gives_the_late_lines():
    py = frames_of(os.getpid())
    code = py._decode_code(leaf_for(TABLE), os.getpid())
    assert code.lines == pylines.lines_table(VERSION, TABLE, 1)
    last_offset, _, last_line = [entry for entry in LONG.__code__.co_lines() if entry[2] is not None][-1]
    assert pylines.line_at(code.lines, last_offset // 2) == last_line == 702  # `return n`
    assert py.stats["line_tables_read_whole"] == 1 and py.stats["line_tables_cut"] == 0


def test_without_the_read_the_late_lines_are_unknown():
    """What the read fixes: decoded from BPF's copy alone, the last line is not found."""
    cut = frames_module.decode_lines(VERSION, TABLE[:PY_LINES_BYTES], 1, cut=True)
    last_offset = [entry for entry in LONG.__code__.co_lines() if entry[2] is not None][-1][0]
    assert cut and pylines.line_at(cut, last_offset // 2) is None


def test_memory_that_does_not_begin_as_bpf_copied_is_not_believed():
    """The code object died and its memory holds something else: BPF's copy stands."""
    other = bytes(reversed(TABLE))
    py = frames_of(os.getpid())
    code = py._decode_code(leaf_for(TABLE, copied=other[:PY_LINES_BYTES]), os.getpid())
    assert code.lines == frames_module.decode_lines(VERSION, other[:PY_LINES_BYTES], 1, cut=True)
    assert py.stats["line_tables_cut"] == 1 and py.stats["line_tables_read_whole"] == 0


def test_a_process_bpf_forgot_is_not_read(monkeypatch):
    """No py_conf for the tgid (the process exited): nothing is read, the copy stands."""
    monkeypatch.setattr(frames_module, "read_process_memory", lambda *a: pytest.fail("read a forgotten process"))
    py = frames_of(os.getpid() + 1)
    code = py._decode_code(leaf_for(TABLE), os.getpid())
    assert code.lines == frames_module.decode_lines(VERSION, TABLE[:PY_LINES_BYTES], 1, cut=True)
    assert py.stats["line_tables_cut"] == 1


def test_a_length_past_the_bound_is_not_read(monkeypatch):
    """The length is the process's word: past MAX_LINE_TABLE_BYTES it is not believed."""
    monkeypatch.setattr(frames_module, "read_process_memory", lambda *a: pytest.fail("read past the bound"))
    leaf = leaf_for(TABLE)
    leaf.lines_len = MAX_LINE_TABLE_BYTES + 1
    py = frames_of(os.getpid())
    py._decode_code(leaf, os.getpid())
    assert py.stats["line_tables_cut"] == 1


def test_a_table_bpf_copied_whole_is_not_read_again(monkeypatch):
    monkeypatch.setattr(frames_module, "read_process_memory", lambda *a: pytest.fail("read a whole copy"))
    short = (lambda n: n + 1).__code__.co_linetable
    py = frames_of(os.getpid())
    code = py._decode_code(leaf_for(short, copied=short), os.getpid())
    assert code.lines == pylines.lines_table(VERSION, short, 1)
    assert py.stats["line_tables_cut"] == py.stats["line_tables_read_whole"] == 0


def test_read_process_memory_reads_exactly_or_nothing():
    buffer = ctypes.create_string_buffer(b"memprof line table")
    assert read_process_memory(os.getpid(), ctypes.addressof(buffer), 18) == b"memprof line table"
    assert read_process_memory(os.getpid(), 4096, 16) is None  # the zero page: never mapped
    assert read_process_memory(os.getpid(), ctypes.addressof(buffer), 0) is None


def test_read_process_memory_of_an_exited_process_is_none():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert read_process_memory(child.pid, id(TABLE) + BYTES_DATA, 16) is None
