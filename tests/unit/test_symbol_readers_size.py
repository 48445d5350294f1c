"""The recorder's symbol readers read names and call-frame entries from the file when asked,
and hold neither section in memory (issue 24: the recorder's peak size on the training bench,
where libtorch_cpu's 84 MB string table and 23 MB .eh_frame were its largest objects after
the ring buffer). Real files: a table written here, and torch's own libtorch_cpu.so."""
from __future__ import annotations

import os
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from elftools.elf.elffile import ELFFile  # imported before any measure: modules are not what is held

from memprof.sources.symbols import frameless, symbol_cache
from memprof.sources.symbols.elfsyms import ElfSymbols, StringTable

STRINGS = [b"", b"malloc", b"__libc_malloc", b"_Z" + b"x" * 1000, b"tail"]


def string_table(tmp_path: Path, strings: list[bytes], *, lead: bytes = b"HEADER", terminate_last: bool = True):
    """A file of `lead`, then the NUL-separated `strings`: (StringTable over them, offsets)."""
    offsets, body = [], b""
    for i, s in enumerate(strings):
        offsets.append(len(body))
        body += s + (b"\0" if terminate_last or i < len(strings) - 1 else b"")
    path = tmp_path / "strtab.bin"
    path.write_bytes(lead + body)
    return StringTable(os.open(path, os.O_RDONLY), len(lead), len(body)), offsets, path


def test_names_are_read_whole_whatever_their_length(tmp_path):
    table, offsets, _ = string_table(tmp_path, STRINGS)
    assert [table.string_at(o) for o in offsets] == STRINGS
    assert table.string_at(offsets[2] + 7) == b"malloc"  # a shared tail, as linkers write them


def test_a_name_the_table_ends_without_nul_stops_at_the_table(tmp_path):
    table, offsets, _ = string_table(tmp_path, STRINGS + [b"unended"], terminate_last=False)
    assert table.string_at(offsets[-1]) == b"unended"
    assert table.string_at(table.size) == b"" and table.string_at(-1) == b""


def test_a_file_truncated_under_the_reader_reads_short_names_not_a_fault(tmp_path):
    table, offsets, path = string_table(tmp_path, STRINGS)
    os.truncate(path, len(b"HEADER") + offsets[3] + 10)
    assert table.string_at(offsets[3]) == b"_Z" + b"x" * 8
    assert table.string_at(offsets[4]) == b""


@pytest.mark.parametrize("chunk", [3, 7, 1 << 22])
def test_leading_bytes_match_the_table_read_whole_across_chunk_edges(tmp_path, monkeypatch, chunk):
    monkeypatch.setattr(StringTable, "_CHUNK", chunk)
    table, offsets, path = string_table(tmp_path, STRINGS)
    whole = path.read_bytes()[len(b"HEADER"):]
    starts = np.array(offsets + [table.size - 1, table.size + 5], dtype=np.int64)
    expected = [[whole[s + k] if s + k < len(whole) else 0 for k in range(2)] for s in starts.tolist()]
    assert table.leading_bytes(starts, 2).tolist() == expected


torch = pytest.importorskip("torch")
LIBTORCH_CPU = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")


def held_after(build):
    """(object built, bytes that tracemalloc still counts while it lives, peak bytes)."""
    tracemalloc.start()
    try:
        built = build()
        held, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return built, held, peak


@pytest.mark.parametrize("kept", [False, True], ids=["read", "kept across runs"])
def test_libtorch_symbols_are_held_without_their_string_table(kept, monkeypatch):
    if not kept:
        monkeypatch.setenv(symbol_cache.OFF_ENV, "0")
    else:
        ElfSymbols(LIBTORCH_CPU)  # kept in the cache (as root), if not already
    with open(LIBTORCH_CPU, "rb") as f:
        elf = ELFFile(f)
        strtab_bytes = elf.get_section_by_name(".strtab")["sh_size"]
    assert strtab_bytes > 50 << 20  # what the test is about: a table too large to hold
    symbols, held, peak = held_after(lambda: ElfSymbols(LIBTORCH_CPU))
    assert len(symbols.values) > 300_000
    # values, sizes and name offsets: 8 bytes each per symbol, and nothing of the table.
    assert held < len(symbols.values) * 24 + (2 << 20)
    assert peak < strtab_bytes / 2
    assert symbols.name(1000) != ""


def test_libtorch_call_frames_are_read_without_holding_eh_frame():
    frames, held, _ = held_after(lambda: frameless._EhFrame(LIBTORCH_CPU))
    entries = len(frames.starts)
    assert entries > 100_000
    # .eh_frame_hdr's table (8 bytes an entry, as the file has it), and nothing of .eh_frame.
    assert held < entries * 8 + (2 << 20)
    # Every entry answers at its first instruction (pyelftools refused those with
    # DW_CFA_GNU_args_size, some of libtorch's), most with %rsp + 8, just after a call; a
    # function's cold part starts inside its frame.
    rules = [frames.cfa_rule(int(start) + frames._hdr_addr) for start in frames.starts[::entries // 50][:50]]
    assert None not in rules and rules.count((7, 8)) >= 30
